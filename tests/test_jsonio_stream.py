"""dpro.jsonio.read_array_stream: the items of a JSON file's array, streamed in batches,
the same as parsing the whole file, on the fast path (orjson slices) and the general one
(ijson, any layout), with the whole-file checks."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from dpro.errors import DproInputError
from dpro.jsonio import read_array_stream, read_options
import dpro.jsonio as jsonio

EVENTS = [{"ph": "X", "name": f"op{i}", "ts": i * 1.5, "dur": 1, "args": {"x": [{"a": 1}, {"b": "},{"}]}}
          for i in range(3000)]
TOP = {"schemaVersion": 1, "distributedInfo": {"rank": 3}, "deviceProperties": [{"id": 0}, {"id": 1}]}


def _read(path: Path, key: str = "traceEvents") -> tuple[object, bool, list, int]:
    got: list = []
    resets = []
    top, found = read_array_stream(path, key, lambda b: got.extend(b), lambda: (resets.append(1), got.clear()))
    return top, found, got, len(resets)


def _torch_layout(top: dict, events: list) -> bytes:
    """The layout torch.profiler writes: keys and events on their own lines, indented."""
    head = orjson.dumps(top, option=orjson.OPT_INDENT_2)[:-2]
    evs = ",\n".join("  " + orjson.dumps(e, option=orjson.OPT_INDENT_2).decode().replace("\n", "\n  ") for e in events)
    return head + b',\n  "traceEvents": [\n' + evs.encode() + b'\n  ],\n  "traceName": "x]"\n}\n'


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    monkeypatch.setattr(jsonio, "BATCH_BYTES", 4096)
    monkeypatch.setattr(jsonio, "_CHUNK", 1000)


@pytest.mark.parametrize("layout", ["compact", "torch", "list", "keys_after"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("general", [False, True])
def test_both_paths_equal_the_whole_file_parse(tmp_path, monkeypatch, layout, gz, general):
    if general:
        def not_fast(*a):
            raise jsonio._NotFast
        monkeypatch.setattr(jsonio, "_fast_array", not_fast)
    if layout == "compact":
        raw = orjson.dumps({**TOP, "traceEvents": EVENTS})
    elif layout == "torch":
        raw = _torch_layout(TOP, EVENTS)
    elif layout == "list":
        raw = orjson.dumps(EVENTS)
    else:
        raw = orjson.dumps({"traceEvents": EVENTS, **TOP})
    f = tmp_path / ("t.json.gz" if gz else "t.json")
    f.write_bytes(gzip.compress(raw) if gz else raw)
    top, found, got, resets = _read(f)
    whole = orjson.loads(raw)
    assert found and resets == int(general)
    assert got == (whole if layout == "list" else whole["traceEvents"])
    if layout != "list":
        assert top == {k: v for k, v in whole.items() if k != "traceEvents"}


@pytest.mark.parametrize("raw", [
    b'{"a": "\\"traceEvents\\": [", "traceEvents": [{"x": 1}, 2, "s", {"y": [{"z": 1}]}], "b": {"c": []}}',
    b'{"m": {"traceEvents": [{"x": 1}]}, "traceEvents": [{"x": 2}]}',
    b'[1, {"x": 2}, [3]]',
    b'  {"traceEvents": []}  ',
    b'{"traceEvents" : [ {"x": 1} , {"y": 2} ] , "z": 1}',
])
def test_any_layout_gives_the_whole_file_result(tmp_path, raw):
    f = tmp_path / "t.json"
    f.write_bytes(raw)
    top, found, got, _ = _read(f)
    whole = orjson.loads(raw)
    assert found
    assert got == (whole if isinstance(whole, list) else whole["traceEvents"])
    assert top == ([] if isinstance(whole, list) else {k: v for k, v in whole.items() if k != "traceEvents"})


@pytest.mark.parametrize("raw", [b'{"traceEvents": 5}', b'{"other": [1]}', b'"x"', b"5"])
def test_no_array(tmp_path, raw):
    f = tmp_path / "t.json"
    f.write_bytes(raw)
    assert _read(f)[1] is False


def test_big_file_falls_back_to_the_general_path_and_resets(tmp_path):
    """Invalid JSON after valid batches: what the sink got is forgotten, the error is one line."""
    raw = orjson.dumps({"traceEvents": EVENTS})[:-2] + b",}]}"
    f = tmp_path / "t.json"
    f.write_bytes(raw)
    with pytest.raises(DproInputError) as e:
        _read(f)
    assert str(e.value).startswith(f"{f}: invalid JSON") and "\n" not in str(e.value)


def test_limit_applies_to_decompressed_bytes_while_streaming(tmp_path):
    f = tmp_path / "t.json.gz"
    f.write_bytes(gzip.compress(orjson.dumps({"traceEvents": EVENTS})))
    assert f.stat().st_size < 100_000
    with read_options(max_input_bytes=100_000), pytest.raises(DproInputError, match="decompresses to more than the input limit of 100000"):
        _read(f)


def test_deep_nesting_is_an_error_on_both_paths(tmp_path):
    deep = b"[" * 300 + b"1" + b"]" * 300
    for raw in (b'{"traceEvents": [{"ts": ' + deep + b"}]}", b'{"traceEvents": [{"ts": ' + deep + b"},]}"):
        f = tmp_path / "t.json"
        f.write_bytes(raw)
        with pytest.raises(DproInputError, match="nested more than 255 deep|invalid JSON"):
            _read(f)
