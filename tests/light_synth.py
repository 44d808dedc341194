"""Make a CUDA-light recording (``DPRO_CUDA_LIGHT``) out of a full CUDA recording, for tests.

This machine has no GPU: what a CUDA-only torch.profiler session writes is synthesized from a
recording of dpro's recorder on a GPU (every step with CPU + CUDA activities): the first
profiled step stays as the structure step (``rank<r>.json.gz``), and the later steps keep only
what a CUDA-only session records, the runtime / driver calls and the GPU ops they launched
(``rank<r>.light.gz``): no ``cpu_op``, ``user_annotation`` or ``python_function`` events.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

RUNTIME = ("cuda_runtime", "cuda_driver")
GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def make_light(src: Path, dst: Path, rank: int = 0) -> dict:
    """Write the light version of recording ``src`` (a raw directory) to ``dst``; returns its
    meta's ``cuda_light`` entry."""
    dst.mkdir(parents=True, exist_ok=True)
    d = json.loads(gzip.decompress((src / f"rank{rank}.json.gz").read_bytes()))
    meta = json.loads((src / f"rank{rank}.meta.json").read_text())
    ev = d["traceEvents"]
    marks = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    first, cut = marks[0], marks[1]["ts"]
    calls = [e for e in ev if e.get("ph") == "X" and e.get("cat") in RUNTIME]
    later = {e["args"]["correlation"] for e in calls if e["ts"] >= cut and "correlation" in e.get("args", {})}

    def gpu_of_later(e: dict) -> bool:
        return e.get("cat") in GPU and e.get("args", {}).get("correlation") in later

    struct = [e for e in ev if not (e.get("ph") == "X" and (e.get("ts", 0) >= cut or gpu_of_later(e)))
              and not (e.get("ph") != "X" and e.get("ts", 0) >= cut)]
    light = [e for e in ev if e.get("ph") == "X" and ((e.get("cat") in RUNTIME and e["ts"] >= cut) or gpu_of_later(e))]
    (dst / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps({**d, "traceEvents": struct}).encode()))
    (dst / f"rank{rank}.light.gz").write_bytes(gzip.compress(json.dumps({**d, "traceEvents": light}).encode()))
    st = int(first["name"].split("#")[1])
    info = {"structure_step": st, "steps": [s for s in meta["steps"] if s > st], "trace": f"rank{rank}.light.gz"}
    meta["cuda_light"] = info
    (dst / f"rank{rank}.meta.json").write_text(json.dumps(meta))
    for f in src.iterdir():
        if not (dst / f.name).exists():
            shutil.copy2(f, dst / f.name)
    return info
