"""The cache of analysis results: a second ``dpro replay --json`` of unchanged files prints the
bytes the first one printed.

Standard library only, and nothing imported at module level that Python's start-up has not
imported already: the ``dpro`` console entry (:mod:`dpro.entry`) answers a cache hit with this
module alone, before click, numpy or orjson are imported, and the full CLI
(:func:`dpro.job.result_cache`) computes the same key with the same function
(:func:`result_key`), so the two cannot drift apart.

A result's key is a SHA-256 of:

* what was computed (``"replay"``) and its options;
* how the input is read: the importer, the rank pattern, the read options
  (``--max-input-bytes``, ``--allow-missing-ranks``) and ``DPRO_ENGINE``;
* every input file's resolved path, size and ``mtime_ns`` (a file that changes gets a new key);
* :func:`code_fingerprint`: the Python version and the path, size and ``mtime_ns`` of every
  file of the dpro package (code, the compiled replay core) and of the numerical libraries'
  ``__init__`` (a pip upgrade rewrites it): editing, reinstalling or upgrading any of them
  gets a new key. File stats, not contents: reading ~1 MB of source costs more than the rest
  of a cache hit.

An entry, ``results/<key>.out`` under the trace cache's directory (:func:`default_dir`), is a
header line ``dpro-result <key> <sha256 of the rest>`` and then the exact bytes printed;
written atomically, and one whose header does not match is not used. The cache is an
optimisation only: an entry that cannot be read or written is skipped (and logged by the full
CLI). ``DPRO_NO_CACHE=1`` or ``--no-cache`` turns it off.
"""

# (no ``from __future__ import annotations``: importing ``__future__`` costs a hit ~0.3 ms)
import functools
import os
import sys

try:  # the digest hashlib.sha256 computes, without loading OpenSSL (hashlib costs ~4 ms to import)
    if sys.version_info >= (3, 12):
        from _sha2 import sha256
    else:
        from _sha256 import sha256
except ImportError:  # pragma: no cover - a Python built without them
    from hashlib import sha256

#: bump when what a key covers or an entry holds changes
FORMAT = 2
RESULTS = "results"
SUFFIX = ".out"
_MAGIC = b"dpro-result"
#: the libraries whose installed copy a result depends on (besides dpro's own files)
RESULT_LIBS = ("numpy", "scipy", "cvxpy", "networkx", "orjson")
#: the names of the files of a torch.profiler trace directory (as the Kineto importer reads them)
TRACE_SUFFIXES = (".json", ".json.gz")
_MANIFEST = "manifest.json"


def default_dir() -> str:
    """``$DPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dpro/traces``, else ``~/.cache/dpro/traces``."""
    if os.environ.get("DPRO_CACHE_DIR"):
        return os.path.expanduser(os.environ["DPRO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dpro", "traces")


def enabled_by_default() -> bool:
    """False when ``DPRO_NO_CACHE`` is set to anything but ``0``/empty."""
    return os.environ.get("DPRO_NO_CACHE", "") in ("", "0")


def inside(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """True when directory ``root`` is ``path`` or under it (a cache never lives in its input)."""
    r, p = os.path.realpath(root), os.path.realpath(path)
    return r == p or r.startswith(p.rstrip(os.sep) + os.sep)


def _stats(path: str) -> list | None:
    """``[resolved path, size, mtime_ns]`` of a regular file, else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o100000:  # not S_ISREG
        return None
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def input_files(path: str | os.PathLike) -> list[list] | None:
    """``[resolved path, size, mtime_ns]`` of each input file of ``path`` (the file itself, or
    the ``*.json``/``*.json.gz`` files of a directory, sorted by name), or None where its
    result is not cached: not there, a gTrace directory, no trace files, or a file named like
    a trace that is not a regular file (the analysis says what is wrong)."""
    p = os.fspath(path)
    if not os.path.isdir(p):
        st = _stats(p)
        return [st] if st is not None else None
    if os.path.lexists(os.path.join(p, _MANIFEST)):
        return None
    try:
        names = sorted(e.name for e in os.scandir(p) if e.name.endswith(TRACE_SUFFIXES))
    except OSError:
        return None
    out = [_stats(os.path.join(p, n)) for n in names]
    return out if out and None not in out else None


def _tree_stats(top: str) -> list:
    """``(relative path, size, mtime_ns)`` of every file under ``top`` but ``__pycache__``."""
    out, dirs, cut = [], [top], len(top) + 1
    while dirs:
        d = dirs.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        dirs.append(e.path)
                else:
                    try:
                        st = e.stat()
                    except OSError:  # a broken link
                        continue
                    out.append((e.path[cut:], st.st_size, st.st_mtime_ns))
    return sorted(out)


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 of what a result depends on besides its input and options: the Python version,
    every file of the dpro package and the installed :data:`RESULT_LIBS` (path, size and
    ``mtime_ns`` of each; found without importing them). Computed once per process."""
    from importlib.util import find_spec

    libs = []
    for lib in RESULT_LIBS:
        spec = find_spec(lib)
        origin = spec.origin if spec is not None else None
        st = _stats(origin) if origin else None
        libs.append((lib, st))
    pkg = os.path.dirname(os.path.abspath(__file__))
    return sha256(repr((sys.version, pkg, _tree_stats(pkg), libs)).encode()).hexdigest()


def _canonical(x: object) -> object:
    """``x`` (JSON-like) with every dict as its sorted items, so that its ``repr`` is canonical."""
    if isinstance(x, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(_canonical(v) for v in x)
    if x is None or isinstance(x, (str, int, float)):
        return x
    raise TypeError(f"not a JSON-like key part: {type(x).__name__}")


def result_key(path: str | os.PathLike, what: str, options: dict, *, rank_pattern: str, read: dict,
               engine: str) -> str | None:
    """The key of the result ``what`` (e.g. ``"replay"``) of the traces in ``path`` computed with
    ``options`` (JSON-like), read with ``rank_pattern`` and the read options ``read`` (the fields
    of :class:`dpro.jsonio.ReadOptions`), on the replay engine ``engine`` (``$DPRO_ENGINE``); None
    where the result of ``path`` is not cached (:func:`input_files`). The one function both the
    fast entry and the full CLI use."""
    files = input_files(path)
    if files is None:
        return None
    doc = {"format": FORMAT, "what": what, "options": options, "importer": "kineto", "rank_pattern": rank_pattern,
           "read": read, "engine": engine, "code": code_fingerprint(), "files": files}
    return sha256(repr(_canonical(doc)).encode()).hexdigest()


class ResultStore:
    """The results under ``root`` (the trace cache's directory), one file per key."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)

    def file(self, key: str) -> str:
        return os.path.join(self.root, RESULTS, key + SUFFIX)

    def load(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None when there are none. A damaged entry raises
        :class:`ValueError` naming it; one that cannot be read, :class:`OSError`."""
        try:
            with open(self.file(key), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        head, sep, body = data.partition(b"\n")
        if not sep or head != b"%s %s %s" % (_MAGIC, key.encode(), sha256(body).hexdigest().encode()):
            raise ValueError(f"{self.file(key)}: not the result of this key (damaged)")
        return body

    def save(self, key: str, body: bytes) -> None:
        """Store ``body`` under ``key``, atomically (OSError escapes)."""
        f = self.file(key)
        os.makedirs(os.path.dirname(f), exist_ok=True)
        tmp = f"{f}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as out:
                out.write(b"%s %s %s\n" % (_MAGIC, key.encode(), sha256(body).hexdigest().encode()))
                out.write(body)
            os.replace(tmp, f)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
