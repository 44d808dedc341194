"""`dpro collect` names the user's directories as the trace's source, never the temporary
copies it imports from (they are gone once the command ends). Real recordings made here
with `dpro profile` (tests/data/golden/recordings)."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

RECORDINGS = Path(__file__).parent / "data" / "golden" / "recordings"


def manifest(out: Path) -> tuple[dict, str]:
    raw = (out / "manifest.json").read_bytes()
    return orjson.loads(raw), raw.decode()


@pytest.mark.parametrize("name", ["ddp_mlp", "mxnet_ps_mlp", "tf_horovod_convnet"])
def test_source_is_the_recording(name: str, tmp_path: Path, run_cli) -> None:
    raw = RECORDINGS / name / "raw"
    code, _, err = run_cli("collect", raw, "-o", tmp_path / "out")
    assert code == 0, err
    m, text = manifest(tmp_path / "out")
    assert m["meta"]["source"] == str(raw)
    assert "dpro-collect-" not in text and "dpro-merge-" not in text


def test_source_names_every_merged_host(tmp_path: Path, run_cli) -> None:
    """Two hosts' directories (one rank each) merged: both are named."""
    raw = RECORDINGS / "ddp_mlp" / "raw"
    hosts = [tmp_path / "hostA", tmp_path / "hostB"]
    for rank, host in enumerate(hosts):
        host.mkdir()
        for f in raw.glob(f"rank{rank}.*"):
            shutil.copy(f, host / f.name)
    code, _, err = run_cli("collect", *hosts, "-o", tmp_path / "out")
    assert code == 0, err
    m, text = manifest(tmp_path / "out")
    assert m["meta"]["source"] == f"{hosts[0]}, {hosts[1]}"
    assert "dpro-collect-" not in text and "dpro-merge-" not in text
