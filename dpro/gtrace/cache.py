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
``--no-cache`` turns it off. The results of analyses are cached next to it
(:mod:`dpro.resultcache`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from dpro import resultcache
from dpro.errors import DproInputError
from dpro.resultcache import enabled_by_default

__all__ = ["FORMAT", "SIDECAR", "TraceCache", "code_digest", "default_dir", "enabled_by_default"]

log = logging.getLogger(__name__)

#: bump when what an entry holds changes
FORMAT = 1
SIDECAR = "import.json"


def default_dir() -> Path:
    """``$DPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpro/traces``, else ``~/.cache/dpro/traces``."""
    return Path(resultcache.default_dir())


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
        inside = resultcache.inside(self.root, inputs)
        if inside and not quiet:
            log.warning("trace cache %s is inside the input %s: not used", self.root, inputs)
        return not inside

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
