"""A content-addressed cache of converted traces, so a second ``dpro replay`` skips the import.

An entry is a gTrace directory (gzipped JSON written by :func:`dpro.gtrace.io.write_gtrace`,
read back by :func:`load_gtrace` with its checks; never pickle) plus ``import.json`` (what the
gTrace files do not hold: the importer's notes, the trace's ``source`` and its nodes' file
names, which ``write_gtrace`` fills in), under ``$DPRO_CACHE_DIR`` or ``$XDG_CACHE_HOME/dpro/traces`` (default
``~/.cache/dpro/traces``), named by a SHA-256 of:

* every input file's resolved path, size and ``mtime_ns`` (a file that changes gets a new
  key; the old entry is never read again);
* the options of the import (the rank pattern) and :data:`FORMAT`;
* the source of the code that converts (``dpro/importers`` and ``dpro/gtrace``), so an entry
  made by another version of dpro is never used.

The cache is an optimisation only: an entry that cannot be read or written is logged and
ignored. It is never written inside the directory being imported. ``DPRO_NO_CACHE=1`` or
``--no-cache`` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from dpro.errors import DproInputError

log = logging.getLogger(__name__)

#: bump when what an entry holds changes
FORMAT = 1
SIDECAR = "import.json"
#: the subdirectory of the cached results (:meth:`TraceCache.load_result`)
RESULTS = "results"
#: the libraries whose versions a cached result depends on (besides dpro's own code)
_RESULT_LIBS = ("numpy", "scipy", "cvxpy", "networkx", "orjson")


def default_dir() -> Path:
    """``$DPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpro/traces``, else ``~/.cache/dpro/traces``."""
    if os.environ.get("DPRO_CACHE_DIR"):
        return Path(os.environ["DPRO_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dpro" / "traces"


def enabled_by_default() -> bool:
    """False when ``DPRO_NO_CACHE`` is set to anything but ``0``/empty."""
    return os.environ.get("DPRO_NO_CACHE", "") in ("", "0")


@functools.cache
def code_digest() -> str:
    """SHA-256 of the converting code's source (dpro/importers, dpro/gtrace), computed once."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("importers", "gtrace"):
        for f in sorted((pkg / sub).rglob("*.py")):
            h.update(str(f.relative_to(pkg)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@functools.cache
def package_digest() -> str:
    """SHA-256 of what an analysis's result depends on besides its input: all of dpro's
    code (every module, the replay core's C source and the extension built from it), the
    Python version and the installed numerical libraries (the path, size and mtime of each
    one's ``__init__``: reading their versions costs more than a cached replay). Computed once."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(sys.version.encode())
    for f in sorted(pkg.rglob("*")):
        if f.suffix in (".py", ".c", ".so", ".pyd") and f.is_file():
            h.update(str(f.relative_to(pkg)).encode())
            h.update(f.read_bytes())
    spec = importlib.util.find_spec("dpro.replayer._core")
    if spec is not None and spec.origin and Path(spec.origin).is_file():  # the extension in use (editable installs)
        h.update(Path(spec.origin).read_bytes())
    for lib in _RESULT_LIBS:  # the installed copy of each (another version rewrites it), without importing it
        spec = importlib.util.find_spec(lib)
        origin = spec.origin if spec is not None else None
        try:
            st = os.stat(origin) if origin else None
        except OSError:
            st = None
        h.update(f"{lib}={origin}:{st.st_size}:{st.st_mtime_ns}".encode() if st else f"{lib}=none".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class TraceCache:
    """The cache in directory ``root``."""

    root: Path

    def key(self, files: Iterable[Path], options: dict) -> str:
        """The entry name for importing ``files`` with ``options`` (JSON-able)."""
        h = hashlib.sha256()
        h.update(orjson.dumps({"format": FORMAT, "code": code_digest(), "options": options},
                              option=orjson.OPT_SORT_KEYS))
        for f in sorted(Path(p).resolve() for p in files):
            st = f.stat()
            h.update(orjson.dumps([str(f), st.st_size, st.st_mtime_ns]))
        return h.hexdigest()

    def usable_for(self, inputs: Path, *, quiet: bool = False) -> bool:
        """False when the cache would live inside ``inputs`` (it never writes there)."""
        root, inp = self.root.resolve(), inputs.resolve()
        inside = root == inp or inp in root.parents
        if inside and not quiet:
            log.warning("trace cache %s is inside the input %s: not used", root, inp)
        return not inside

    def result_key(self, trace_key: str, what: str, options: dict) -> str:
        """The name of the cached result ``what`` (e.g. ``"replay"``) of the trace imported
        under ``trace_key``, computed with ``options`` (JSON-able) by this dpro
        (:func:`package_digest`)."""
        h = hashlib.sha256()
        h.update(orjson.dumps({"format": FORMAT, "trace": trace_key, "what": what, "code": package_digest(),
                               "options": options}, option=orjson.OPT_SORT_KEYS))
        return h.hexdigest()

    def load_result(self, key: str) -> dict | None:
        """The result stored under ``key`` (:meth:`result_key`), or None."""
        f = self.root / RESULTS / f"{key}.json"
        try:
            d = orjson.loads(f.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as e:
            log.warning("cached result %s unusable (%s): computing again", f, e)
            return None
        if not isinstance(d, dict) or d.get("key") != key or not isinstance(d.get("result"), dict):
            log.warning("cached result %s unusable (not the result of this key): computing again", f)
            return None
        log.info("result cache: loaded %s", f)
        return d["result"]

    def store_result(self, key: str, result: dict) -> None:
        """Store ``result`` (JSON-able) under ``key``, atomically; a failure is logged, not raised."""
        d = self.root / RESULTS
        tmp = d / f"{key}.json.{os.getpid()}.tmp"
        try:
            d.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps({"key": key, "result": result}, option=orjson.OPT_SERIALIZE_NUMPY))
            tmp.replace(d / f"{key}.json")
        except (OSError, TypeError, orjson.JSONEncodeError) as e:
            log.warning("result cache: cannot store %s (%s)", d / f"{key}.json", e)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def load(self, key: str):  # noqa: ANN201 - GTrace | None
        """The trace stored under ``key``, as it was stored, or None."""
        from dpro.gtrace.io import is_gtrace, load_gtrace

        d = self.entry(key)
        if not is_gtrace(d):
            return None
        try:
            gt = load_gtrace(d)
            side = orjson.loads((d / SIDECAR).read_bytes())
            notes, source, files = side["notes"], side["source"], side["files"]
            if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes) or \
                    not isinstance(source, (str, type(None))) or \
                    sorted(files) != sorted(i.name for i in gt.manifest.nodes) or \
                    not all(isinstance(f, str) for v in files.values() for f in v):
                raise ValueError(f"{SIDECAR}: bad notes, source or files")
        except (DproInputError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("trace cache entry %s unusable (%s): importing again", d, e)
            return None
        gt.source = source
        gt.notes = notes
        for info in gt.manifest.nodes:
            info.events, info.dfg = files[info.name]
        log.info("trace cache: loaded %s", d)
        return gt

    def store(self, key: str, gt) -> None:  # noqa: ANN001 - GTrace
        """Store ``gt`` under ``key`` (atomically; a failure is logged, not raised)."""
        from dpro.gtrace.io import write_gtrace

        d = self.entry(key)
        files = {info.name: (info.events, info.dfg) for info in gt.manifest.nodes}
        try:
            d.parent.mkdir(parents=True, exist_ok=True)
            write_gtrace(gt, d, force=True, check=False)  # checked by the importer already
            tmp = d / (SIDECAR + ".tmp")
            tmp.write_bytes(orjson.dumps({"notes": list(gt.notes), "source": gt.source, "files": files}))
            tmp.replace(d / SIDECAR)
        except (DproInputError, OSError) as e:
            log.warning("trace cache: cannot store %s (%s)", d, e)
            shutil.rmtree(d, ignore_errors=True)
            return
        finally:
            for info in gt.manifest.nodes:  # write_gtrace names the files: the caller's trace stays as it was
                info.events, info.dfg = files[info.name]
        log.info("trace cache: stored %s", d)
