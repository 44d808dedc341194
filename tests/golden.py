"""Golden outputs: what dpro says about every bundled, shared and recorded trace.

A refactor that "changes no result" must leave these identical (issue #25). For each case
the output is computed through the real command line (in-process):

* ``gtrace``: a SHA-1 of the gTrace dpro builds from the input (manifest, every node's
  ops, edges, events, steps, tensors and meta, and the notes), or the one-line error;
* ``replay``: ``dpro replay PATH --json``;
* ``optimize``: ``dpro optimize PATH --json`` (for the cases marked so).

Fields that measure the run itself (solver and search wall times) are dropped. The
expected values live in ``tests/data/golden/expected/<case>.json.gz``; regenerate them with
``python tests/golden.py --update`` only for a change that is meant to change results,
and say why in the commit.

The recorded cases are real jobs recorded on the dev machine by ``dpro profile``
(``tests/data/golden/recordings/<case>/raw``, see the README there); they are collected
into a gTrace with ``dpro collect``, so the recorder's offline conversion is covered too.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
GOLDEN = REPO / "tests" / "data" / "golden"
EXPECTED = GOLDEN / "expected"
RECORDINGS = GOLDEN / "recordings"

#: keys whose values measure the run, not the result (wall time of a solve or a search)
VOLATILE = {"time_s"}
#: optimizer search budget (s) for the golden runs: large enough that every case converges
BUDGET = "60"


@dataclass(frozen=True)
class Case:
    name: str
    #: how the input is made: "trace" (a directory/file dpro reads as is), "collect" (a raw
    #: recording), "byteps" (constructed BytePS traces), "synthetic" (conftest's job)
    kind: str
    source: Path | None
    optimize: bool = False


def cases() -> list[Case]:
    out = [
        Case("bundled_ddp_gloo_2rank_mlp", "trace", REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp", True),
        Case("probe_ddp_gloo_2rank", "trace", REPO / "tests" / "data" / "probe", True),
        Case("synthetic_2rank", "synthetic", None, True),
        Case("byteps_2x2_2servers", "byteps", None),
    ]
    if RECORDINGS.is_dir():
        for d in sorted(RECORDINGS.iterdir()):
            if (d / "raw").is_dir():
                out.append(Case(f"recorded_{d.name}", "collect", d / "raw", True))
    kineto = SHARED / "kineto"
    if kineto.is_dir():
        out.append(Case("shared_a100_2rank_rank0", "trace", kineto / "a100_2rank_rank0.json.gz"))
        out.append(Case("shared_sampled_128rank", "trace", kineto))
    corpus = SHARED / "corpus"
    if corpus.is_dir():
        for d in sorted(corpus.iterdir()):
            if d.is_dir():
                out.append(Case(f"corpus_{d.name}", "trace", d))
    return out


def _clean(x: object) -> object:
    """``x`` without volatile keys; floats kept as they are (NaN/inf as strings)."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def gtrace_digest(gt, paths: dict[str, str] | None = None) -> str:  # noqa: ANN001 - dpro.gtrace.schema.GTrace
    """SHA-1 of everything a gTrace holds, in a canonical serialisation; the manifest's
    mentions of the input's own location (``paths``: path -> placeholder) are replaced."""
    from dpro.gtrace.io import node_events_json

    h = hashlib.sha1()
    opt = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    m = gt.manifest.to_json()
    # where the input was read from (a temporary directory for `dpro collect`) is not a result
    m["meta"] = {k: v for k, v in m["meta"].items() if k not in ("source", "files")}
    manifest = orjson.dumps(m, option=opt)
    for path, placeholder in (paths or {}).items():
        manifest = manifest.replace(path.encode(), placeholder.encode())
    h.update(manifest)
    for pid, (name, nt) in enumerate(sorted(gt.nodes.items())):
        h.update(name.encode())
        h.update(orjson.dumps({
            "info": nt.info.to_json(), "ops": [o.to_json() for o in nt.ops.values()], "edges": [list(e) for e in nt.edges],
            "events": node_events_json(nt, pid), "tensors": [t.to_json() for t in nt.tensors], "meta": nt.meta,
        }, option=opt))
    h.update(orjson.dumps(list(gt.notes), option=opt))
    return h.hexdigest()


def _cli(*args: object) -> tuple[int, str, str]:
    from click.testing import CliRunner

    from dpro.cli import cli

    # the shared traces are often some ranks of a bigger job: replay the ranks present (#32)
    res = CliRunner().invoke(cli, ["--allow-missing-ranks", *map(str, args)], prog_name="dpro", catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def _prepare(case: Case, work: Path) -> Path:
    """The path to run dpro on (built under ``work`` where it must be made)."""
    if case.kind == "trace":
        assert case.source is not None
        return case.source
    if case.kind == "synthetic":
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import write_synthetic_job

        return write_synthetic_job(work / "synthetic")
    if case.kind == "byteps":
        sys.path.insert(0, str(REPO / "tests"))
        from scriptmod import load_script

        mod = load_script("make_traces", "tests/data/byteps/make_traces.py")
        mod.generate(work / "byteps_raw", machines=2, gpus=2, servers=2, steps=4, start_step=3, seed=0)
        code, out, err = _cli("import", "byteps", work / "byteps_raw", "-o", work / "byteps")
        assert code == 0, err
        return work / "byteps"
    if case.kind == "collect":
        code, out, err = _cli("collect", case.source, "-o", work / "collected")
        assert code == 0, err
        return work / "collected"
    raise ValueError(case.kind)


def _json_or_error(code: int, out: str, err: str) -> object:
    if code != 0:
        return {"exit_code": code, "error": err.strip()}
    return _clean(orjson.loads(out))


def compute(case: Case, work: Path) -> dict:
    """The golden record of ``case`` (see the module docstring)."""
    from dpro.errors import DproInputError
    from dpro.jsonio import read_options
    from dpro.loader import open_trace

    with read_options(allow_missing_ranks=True):
        return _compute(case, work, open_trace, DproInputError)


def _compute(case: Case, work: Path, open_trace, DproInputError) -> dict:  # noqa: ANN001, N803
    path = _prepare(case, work)
    rec: dict = {"case": case.name}
    try:
        rec["gtrace"] = gtrace_digest(open_trace(path), {str(work): "<WORK>", str(REPO): "<REPO>", str(REPO.parent): "<ROOT>"})
    except DproInputError as e:
        rec["gtrace"] = {"error": str(e).replace(str(path), "<PATH>")}
    code, out, err = _cli("replay", path, "--json")
    rec["replay"] = _json_or_error(code, out, err.replace(str(path), "<PATH>"))
    if case.optimize:
        code, out, err = _cli("optimize", path, "--json", "--budget", BUDGET)
        rec["optimize"] = _json_or_error(code, out, err.replace(str(path), "<PATH>"))
    return rec


def diff(expected: object, got: object, where: str = "", rel: float = 1e-9) -> list[str]:
    """Where ``got`` differs from ``expected`` (floats within ``rel``)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in expected if k not in got]
        out += [f"{where}.{k}: unexpected" for k in got if k not in expected]
        for k in expected:
            if k in got:
                out += diff(expected[k], got[k], f"{where}.{k}", rel)
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{where}: {len(got)} items, expected {len(expected)}"]
        return [d for i, (a, b) in enumerate(zip(expected, got)) for d in diff(a, b, f"{where}[{i}]", rel)]
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(expected, got, rel_tol=rel, abs_tol=1e-9):
            return []
    elif expected == got and type(expected) is type(got):
        return []
    return [f"{where}: {got!r}, expected {expected!r}"]


def expected_file(case: Case) -> Path:
    return EXPECTED / f"{case.name}.json.gz"


def load_expected(case: Case) -> dict:
    return orjson.loads(gzip.decompress(expected_file(case).read_bytes()))


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="rewrite the expected files")
    ap.add_argument("names", nargs="*", help="only these cases")
    a = ap.parse_args()
    EXPECTED.mkdir(parents=True, exist_ok=True)
    bad = 0
    for case in cases():
        if a.names and case.name not in a.names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rec = compute(case, Path(tmp))
        f = expected_file(case)
        if a.update:
            f.write_bytes(gzip.compress(orjson.dumps(rec, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n",
                                        mtime=0))
            print(f"wrote {f.relative_to(REPO)}")
            continue
        d = diff(load_expected(case), rec) if f.is_file() else ["no expected file"]
        bad += bool(d)
        print(f"{case.name}: {'ok' if not d else f'{len(d)} differences'}")
        for line in d[:20]:
            print(f"  {line}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
