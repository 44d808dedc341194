"""No behaviour change: every bundled, shared and recorded trace gives the golden output.

See tests/golden.py for what is compared and how the expected files are made. A case
whose input is absent (``../shared`` not beside the repository) is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from golden import cases, compute, diff, expected_file, load_expected

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden(case, tmp_path: Path) -> None:
    if not expected_file(case).is_file():
        pytest.fail(f"no expected output for {case.name}: run `python tests/golden.py --update {case.name}`")
    got = compute(case, tmp_path)
    d = diff(load_expected(case), got)
    assert not d, f"{case.name}: {len(d)} differences:\n" + "\n".join(d[:30])


def test_every_expected_file_has_a_case() -> None:
    names = {c.name for c in CASES}
    stale = [f.name for f in expected_file(CASES[0]).parent.glob("*.json.gz") if f.name[: -len(".json.gz")] not in names]
    shared = (Path(__file__).resolve().parents[2] / "shared" / "traces").is_dir()
    if shared:
        assert not stale, f"expected files without a case: {stale}"
