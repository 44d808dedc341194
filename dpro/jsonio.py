"""Reading and writing (optionally gzipped) JSON files with one-line errors."""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from dpro.errors import DproInputError

log = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"


#: default bound on what one input file may hold once decompressed (``--max-input-bytes``)
DEFAULT_MAX_INPUT_BYTES = 2 * 2**30
#: deepest nesting of lists/objects accepted in an input file: orjson's own limit when it
#: encodes (no trace format needs more than a few levels)
MAX_DEPTH = 255
_SLICE = 10_000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ReadOptions:
    """How strictly inputs are read; the CLI sets them per command (:func:`read_options`)."""

    #: bound on one file's size after decompression, in bytes
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    #: replay the ranks present when some are missing or unreadable (else an error)
    allow_missing_ranks: bool = False


_OPTIONS: ContextVar[ReadOptions] = ContextVar("dpro_read_options", default=ReadOptions())


def current_read_options() -> ReadOptions:
    """The read options in force (defaults outside a :func:`read_options` block)."""
    return _OPTIONS.get()


@contextmanager
def read_options(**changes: Any) -> Iterator[ReadOptions]:
    """Use ``changes`` (fields of :class:`ReadOptions`) for the reads inside the block."""
    opts = replace(_OPTIONS.get(), **changes)
    token = _OPTIONS.set(opts)
    try:
        yield opts
    finally:
        _OPTIONS.reset(token)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "some other kind of file"


def regular_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as an input file (missing, a broken link, a directory,
    a FIFO, a device...), or None for a regular file. Never opens the file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "broken symbolic link" if os.path.islink(path) else "file not found"
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, expected a regular file"
    return None


def _limit_error(path: Path, limit: int, what: str) -> DproInputError:
    return DproInputError(path, f"{what} more than the input limit of {limit} bytes (raise it with --max-input-bytes)")


def _gunzip(path: Path, raw: bytes, limit: int) -> bytes:
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            while chunk := f.read(_CHUNK):
                out += chunk
                if len(out) > limit:
                    raise _limit_error(path, limit, "decompresses to")
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DproInputError(path, f"corrupt or truncated gzip ({e})") from None
    return out  # type: ignore[return-value]  (a bytearray: no copy)


def read_bytes(path: Path) -> bytes:
    """File contents, transparently gunzipped; DproInputError on any problem.

    Only regular files are opened (never a FIFO or a device, which could block or never
    end), and neither the file nor its decompressed contents may exceed the
    ``max_input_bytes`` of :func:`current_read_options`.
    """
    path = Path(path)
    limit = current_read_options().max_input_bytes
    problem = regular_file_problem(path)
    if problem:
        raise DproInputError(path, problem)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise DproInputError(path, f"cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise DproInputError(path, f"is {_kind(st.st_mode)}, expected a regular file")
        if st.st_size > limit:
            raise _limit_error(path, limit, f"holds {st.st_size} bytes,")
        with os.fdopen(fd, "rb", closefd=False) as f:
            chunks, total = [f.read(st.st_size + 1)], 0  # one read for a file that does not grow
            total = len(chunks[0])
            while total <= limit and (chunk := f.read(_CHUNK)):  # /proc files say size 0
                chunks.append(chunk)
                total += len(chunk)
            raw = b"".join(chunks)
    except IsADirectoryError:
        raise DproInputError(path, "is a directory, expected a file") from None
    except OSError as e:
        raise DproInputError(path, f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise _limit_error(path, limit, "holds")
    if raw[:2] == _GZIP_MAGIC:
        raw = _gunzip(path, raw, limit)
    return raw


def _encodable(x: Any) -> bool:
    try:
        orjson.dumps(x)
    except orjson.JSONEncodeError:  # for parsed JSON, only "Recursion limit reached"
        return False
    return True


def too_deep(obj: Any) -> bool:
    """True when lists/objects nest more than :data:`MAX_DEPTH` levels.

    orjson checks it (in C, no Python recursion) while encoding, which is also exactly
    what must hold for dpro to write the data again; a long top-level list is encoded in
    slices of 10,000 items so the check never holds a copy of the whole file.
    """
    parts = list(obj.values()) if isinstance(obj, dict) else [obj]
    for part in parts:
        if isinstance(part, list) and len(part) > _SLICE:
            if not all(_encodable(part[i:i + _SLICE]) for i in range(0, len(part), _SLICE)):
                return True
        elif not _encodable(part):
            return True
    return False


def parse_json(path: Path, raw: bytes) -> Any:
    """Parse ``raw`` (the contents of ``path``) with the checks of :func:`read_json`."""
    if not raw or raw.isspace():
        raise DproInputError(path, "empty file")
    if b"\x00" in raw[:64]:
        raise DproInputError(path, "binary data (NUL bytes), not JSON")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DproInputError(path, f"invalid JSON: {e}") from None
    if too_deep(obj):
        raise DproInputError(path, f"lists/objects nested more than {MAX_DEPTH} deep")
    return obj


def read_json(path: Path) -> Any:
    """Parse a JSON (or .json.gz) file; DproInputError naming the file on failure."""
    return parse_json(path, read_bytes(path))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()
#: Permissions for files and directories we create (mkstemp/mkdtemp alone give 0600/0700).
FILE_MODE = 0o666 & ~_UMASK
DIR_MODE = 0o777 & ~_UMASK


def not_a_dir_ancestor(path: Path) -> Path | None:
    """The first existing ancestor of ``path`` that is not a directory (blocks creating it)."""
    for parent in reversed(Path(path).parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def write_problem(path: Path, e: OSError) -> str:
    """Why ``path`` could not be written, in a few words."""
    blocker = not_a_dir_ancestor(path)
    if blocker is not None:
        return f"cannot write: {blocker} is a file, not a directory"
    if path.is_dir():
        return "cannot write: is a directory, expected a file name"
    return f"cannot write: {e.strerror or e}"


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (``--json``); numpy numbers are written as numbers,
    as in the files :func:`write_json` writes."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    sys.stdout.flush()


def dump_json(path: Path, obj: Any, *, gz: bool | None = None) -> None:
    """Like write_json, but OSError escapes (for callers that report another path).

    A value JSON cannot hold (an integer beyond 64 bits, nesting deeper than orjson's
    limit) is a DproInputError naming ``path``: it can only come from the input."""
    try:
        data = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as e:
        raise DproInputError(path, f"cannot write: {e} (a value out of range in the input)") from None
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any, *, gz: bool | None = None) -> None:
    """Write JSON atomically (temp file + rename); gzip when the name ends in .gz.

    Any OSError (unwritable place, a parent that is a file, disk full, ``path`` is a
    directory) becomes a DproInputError naming ``path``.
    """
    path = Path(path)
    try:
        dump_json(path, obj, gz=gz)
    except OSError as e:
        raise DproInputError(path, write_problem(path, e)) from None


def check_writable_dir(root: Path, force: bool) -> None:
    """Refuse to write directory ``root`` over a file, or over a non-empty one without ``force``."""
    remove_stale_temporaries(root)  # first: an interrupted swap puts the previous root back
    if root.exists() and not root.is_dir():
        raise DproInputError(root, "already exists and is not a directory")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise DproInputError(root, "already exists and is not empty (use --force to replace it)")
    blocker = not_a_dir_ancestor(root)
    if blocker is not None:
        raise DproInputError(root, f"cannot write: {blocker} is a file, not a directory")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: someone else's live process
        return True
    return True


def remove_stale_temporaries(root: Path) -> None:
    """Remove the ``.<root>.tmp<pid>-*`` / ``.<root>.old<pid>-*`` folders that
    :func:`write_dir_atomically` left beside ``root`` when a run writing it was killed
    (its process is gone); a live writer's folders are left alone."""
    pattern = re.compile(rf"\.{re.escape(root.name)}\.(tmp|old)(\d+)-[^/]*")
    try:
        siblings = list(root.parent.iterdir())
    except OSError:
        return
    for p in siblings:
        m = pattern.fullmatch(p.name)
        if m and p.is_dir() and not p.is_symlink() and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            if m.group(1) == "old" and not os.path.lexists(root) and (p / "x").is_dir():
                try:  # killed in the middle of the swap: the previous output goes back in place
                    (p / "x").rename(root)
                except OSError:
                    continue
            log.info("removing %s, left by an interrupted run", p)
            shutil.rmtree(p, ignore_errors=True)


def write_dir_atomically(root: Path, fill: Callable[[Path], None]) -> None:
    """Write a directory: ``fill`` a temporary sibling, then swap it in for ``root``.

    A failure never leaves half a directory and keeps any previous ``root``.
    File-system problems become a DproInputError naming ``root``.
    """
    tmp: Path | None = None
    old: Path | None = None
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(root)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.tmp{os.getpid()}-"))
        os.chmod(tmp, DIR_MODE)
        fill(tmp)
        if root.exists():
            old = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.old{os.getpid()}-"))
            root.rename(old / "x")
        tmp.rename(root)
        tmp = None
    except OSError as e:
        raise DproInputError(root, f"cannot write: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            if not root.exists() and (old / "x").exists():
                try:
                    (old / "x").rename(root)  # the swap failed: put the old directory back
                except OSError:
                    log.warning("could not restore %s; the previous copy is kept in %s", root, old / "x")
                    old = None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
