"""The import layers of docs/architecture.md hold (scripts/check_layers.py), and the check
finds what it is for: an import up the layers, between two packages of one layer, a cycle."""

from __future__ import annotations

from pathlib import Path

from scriptmod import load_script

REPO = Path(__file__).resolve().parents[1]
check_layers = load_script("check_layers", "scripts/check_layers.py")


def test_dpro_keeps_its_layers() -> None:
    bad = check_layers.violations(REPO)
    assert not bad, "\n".join(bad)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_the_check_finds_climbs_siblings_and_cycles(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "dpro/__init__.py": "",
        "dpro/errors.py": "",
        "dpro/gtrace/__init__.py": "",
        # a lazy import up the layers still counts
        "dpro/gtrace/schema.py": "def f():\n    from dpro.replayer import engine\n",
        "dpro/graph/__init__.py": "",
        "dpro/graph/a.py": "from dpro.alignment import x\n",  # same layer
        "dpro/alignment/__init__.py": "",
        "dpro/alignment/x.py": "",
        "dpro/replayer/__init__.py": "",
        "dpro/replayer/engine.py": "from dpro.replayer import timeline\n",
        "dpro/replayer/timeline.py": "from . import engine\n",  # cycle through a relative import
        "dpro/replayer/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dpro.replayer import engine\n",
        "dpro/newpkg.py": "",
    })
    bad = check_layers.violations(root)
    assert "dpro.gtrace.schema imports dpro.replayer.engine: up the layers (dpro.gtrace is below dpro.replayer)" in bad
    assert any(b.startswith("dpro.graph.a imports dpro.alignment.x: dpro.graph and dpro.alignment are in one layer")
               for b in bad)
    assert "import cycle: dpro.replayer.engine -> dpro.replayer.timeline" in bad
    assert any(b.startswith("dpro.newpkg: package dpro.newpkg is in no layer") for b in bad)
    assert len(bad) == 4, bad  # the type-only import closes no cycle
