"""A mutation fuzzer for everything dpro reads (issue #32).

Seeds are real inputs of every format: a gTrace directory, torch.profiler (Kineto) traces
(synthetic, the bundled DDP recording, the probe, the public corpus when present), BytePS
traces, ps-lite message traces (``seeds/pslite_2w2s``, recorded by the patched ps-lite),
and dpro's own raw recordings (``tests/data/golden/recordings``). A case copies one seed
into a sandbox, applies one to three mutations (JSON-, byte- or directory-level) and runs
one dpro command on it, in-process (click's CliRunner, a SIGALRM timeout), and classifies
the outcome:

``clean-error``   exit 2, exactly one line ``dpro: error: ...`` on stderr;
``success``       exit 0 and the result passes its checks (below);
``traceback``     an exception escaped the command (or "Traceback" in the output);
``hang``          still running after the timeout;
``escape``        something written in the sandbox outside OUT, the input changed, or a
                  file opened outside the input (a device, /etc, /proc, the sandbox's
                  ``outside/`` folder) other than through a symbolic link the input holds;
``bad-message``   a non-zero exit whose stderr is not one ``dpro: error:`` line;
``silent-skip``   exit 0 while a file named like a rank file was neither read nor named
                  in the output;
``wrong-success`` exit 0 with a result that cannot be right (no finite positive predicted
                  or measured iteration, a negative breakdown part, "steps []", an OUT
                  that does not load).

Every file opened during a case is seen through a ``sys.addaudithook`` hook.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import importlib.util
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from dpro.errors import one_line

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
SHARED = Path(os.environ.get("DPRO_SHARED", REPO.parent / "shared")) / "traces"
#: corpus sets small enough to fuzz quickly (each replays, see tests/test_corpus.py)
CORPUS_SETS = ("hta_cpu_only", "hta_amd_mi250", "hta_large_integer", "hta_cp_event_sync_ms")
#: the input limit the cases run under (a gzip bomb mutation expands beyond it)
LIMIT = 48 * 2**20
BAD_OUTCOMES = ("traceback", "hang", "escape", "bad-message", "silent-skip", "wrong-success")

# --------------------------------------------------------------------------- seeds


@dataclass(frozen=True)
class Seed:
    name: str
    kind: str  # gtrace | kineto | byteps | pslite | recording
    path: Path
    commands: tuple[str, ...]
    partial: bool = False  # some ranks of a bigger job: run with --allow-missing-ranks


def _synthetic(d: Path) -> None:
    sys.path.insert(0, str(TESTS))
    from conftest import write_synthetic_job

    write_synthetic_job(d)


def build_seeds(root: Path) -> list[Seed]:
    """Every seed, built or copied under ``root`` (once per process)."""
    from dpro.gtrace.io import write_gtrace
    from dpro.importers.kineto import import_kineto

    seeds = []
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    _synthetic(root / "kineto_synth")
    seeds.append(Seed("kineto_synth", "kineto", root / "kineto_synth", ("validate", "replay", "import kineto")))
    write_gtrace(import_kineto(root / "kineto_synth"), root / "gtrace_synth")
    seeds.append(Seed("gtrace_synth", "gtrace", root / "gtrace_synth", ("validate", "replay", "align")))
    for name, src in (("kineto_bundled", REPO / "examples" / "traces" / "ddp_gloo_2rank_mlp"),
                      ("kineto_probe", TESTS / "data" / "probe")):
        dst = root / name
        dst.mkdir()
        for f in src.glob("rank*.json.gz"):
            shutil.copy(f, dst / f.name)
        seeds.append(Seed(name, "kineto", dst, ("validate", "replay", "import kineto")))
    spec = importlib.util.spec_from_file_location("make_traces", TESTS / "data" / "byteps" / "make_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    mod.generate(root / "byteps", machines=2, gpus=2, servers=1, steps=2, start_step=1, seed=0)
    seeds.append(Seed("byteps", "byteps", root / "byteps", ("import byteps",)))
    shutil.copytree(HERE / "seeds" / "pslite_2w2s", root / "pslite")
    seeds.append(Seed("pslite", "pslite", root / "pslite", ("import pslite",)))
    rec = TESTS / "data" / "golden" / "recordings"
    for name in ("ddp_mlp", "horovod_torch_mlp"):
        if (rec / name / "raw").is_dir():
            shutil.copytree(rec / name / "raw", root / f"rec_{name}")
            seeds.append(Seed(f"rec_{name}", "recording", root / f"rec_{name}", ("collect",)))
    for name in CORPUS_SETS:
        src = SHARED / "corpus" / name
        if src.is_dir() and sum(f.stat().st_size for f in src.iterdir() if f.is_file()) < 8 * 2**20:
            shutil.copytree(src, root / f"corpus_{name}", symlinks=False)
            seeds.append(Seed(f"corpus_{name}", "kineto", root / f"corpus_{name}", ("validate", "replay"), partial=True))
    return seeds


# --------------------------------------------------------------------------- mutations

HOSTILE: list[object] = [
    None, True, False, 0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63) - 1, 10**18,
    1e308, -1e308, 1.7e308, 5e-324, 0.5, -0.0, "", " ", "x\ny\r\x1b[0m", "../ESCAPED", "../../outside/canary.json",
    "/etc/passwd", "/proc/self/environ", "/dev/zero", "\u0663", "ProfilerStep#99999999999999999999999",
    "ProfilerStep#\u0663", "a" * 5000, [], {}, [[1e18, 1e18]], [1, "2"], {"a": None}, "null", "NaN",
]
_NESTED = "@@NESTED@@"
_BIG = "@@BIG@@"  # an integer beyond 64 bits (orjson does not write one)


def _is_json_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink() and p.name.endswith((".json", ".json.gz", ".jsonl"))


def _load(p: Path) -> tuple[object, bool]:
    raw = p.read_bytes()
    gz = raw[:2] == b"\x1f\x8b"
    raw = gzip.decompress(raw) if gz else raw
    if p.name.endswith(".jsonl"):
        return [orjson.loads(ln) for ln in raw.splitlines() if ln.strip()], gz
    return orjson.loads(raw), gz


def _save(p: Path, obj: object, gz: bool) -> None:
    if p.name.endswith(".jsonl"):
        data = b"\n".join(orjson.dumps(x) for x in obj) + b"\n"  # type: ignore[union-attr]
    else:
        data = orjson.dumps(obj)
    data = data.replace(f'"{_NESTED}"'.encode(), b"[" * 1000 + b"1" + b"]" * 1000)
    data = data.replace(f'"{_BIG}"'.encode(), b"-" * (len(data) % 2) + b"9" * 25)
    p.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def _containers(obj: object, limit: int = 200000) -> list[object]:
    out, stack = [], [obj]
    while stack and len(out) < limit:
        o = stack.pop()
        if isinstance(o, (dict, list)) and o:
            out.append(o)
            stack.extend(v for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, (dict, list)))
    return out


def _pick_container(rng: random.Random, obj: object) -> object:
    cs = _containers(obj)
    # bias towards small containers (events, their args) rather than the top level
    small = [c for c in cs if len(c) <= 16]
    return rng.choice(small if small and rng.random() < 0.8 else cs)


def _value(rng: random.Random, old: object) -> object:
    r = rng.random()
    if r < 0.55:
        return copy.deepcopy(rng.choice(HOSTILE))
    if r < 0.57:
        return _BIG
    if r < 0.6:
        return _NESTED
    if isinstance(old, bool) or old is None:
        return copy.deepcopy(rng.choice(HOSTILE))
    if isinstance(old, (int, float)):
        v = rng.choice([old * 10 ** rng.randint(1, 30), -old, old + 1, old - 1, old * 1e-6, str(old), float(old) * 1e300])
        return _BIG if isinstance(v, int) and not -(2**63) <= v < 2**64 else v
    if isinstance(old, str):
        return rng.choice([old + "\n", old[::-1], old + "#" + str(rng.randint(0, 10**30)), old.upper(), "",
                           old.replace("0", "\u0663"), "../" + old, old * 3])
    return copy.deepcopy(rng.choice(HOSTILE))


def mutate_json(rng: random.Random, d: Path) -> str:
    files = sorted(p for p in d.rglob("*") if _is_json_file(p))
    if not files:
        return "json:none"
    f = rng.choice(files)
    try:
        obj, gz = _load(f)
    except (orjson.JSONDecodeError, OSError, EOFError, ValueError, zlib.error):
        return mutate_bytes(rng, d)
    c = _pick_container(rng, obj) if isinstance(obj, (dict, list)) and obj else None
    if c is None:
        return "json:empty"
    op = rng.choice(["set", "set", "set", "delete", "dup", "swap", "empty", "type"])
    if isinstance(c, dict):
        k = rng.choice(list(c))
        if op == "delete":
            del c[k]
        elif op == "dup" and isinstance(c[k], list) and c[k]:
            c[k].append(c[k][rng.randrange(len(c[k]))])
        elif op == "empty":
            c[k] = type(c[k])() if isinstance(c[k], (list, dict, str)) else None
        elif op == "type":
            c[k] = [c[k]] if rng.random() < 0.5 else str(c[k])
        else:
            c[k] = _value(rng, c[k])
        what = f"{op} key {str(k)[:30]!r}"
    else:
        i = rng.randrange(len(c))
        if op == "delete":
            del c[i]
        elif op == "dup":
            c.insert(i, c[i])
        elif op == "swap":
            j = rng.randrange(len(c))
            c[i], c[j] = c[j], c[i]
        elif op == "empty":
            c.clear()
        else:
            c[i] = _value(rng, c[i])
        what = f"{op} item {i}"
    _save(f, obj, gz)
    return f"json:{f.name}:{what}"


def mutate_bytes(rng: random.Random, d: Path) -> str:
    files = sorted(p for p in d.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        return "bytes:none"
    f = rng.choice(files)
    raw = f.read_bytes()
    op = rng.choice(["truncate", "flip", "nul", "garbage", "empty", "append", "bomb", "gzip-plain", "zero-run"])
    if op == "truncate":
        raw = raw[: rng.randrange(max(1, len(raw)))]
    elif op == "flip" and raw:
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        raw = bytes(b)
    elif op == "nul":
        raw = b"\0" * rng.choice([1, 100, 4096])
    elif op == "garbage":
        raw = rng.randbytes(rng.choice([1, 64, 4096]))
    elif op == "empty":
        raw = b""
    elif op == "append":
        raw = raw + rng.choice([b"]}", b"\n{\"x\":", b"\0", rng.randbytes(16)])
    elif op == "bomb":  # a small gzip that expands past the input limit
        raw = gzip.compress(b"[" + b" " * (LIMIT + 2**20) + b"]", compresslevel=9, mtime=0)
    elif op == "gzip-plain":
        plain = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, mtime=0)
        raw = plain
    else:
        at = rng.randrange(max(1, len(raw)))
        raw = raw[:at] + b"\0" * 64 + raw[at:]
    f.write_bytes(raw)
    return f"bytes:{f.name}:{op}"


RANK_LIKE = {
    "gtrace": (".events.json.gz", ".dfg.json.gz", "manifest.json"),
    "kineto": (".json", ".json.gz"),
    "byteps": ("comm.json", "server_profile.json", ".log"),
    "pslite": (".jsonl",),
    "recording": (".json.gz", ".meta.json", "horovod_timeline.json"),
}


def _replace(p: Path, how: str, outside: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()
    if how == "dir":
        p.mkdir()
    elif how == "fifo":
        os.mkfifo(p)
    elif how == "dev-zero":
        p.symlink_to("/dev/zero")
    elif how == "dev-urandom":
        p.symlink_to("/dev/urandom")
    elif how == "broken-link":
        p.symlink_to(p.parent / "no-such-file")
    elif how == "link-loop":
        p.symlink_to(p)
    elif how == "link-outside":
        p.symlink_to(outside)


def mutate_dir(rng: random.Random, d: Path, kind: str, outside: Path) -> str:
    entries = sorted(p for p in d.rglob("*") if p.name.endswith(RANK_LIKE[kind]) or p.is_file())
    op = rng.choice(["remove", "replace", "replace", "replace", "extra", "rename", "newline-name", "leftover-tmp",
                     "dup-rank"])
    if not entries:
        return "dir:none"
    p = rng.choice(entries)
    if op == "remove":
        p.unlink() if not p.is_dir() or p.is_symlink() else shutil.rmtree(p)
        return f"dir:{p.name}:remove"
    if op == "replace":
        how = rng.choice(["dir", "fifo", "dev-zero", "dev-urandom", "broken-link", "link-loop", "link-outside"])
        _replace(p, how, outside)
        return f"dir:{p.name}:{how}"
    if op == "extra":  # a new rank-like entry that is not a regular file
        q = p.parent / ("rank7" + "".join(p.suffixes) if kind in ("kineto", "recording") else "x7" + p.name)
        if not os.path.lexists(q):
            q.touch()
        _replace(q, rng.choice(["dir", "fifo", "dev-zero", "broken-link", "link-loop"]), outside)
        return f"dir:{q.name}:extra"
    if op == "rename":
        q = p.with_name(p.name.replace("0", "9", 1).replace("rank", "rank1", 1))
        if not os.path.lexists(q):
            p.rename(q)
        return f"dir:{p.name}:rename"
    if op == "newline-name":
        q = p.with_name(p.name.replace("1", "1\n", 1) if "1" in p.name else "x\n" + p.name)
        if not os.path.lexists(q):
            p.rename(q)
        return f"dir:{p.name}:newline-name"
    if op == "leftover-tmp":
        (d.parent / f".OUT.tmp{2**22 + rng.randrange(1000)}-x").mkdir(exist_ok=True)
        return "dir:leftover-tmp"
    if p.is_file() and not p.is_symlink():  # dup-rank: one more copy under another rank number
        q = p.with_name(p.name.replace("0", "5", 1).replace("1", "6", 1))
        if not os.path.lexists(q):
            shutil.copy(p, q)
    return f"dir:{p.name}:dup-rank"


# --------------------------------------------------------------------------- running


@dataclass
class Result:
    seed: str
    command: str
    mutations: list[str]
    outcome: str
    detail: str = ""
    seconds: float = 0.0
    mode: str = "in-process"
    index: int = -1


@dataclass
class _Audit:
    active: bool = False
    opened: list[str] = field(default_factory=list)


_AUDIT = _Audit()


def _hook(event: str, args: tuple) -> None:
    if _AUDIT.active and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        p = os.fsdecode(args[0]) if not isinstance(args[0], str) else args[0]
        _AUDIT.opened.append(p)


_HOOKED = False


def _install_hook() -> None:
    global _HOOKED  # noqa: PLW0603 - one audit hook per process (they cannot be removed)
    if not _HOOKED:
        sys.addaudithook(_hook)
        _HOOKED = True


class _Timeout(BaseException):
    pass


@contextlib.contextmanager
def deadline(seconds: int = 20, timeout: Callable[[], BaseException] | None = None) -> Iterator[None]:
    """Raise ``timeout()`` (default: TimeoutError) in this thread when the block takes more
    than ``seconds``, instead of hanging. The fuzzer raises a BaseException, so that code under
    test cannot catch it as an ordinary error."""

    def boom(*_):
        raise timeout() if timeout else TimeoutError(f"hung for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _listing(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dp = Path(dirpath)
        dirs[:] = [x for x in dirs if dp / x not in skip]
        for n in dirs + files:
            p = dp / n
            if p in skip:
                continue
            st = p.lstat()
            out[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def command_args(command: str, inp: Path, out: Path, partial: bool) -> list[str]:
    head = ["--max-input-bytes", str(LIMIT)] + (["--allow-missing-ranks"] if partial else [])
    if command == "replay":
        return head + ["replay", str(inp), "--json", "--no-align"]
    if command == "replay-align":
        return head + ["replay", str(inp), "--json"]
    if command == "validate":
        return head + ["validate", str(inp)]
    if command == "align":
        return head + ["align", str(inp), "-o", str(out), "--json"]
    if command == "collect":
        return head + ["collect", str(inp), "-o", str(out)]
    if command.startswith("import "):
        return head + ["import", command.split()[1], str(inp), "-o", str(out)]
    raise ValueError(command)


def _check_success(command: str, out_text: str, out_dir: Path) -> str | None:
    """Why an exit-0 result cannot be right, or None."""
    if command.startswith("replay"):
        j = orjson.loads(out_text)
        pred, meas = j.get("predicted_iteration_us"), j.get("measured_iteration_us")
        for what, v in (("predicted", pred), ("measured", meas)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v < 2**53):
                return f"{what}_iteration_us {v!r}"
        for k, v in (j.get("breakdown_us") or {}).items():
            if isinstance(v, (int, float)) and not (math.isfinite(v) and v >= -1e-6):
                return f"breakdown {k} {v!r}"
    elif command == "validate":
        if "steps []" in out_text or ": ok:" not in out_text:
            return f"validate said {out_text.strip()[:120]!r}"
    else:
        from dpro.errors import DproInputError
        from dpro.loader import open_trace

        try:
            open_trace(out_dir)
        except DproInputError as e:
            return f"OUT does not load: {e}"
    return None


def _run_in_process(args: list[str], timeout: int) -> tuple[int | None, str, str, BaseException | None, list[str]]:
    from click.testing import CliRunner

    from dpro.cli import cli

    records: list[str] = []

    class _H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    h = _H(level=logging.WARNING)
    logging.getLogger("dpro").addHandler(h)
    _AUDIT.opened.clear()
    _AUDIT.active = True
    try:
        with deadline(timeout, _Timeout):
            res = CliRunner().invoke(cli, args, prog_name="dpro", catch_exceptions=True)
    except _Timeout:
        return None, "", "", None, records
    finally:
        _AUDIT.active = False
        logging.getLogger("dpro").removeHandler(h)
    exc = res.exception if res.exception is not None and not isinstance(res.exception, SystemExit) else None
    if isinstance(exc, _Timeout):
        return None, "", "", None, records
    return res.exit_code, res.stdout, res.stderr, exc, records


def _run_subprocess(args: list[str], timeout: int) -> tuple[int | None, str, str, BaseException | None, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        r = subprocess.run([sys.executable, "-m", "dpro.cli", *args], capture_output=True, text=True, timeout=timeout,
                           env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "", "", None, []
    return r.returncode, r.stdout, r.stderr, None, []


def _outside_reads(opened: list[str], inp: Path, sandbox: Path, links_ok: bool) -> list[str]:
    bad = []
    for p in opened:
        ap = os.path.abspath(p)
        if ap.startswith(("/dev/", "/etc/", "/proc/")) and ap not in ("/dev/null", "/dev/tty", "/etc/localtime"):
            bad.append(ap)
        elif ap.startswith(str(sandbox / "outside")):
            bad.append(ap)
        elif ap.startswith(str(sandbox)) and not ap.startswith((str(inp), str(sandbox / "OUT"), str(sandbox / ".OUT"))):
            bad.append(ap)
    if links_ok:  # a symbolic link the input holds may point anywhere the user put it
        bad = [b for b in bad if not b.startswith(str(sandbox / "outside"))]
    return bad


def run_case(seed: Seed, index: int, base_seed: int, work: Path, *, subprocess_mode: bool = False,
             timeout: int = 30) -> Result:
    """Run case ``index`` of the campaign ``base_seed`` on ``seed`` (deterministic)."""
    import time

    rng = random.Random(f"{base_seed}:{seed.name}:{index}")
    command = rng.choice(seed.commands)
    sandbox = work / f"case{index}"
    if sandbox.exists():
        shutil.rmtree(sandbox)
    inp = sandbox / "in" / seed.path.name
    shutil.copytree(seed.path, inp, symlinks=True)
    outside = sandbox / "outside" / "canary.json"
    outside.parent.mkdir(parents=True)
    first = next((p for p in sorted(inp.rglob("*")) if p.is_file()), None)
    outside.write_bytes(first.read_bytes() if first else b"{}")
    muts = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        level = rng.choice(["json", "json", "json", "bytes", "dir"])
        try:
            if level == "json":
                muts.append(mutate_json(rng, inp))
            elif level == "bytes":
                muts.append(mutate_bytes(rng, inp))
            else:
                muts.append(mutate_dir(rng, inp, seed.kind, outside))
        except (OSError, ValueError, EOFError, TypeError, orjson.JSONDecodeError, orjson.JSONEncodeError, zlib.error) as e:
            muts.append(f"{level}:failed ({type(e).__name__})")
    out = sandbox / "OUT"
    args = command_args(command, inp, out, seed.partial)
    before = _listing(sandbox, (out,))
    t0 = time.perf_counter()
    runner = _run_subprocess if subprocess_mode else _run_in_process
    if not subprocess_mode:
        _install_hook()
    code, stdout, stderr, exc, logs = runner(args, timeout)
    secs = time.perf_counter() - t0
    res = Result(seed.name, command, muts, "", seconds=secs, mode="subprocess" if subprocess_mode else "in-process",
                 index=index)
    after = _listing(sandbox, (out,))
    changed = sorted(set(before.items()) ^ set(after.items()))
    changed = [c for c in changed if not Path(c[0]).name.startswith(".OUT.")]  # our leftover-tmp mutation, cleaned
    opened = list(_AUDIT.opened) if not subprocess_mode else []
    links_ok = seed.kind != "gtrace" and any(":link-outside" in m for m in muts)
    if code is None:
        res.outcome, res.detail = "hang", f"no result after {timeout} s"
    elif exc is not None:
        import traceback

        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{tb[-1].filename.split('/dpro/')[-1]}:{tb[-1].lineno}" if tb else "?"
        res.outcome, res.detail = "traceback", f"{type(exc).__name__}: {str(exc)[:150]} at {where}"
    elif "Traceback (most recent call last)" in stdout + stderr:
        res.outcome, res.detail = "traceback", stderr.strip().splitlines()[-1][:200]
    elif changed:
        res.outcome, res.detail = "escape", f"written or changed: {changed[0][0]}"
    elif bad := _outside_reads(opened, inp, sandbox, links_ok):
        res.outcome, res.detail = "escape", f"read outside the input: {bad[0]}"
    elif code != 0:
        # a real process also prints the warnings logged before the error (e.g. a rank file
        # skipped under --allow-missing-ranks), each on its own line, before it
        lines = [ln for ln in stderr.splitlines() if not (subprocess_mode and ln.startswith("WARNING dpro."))]
        if code == 2 and len(lines) == 1 and lines[0].startswith("dpro: error: "):
            res.outcome, res.detail = "clean-error", lines[0][:200]
        else:
            res.outcome, res.detail = "bad-message", f"exit {code}: {stderr[:200]!r}"
    else:
        skipped = _silent_skips(seed, inp, opened, stdout + stderr + "\n".join(logs)) if not subprocess_mode else []
        why = None
        try:
            why = _check_success(command, stdout, out)
        except Exception as e:  # noqa: BLE001 - a result we cannot even check is wrong
            why = f"{type(e).__name__}: {e}"
        if skipped:
            res.outcome, res.detail = "silent-skip", f"{skipped[0]} neither read nor reported"
        elif why:
            res.outcome, res.detail = "wrong-success", why
        else:
            res.outcome = "success"
    shutil.rmtree(sandbox, ignore_errors=True)
    return res


def _silent_skips(seed: Seed, inp: Path, opened: list[str], said: str) -> list[str]:
    if seed.kind == "gtrace":
        return []  # the manifest names the files; a listed file that is absent is an error
    opened_abs = {os.path.abspath(p) for p in opened}
    out = []
    for p in sorted(inp.rglob("*")):
        if not p.name.endswith(RANK_LIKE[seed.kind]) or p.name.endswith(".meta.json") and seed.kind == "kineto":
            continue
        if seed.kind == "byteps" and not (p.name == "comm.json" and p.parent.name.isdigit() or p.name.startswith("server")
                                           or p.name.endswith(".log")):
            continue
        if seed.kind == "pslite" and not p.name.startswith("pslite."):
            continue
        if seed.kind == "recording" and not p.name.startswith(("rank", "horovod")):
            continue
        if str(p) in opened_abs or any(x in said for x in (p.name, str(p), one_line(p.name))):
            continue  # read, or named in the output (as messages print it: control characters escaped)
        out.append(p.name)
    return out


def campaign(n: int, base_seed: int, work: Path, *, subprocess_every: int = 0, progress: Callable[[Result], None] | None = None,
             start: int = 0, step: int = 1) -> list[Result]:
    """Cases ``start, start + step, ...`` below ``n`` over all seeds (round robin)."""
    work.mkdir(parents=True, exist_ok=True)
    seeds = build_seeds(work / "seeds")
    results = []
    logging.getLogger("dpro").setLevel(logging.WARNING)
    for i in range(start, n, step):
        seed = seeds[i % len(seeds)]
        sub = bool(subprocess_every) and i % subprocess_every == 0
        r = run_case(seed, i, base_seed, work / "cases", subprocess_mode=sub)
        results.append(r)
        if progress:
            progress(r)
    return results
