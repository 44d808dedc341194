"""Make big, realistic torch.profiler trace sets by repeating the profiled steps of a real one.

Every rank file of SRC (a trace file or a directory of one file per rank) is written to
OUT with its profiled steps (the ``ProfilerStep#N`` spans and everything that starts in
them) repeated until the file reaches ``--mb`` megabytes of JSON (with the kernels and flow ends
tied to them that start after the last step): copy k is shifted by k
times the steps' span, its steps renumbered after the previous copy's, and the ids that
tie events together (``correlation``, ``External id``, ``Sequence number``, flow ids) moved
past every id of the set, by the same amount on every rank, so that launches still meet
their kernels and collectives their peers. Events outside the steps and the file's other
keys are kept once. The output is plain JSON (``--gzip`` to compress), written as a
stream: memory stays proportional to the source, not the output.

    python benchmarks/gen_big_trace.py ../shared/traces/corpus/tl_h100_timesformer out/big1g --mb 1000
    python benchmarks/gen_big_trace.py ../shared/traces/corpus/param_dlrm_8rank out/dlrm8 --mb 100

(A set of more ranks than the source has — 64 × 100 MB from a 2-rank job — is not made:
new ranks would need their collectives' groups rewritten.)
"""

from __future__ import annotations

import argparse
import gzip
import math
import re
import sys
from pathlib import Path

import orjson

STEP = re.compile(r"^ProfilerStep#(\d+)$")
ID_ARGS = ("correlation", "External id", "Sequence number")


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def _window(events: list[dict]) -> tuple[float, float, list[int]]:
    """(start, end, step numbers) of the profiled steps."""
    spans = [(e["ts"], e["ts"] + e.get("dur", 0), int(m.group(1))) for e in events
             if e.get("ph") == "X" and isinstance(e.get("name"), str) and (m := STEP.match(e["name"]))]
    if not spans:
        raise SystemExit("no ProfilerStep#N spans: nothing to repeat")
    return min(s[0] for s in spans), max(s[1] for s in spans), sorted({s[2] for s in spans})


def _max_ids(events: list[dict]) -> dict[str, int]:
    out = {k: 0 for k in (*ID_ARGS, "flow")}
    for e in events:
        a = e.get("args")
        if isinstance(a, dict):
            for k in ID_ARGS:
                if isinstance(a.get(k), int):
                    out[k] = max(out[k], a[k])
        if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
            out["flow"] = max(out["flow"], e["id"])
    return out


def _corr(e: dict) -> object:
    a = e.get("args")
    return a.get("correlation") if isinstance(a, dict) else None


def _in_steps(evs: list[dict], t0: float, t1: float) -> list[dict]:
    """The events that start in [t0, t1), and those tied to them that start later (a kernel
    launched in the last step, the end of a flow)."""
    timed = [e for e in evs if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    inside = [e for e in timed if t0 <= e["ts"] < t1]
    corr = {c for e in inside if (c := _corr(e)) is not None}
    flows = {(e.get("cat"), e["id"]) for e in inside if e.get("ph") in ("s", "f", "t") and "id" in e}
    later = [e for e in timed if e["ts"] >= t1 and (_corr(e) in corr or
                                                    (e.get("ph") in ("s", "f", "t") and (e.get("cat"), e.get("id")) in flows))]
    return inside + later


def _shifted(e: dict, k: int, dt: float, nsteps: int, step_gap: int, off: dict[str, int]) -> dict:
    e = dict(e)
    e["ts"] = e["ts"] + k * dt
    name = e.get("name")
    if isinstance(name, str) and (m := STEP.match(name)):
        e["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_gap}"
    a = e.get("args")
    if isinstance(a, dict):
        a = dict(a)
        for key in ID_ARGS:
            if isinstance(a.get(key), int) and a[key] >= 0:
                a[key] = a[key] + k * off[key]
        e["args"] = a
    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * off["flow"]
    return e


def generate(src: Path, out: Path, mb: float, gz: bool = False) -> list[dict]:
    """Write the repeated set to ``out``; returns per file: name, copies, bytes (uncompressed)."""
    files = [src] if src.is_file() else sorted(p for p in src.iterdir() if p.name.endswith((".json", ".json.gz")))
    docs = {f: _read(f) for f in files}
    # one period and one id offset for every rank: copies stay in step across ranks
    windows = {f: _window(d["traceEvents"]) for f, d in docs.items()}
    dt = max(w[1] - w[0] for w in windows.values())
    steps = sorted({s for w in windows.values() for s in w[2]})
    step_gap = steps[-1] - steps[0] + 1
    off = {k: 0 for k in (*ID_ARGS, "flow")}
    for d in docs.values():
        for k, v in _max_ids(d["traceEvents"]).items():
            off[k] = max(off[k], v + 1)
    out.mkdir(parents=True, exist_ok=True)
    report = []
    for f, d in docs.items():
        t0, t1, _ = windows[f]
        evs = d["traceEvents"]
        inside = _in_steps(evs, t0, t1)
        per_copy = sum(len(orjson.dumps(e)) + 1 for e in inside)
        base = sum(len(orjson.dumps(e)) + 1 for e in evs)
        copies = max(1, math.ceil((mb * 1e6 - base) / per_copy) + 1) if per_copy else 1
        name = f.name[:-3] if f.name.endswith(".gz") else f.name
        dst = out / (name + (".gz" if gz else ""))
        written = 0
        with (gzip.open(dst, "wb", compresslevel=3) if gz else open(dst, "wb")) as fh:
            def put(b: bytes) -> None:
                nonlocal written
                fh.write(b)
                written += len(b)

            put(b'{"traceEvents":[\n')
            first = True
            for e in evs:
                put((b"" if first else b",\n") + orjson.dumps(e))
                first = False
            for k in range(1, copies):
                put(b",\n" + b",\n".join(orjson.dumps(_shifted(e, k, dt, len(steps), step_gap, off)) for e in inside))
            put(b"\n]")
            for key, v in d.items():
                if key != "traceEvents":
                    put(b"," + orjson.dumps(key) + b":" + orjson.dumps(v))
            put(b"}\n")
        report.append({"file": dst.name, "copies": copies, "steps": len(steps) * copies, "bytes": written})
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="a trace file or a directory of one file per rank")
    ap.add_argument("out", type=Path, help="directory to write (created)")
    ap.add_argument("--mb", type=float, default=1000.0, help="megabytes of JSON per rank file (default 1000)")
    ap.add_argument("--gzip", action="store_true", help="write .json.gz")
    a = ap.parse_args(argv)
    for r in generate(a.src, a.out, a.mb, a.gzip):
        print(f"{a.out / r['file']}: {r['copies']} copies, {r['steps']} steps, {r['bytes'] / 1e6:.1f} MB of JSON",
              file=sys.stdout)


if __name__ == "__main__":
    main()
