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


def _open_regular(path: Path, limit: int) -> tuple[int, os.stat_result]:
    """An open descriptor of ``path`` and its stat, after checking it is a regular file (never
    opening a FIFO or a device, which could block or never end) of at most ``limit`` bytes;
    DproInputError otherwise (nothing left open)."""
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
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bytes(path: Path) -> bytes:
    """File contents, transparently gunzipped; DproInputError on any problem.

    Only regular files are opened (never a FIFO or a device, which could block or never
    end), and neither the file nor its decompressed contents may exceed the
    ``max_input_bytes`` of :func:`current_read_options`.
    """
    path = Path(path)
    limit = current_read_options().max_input_bytes
    fd, st = _open_regular(path, limit)
    try:
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


def json_bytes(obj: Any) -> bytes:
    """What :func:`print_json` prints for ``obj``: indented JSON and a newline; numpy numbers
    are written as numbers, as in the files :func:`write_json` writes."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def print_bytes(data: bytes) -> None:
    """``data`` on stdout as it is (e.g. a cached :func:`json_bytes`), flushed."""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout (``--json``): :func:`json_bytes`."""
    print_bytes(json_bytes(obj))


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


# --------------------------------------------------------------------------- streaming


class _Reader:
    """A file's bytes, gunzipped when it is gzip, in chunks; the input limit applies to the
    decompressed bytes as they come. Only regular files are opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.limit = current_read_options().max_input_bytes
        fd, _ = _open_regular(path, self.limit)
        try:
            self._raw = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        self._f: Any = self._raw
        self.total = 0
        head = self._raw.peek(2)[:2] if hasattr(self._raw, "peek") else b""
        if head == _GZIP_MAGIC:
            self._f = gzip.GzipFile(fileobj=self._raw)

    def read(self, n: int = _CHUNK) -> bytes:
        try:
            chunk = self._f.read(n)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise DproInputError(self.path, f"corrupt or truncated gzip ({e})") from None
        except IsADirectoryError:
            raise DproInputError(self.path, "is a directory, expected a file") from None
        except OSError as e:
            raise DproInputError(self.path, f"cannot read: {e.strerror or e}") from None
        self.total += len(chunk)
        if self.total > self.limit:
            raise _limit_error(self.path, self.limit, "decompresses to" if self._f is not self._raw else "holds")
        return chunk

    def close(self) -> None:
        self._raw.close()


class _NotFast(Exception):
    """The layout is not the one the fast path reads: read it the general way."""


#: where one item of a top-level array ends and the next starts (a candidate: one inside a
#: string or a nested value leaves the slice before it invalid JSON, so it is never taken)
_CUT = re.compile(rb"\}\s*,\s*\{")
#: bytes of items parsed at once on the fast path
BATCH_BYTES = 1 << 20
_MAX_TRIES = 64
#: the fast path gives up on an item (or a header) longer than this
_MAX_SPAN = 64 * _CHUNK


def _loads(data: bytes | bytearray) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _NotFast from None


def read_array_stream(path: Path, key: str, sink: Callable[[list], None], reset: Callable[[], None],
                      depth_check: Callable[[list], bool] | None = None) -> tuple[Any, bool]:
    """Stream the items of the array ``key`` of a JSON file's top-level object (or of a
    top-level array) to ``sink``, in batches (lists ``sink`` must not keep), never holding
    the whole file parsed.

    Returns (the top-level object without ``key``, whether ``key`` held an array); a
    top-level array gives ``([], True)``, any other document ``(it, False)``. The checks of
    :func:`read_json` hold: regular files only, the input limit on the decompressed bytes
    as they stream, nesting depth, one-line errors naming ``path``. The fast path parses
    slices of about :data:`BATCH_BYTES` with orjson; a layout it does not read (or invalid
    JSON) is read again with ijson's C parser (yajl), value by value, after ``reset()``
    (forget what ``sink`` got). ``depth_check(batch)``: :func:`too_deep`'s answer for a
    batch that orjson parsed, computed another way (the Kineto reader's compiled one).
    """
    reader = _Reader(path)
    try:
        first = bytearray()
        while not first or first.isspace():
            chunk = reader.read(_CHUNK)
            if not chunk:
                raise DproInputError(path, "empty file")
            first += chunk
        if b"\x00" in first[:64]:
            raise DproInputError(path, "binary data (NUL bytes), not JSON")
        try:
            return _fast_array(path, reader, first, key, sink, depth_check)
        except _NotFast:
            pass
    finally:
        reader.close()
    reset()
    reader = _Reader(path)
    try:
        return _general_array(path, reader, key, sink)
    finally:
        reader.close()


def _checked(path: Path, obj: Any, depth_check: Callable[[list], bool] | None = None) -> Any:
    if depth_check(obj) if depth_check is not None and type(obj) is list else too_deep(obj):
        raise DproInputError(path, f"lists/objects nested more than {MAX_DEPTH} deep")
    return obj


def _fast_array(path: Path, reader: _Reader, buf: bytearray, key: str, sink: Callable[[list], None],
                depth_check: Callable[[list], bool] | None = None) -> tuple[Any, bool]:
    """Slices between ``},{`` boundaries, each parsed by orjson; _NotFast when the file is not
    an object with ``key`` holding an array of objects (or an array of objects)."""
    eof = False

    def more() -> bool:
        nonlocal eof
        if not eof:
            chunk = reader.read(_CHUNK)
            if chunk:
                buf.extend(chunk)
                return True
            eof = True
        return False

    qkey = orjson.dumps(key)
    start_re = re.compile(re.escape(qkey) + rb"\s*:\s*\[")
    lead = buf.lstrip()[:1]
    top: dict | None
    if lead == b"[":
        pos, top = buf.index(b"[") + 1, None
    elif lead == b"{":
        searched = 0
        while not (m := start_re.search(buf, max(0, searched - 1024))):
            searched = len(buf)
            if len(buf) > _MAX_SPAN or not more():
                raise _NotFast
        top = _loads(bytes(buf[: m.end() - 1]) + b"0}")
        if not isinstance(top, dict) or top.get(key) != 0:
            raise _NotFast
        pos = m.end()
    else:
        raise _NotFast
    while True:
        while len(buf) - pos < BATCH_BYTES and more():
            pass
        m = _CUT.search(buf, pos + BATCH_BYTES) if len(buf) - pos >= BATCH_BYTES else None
        while m is None and len(buf) - pos >= BATCH_BYTES:
            if len(buf) - pos > _MAX_SPAN:
                raise _NotFast
            old = len(buf)
            if not more():
                break
            m = _CUT.search(buf, max(pos + BATCH_BYTES, old - 1024))
        if m is None:  # at the end of the file
            break
        for _ in range(_MAX_TRIES):
            try:
                items = orjson.loads(b"[" + buf[pos: m.start() + 1] + b"]")
                break
            except orjson.JSONDecodeError:
                after = m.end() - 1
                while not (m := _CUT.search(buf, after)):
                    if len(buf) - pos > _MAX_SPAN or not more():
                        raise _NotFast from None
        else:
            raise _NotFast
        sink(_checked(path, items, depth_check))
        del items
        pos = m.end() - 1
        if pos > 4 * _CHUNK:
            del buf[:pos]
            pos = 0
    rest = bytes(buf[pos:])
    del buf[:]
    if top is None:  # a top-level array: the rest is its last items and "]"
        sink(_checked(path, _loads(b"[" + rest), depth_check))
        return [], True
    k = len(rest)
    for _ in range(_MAX_TRIES):
        k = rest.rfind(b"]", 0, k)
        if k < 0:
            break
        try:
            tail = orjson.loads(b"{" + qkey + b":0" + rest[k + 1:])
            items = orjson.loads(b"[" + rest[:k] + b"]")
        except orjson.JSONDecodeError:
            continue
        if not isinstance(tail, dict) or tail.get(key) != 0:
            break
        sink(_checked(path, items, depth_check))
        top.update(tail)
        del top[key]
        return _checked(path, top), True
    raise _NotFast


def _general_array(path: Path, reader: _Reader, key: str, sink: Callable[[list], None]) -> tuple[Any, bool]:
    """ijson, event by event: any layout, and the error of invalid JSON."""
    import ijson
    from ijson.common import ObjectBuilder

    batch: list = []
    top: Any = None
    found = False
    depth = 0  # containers open
    in_array = False  # inside the items' array
    cur_key: Any = None
    builder: Any = None
    base = 0  # the depth at which the value being built started

    def done(value: Any) -> None:
        if in_array:
            batch.append(value)
            if len(batch) >= _SLICE:
                sink(_checked(path, batch))
                batch.clear()
        elif isinstance(top, dict):
            top[cur_key] = value

    try:
        for _prefix, event, value in ijson.parse(reader, use_float=True):
            if builder is not None:
                builder.event(event, value)
                depth += (event in ("start_map", "start_array")) - (event in ("end_map", "end_array"))
                if depth == base:
                    done(builder.value)
                    builder = None
                continue
            if depth == 0:
                if event == "start_map":
                    top, depth = {}, 1
                elif event == "start_array":
                    top, depth, in_array, found = [], 1, True, True
                else:
                    top = value  # a scalar document
                continue
            if event in ("end_map", "end_array"):
                depth -= 1
                if depth == 1 and in_array:  # the end of the items' array in the object
                    in_array = False
                continue
            if event == "map_key" and depth == 1:
                cur_key = value
            elif depth == 1 and cur_key == key and event == "start_array" and isinstance(top, dict):
                in_array, depth, found = True, 2, True
                top.pop(key, None)
            elif event in ("start_map", "start_array"):
                builder, base = ObjectBuilder(), depth
                builder.event(event, value)
                depth += 1
            else:
                done(value)
    except (ijson.JSONError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DproInputError(path, f"invalid JSON: {first}") from None
    if batch:
        sink(_checked(path, batch))
    if isinstance(top, dict):
        if key in top:  # the key's last value is not an array
            found = False
            del top[key]
        return _checked(path, top), found
    return top, found
