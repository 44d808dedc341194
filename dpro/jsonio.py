"""Reading and writing (optionally gzipped) JSON files with one-line errors."""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

import orjson

from dpro.errors import DproInputError

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


def write_json(path: Path, obj: Any, *, gz: bool | None = None) -> None:
    """Write JSON atomically (temp file + rename); gzip when the name ends in .gz."""
    data = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    if gz if gz is not None else path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
