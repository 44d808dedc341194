"""Reading and writing (optionally gzipped) JSON files with one-line errors."""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from dpro.errors import DproInputError

log = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: Path) -> bytes:
    """File contents, transparently gunzipped; DproInputError on any problem."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DproInputError(path, "file not found") from None
    except IsADirectoryError:
        raise DproInputError(path, "is a directory, expected a file") from None
    except OSError as e:
        raise DproInputError(path, f"cannot read: {e.strerror}") from None
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise DproInputError(path, f"corrupt or truncated gzip ({e})") from None
    return raw


def read_json(path: Path) -> Any:
    """Parse a JSON (or .json.gz) file; DproInputError naming the file on failure."""
    raw = read_bytes(path)
    if not raw.strip():
        raise DproInputError(path, "empty file")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DproInputError(path, f"invalid JSON: {e}") from None


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
    """Like write_json, but OSError escapes (for callers that report another path)."""
    data = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
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
    if root.exists() and not root.is_dir():
        raise DproInputError(root, "already exists and is not a directory")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise DproInputError(root, "already exists and is not empty (use --force to replace it)")
    blocker = not_a_dir_ancestor(root)
    if blocker is not None:
        raise DproInputError(root, f"cannot write: {blocker} is a file, not a directory")


def write_dir_atomically(root: Path, fill: Callable[[Path], None]) -> None:
    """Write a directory: ``fill`` a temporary sibling, then swap it in for ``root``.

    A failure never leaves half a directory and keeps any previous ``root``.
    File-system problems become a DproInputError naming ``root``.
    """
    tmp: Path | None = None
    old: Path | None = None
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.tmp"))
        os.chmod(tmp, DIR_MODE)
        fill(tmp)
        if root.exists():
            old = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}.old"))
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
