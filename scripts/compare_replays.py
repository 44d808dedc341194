#!/usr/bin/env python3
"""Replay trace sets with two revisions of dpro and say which outputs differ.

For a change to an importer or the replayer: every set's ``dpro replay --json`` with the base
revision's code and with the new one's (timing fields left out of the comparison), one line
per set, ``same NAME`` or ``DIFF NAME``; the outputs are kept under ``--out``. Default sets:
every set of ../shared/traces/corpus and ../shared/traces/kineto, tests/data/kineto_multirank,
gpu_h200 and hta_extra.

    python scripts/compare_replays.py --base main~3 [--new WORKTREE] [--out DIR] [SET ...]

``--base``/``--new`` are git revisions (checked out into temporary worktrees) or directories
holding a dpro checkout (default ``--new``: this checkout, as it is). Each replay runs from a
neutral working directory with ``PYTHONPATH`` set to the side's checkout: ``python -m`` puts the
working directory first on ``sys.path``, so running from a checkout would load that checkout's
code on both sides. The compiled extensions (git-ignored) are copied from this checkout into
a revision's worktree; where the revision's C sources differ from this checkout's, that is said.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: output keys that hold wall-clock timings of the run itself, not results
TIMING_KEYS = ("seconds", "wall", "elapsed", "took", "time_s")
COMPILED = ("dpro/replayer", "dpro/importers/kineto")


def default_sets() -> list[Path]:
    shared = REPO.parent / "shared" / "traces"
    roots = [shared / "corpus", shared / "kineto", *(REPO / "tests/data" / d for d in ("kineto_multirank", "gpu_h200",
                                                                                     "hta_extra"))]
    return sorted(p for r in roots if r.is_dir() for p in r.iterdir()
                  if not p.name.endswith((".md", ".txt")) and p.name != "LICENSE")


def checkout(rev: str, tmp: Path) -> Path:
    """A directory with ``rev``'s code: the directory itself, or a detached worktree of it."""
    if Path(rev).is_dir():
        return Path(rev).resolve()
    where = tmp / rev.replace("/", "_").replace("~", "_")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(where), rev], check=True)
    for sub in COMPILED:
        for so in (REPO / sub).glob("_*.so"):
            shutil.copy2(so, where / sub / so.name)
        for c in (REPO / sub).glob("_*.c"):
            if not (where / sub / c.name).exists() or not filecmp.cmp(c, where / sub / c.name, shallow=False):
                print(f"# note: {rev}'s {sub}/{c.name} differs from this checkout's; its compiled copy is this "
                      f"checkout's", flush=True)
    return where


def strip(x: object) -> object:
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if not any(t in k for t in TIMING_KEYS)}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def replay(code: Path, trace: Path, out: Path) -> tuple[int, object]:
    """``dpro --allow-missing-ranks replay TRACE --json`` with ``code``'s dpro, from a neutral directory."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(code), "DPRO_NO_CACHE": "1", "HOME": str(out)}
    p = subprocess.run([sys.executable, "-m", "dpro", "--allow-missing-ranks", "replay", str(trace), "--json"],
                       cwd=out, env=env, capture_output=True, text=True, timeout=900)
    (out / f"{trace.name}.json").write_text(p.stdout)
    (out / f"{trace.name}.err").write_text(p.stderr)
    try:
        return p.returncode, strip(json.loads(p.stdout))
    except ValueError:
        return p.returncode, p.stderr.strip().splitlines()[-1:] if p.stderr else p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision or dpro checkout directory")
    ap.add_argument("--new", default=str(REPO), help="git revision or dpro checkout directory (default: this one)")
    ap.add_argument("--out", type=Path, default=None, help="keep the outputs here (default: a temporary directory)")
    ap.add_argument("sets", nargs="*", type=Path, help="trace sets (default: the corpus, kineto and test sets)")
    a = ap.parse_args()
    sets = [p.resolve() for p in a.sets] or default_sets()
    with tempfile.TemporaryDirectory(prefix="dpro-compare-") as tmp:
        tmpp = Path(tmp)
        out = (a.out or tmpp / "out").resolve()
        sides = {"base": checkout(a.base, tmpp), "new": checkout(a.new, tmpp)}
        for d in sides:
            (out / d).mkdir(parents=True, exist_ok=True)
        differ = 0
        try:
            for s in sets:
                got = {d: replay(code, s, out / d) for d, code in sides.items()}
                same = got["base"] == got["new"]
                differ += not same
                print(f"{'same' if same else 'DIFF'} {s.name}" + ("" if same else f" (rc {got['base'][0]} -> "
                                                                  f"{got['new'][0]})"), flush=True)
        finally:
            for code in sides.values():
                if code.is_relative_to(tmpp):
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)], check=False)
        print(f"# {len(sets) - differ} of {len(sets)} sets the same; outputs in {out if a.out else '(not kept)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
