"""``dpro oracle``: every strategy at every device count, ranked, with its bottleneck.

    from dpro.oracle import run_oracle
    res = run_oracle(dpro.open("traces/"), devices=[2, 4, 8], memory_budget=80 * 2**30)
    res.to_json()["strategies"]        # what `dpro oracle --json` prints

Per device count the feasible strategies are ranked by predicted iteration time; each
prediction names its bottleneck in the manner of ParaDL's Table 6: the communication
phase that outweighs the computation (gradient exchange, layer-wise collectives, halo
exchange, pipeline P2P), else compute; an infeasible one names the limit it hits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dpro.errors import DproInputError
from dpro.oracle.formulas import STRATEGIES, Options, Prediction, predict
from dpro.oracle.layers import AFFINE, Layer, ModelProfile, affine_profile, model_profile
from dpro.oracle.platform import Platform, platform_of

if TYPE_CHECKING:
    from dpro.job import Job

#: what a bottleneck means for the user (ParaDL Table 6's remarks)
ADVICE = {
    "gradient_exchange": "the gradient all-reduce dominates: larger batch per device, fewer data-parallel devices, "
                         "or a model-parallel split of the weights",
    "layerwise_collectives": "per-layer collectives dominate: fewer model-parallel devices or a data+model hybrid",
    "halo_exchange": "halo exchange dominates: split fewer ways or larger feature maps per device",
    "pipeline_p2p": "activation transfers between stages dominate: fewer stages or fewer micro-batches",
    "compute": "compute-bound: more devices help while a limit allows",
}


@dataclass
class OracleResult:
    """Predictions for each strategy and device count, the model and platform used."""

    model: ModelProfile
    platform: Platform
    batch: int
    devices: list[int]
    predictions: list[Prediction]
    memory_budget: int | None = None
    simulated: dict[tuple[str, int], float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def best(self, p: int) -> Prediction | None:
        ok = [x for x in self.predictions if x.devices == p and x.feasible]
        return min(ok, key=lambda x: x.iteration_us) if ok else None

    def launcher(self, pr: Prediction) -> str:
        """What to set in the launcher for ``pr`` (examples/parallel/train.py's options)."""
        g = pr.grid
        cmd = f"torchrun --nproc_per_node {pr.devices} ... --strategy {pr.strategy} --batch {self.batch}"
        if "micro_batches" in g:
            cmd += f" --micro {g['micro_batches']}"
            names = [x.name for x in self.model.layers if x.name != "(rest)"]
            if g.get("cuts") and all(c in names for c in g["cuts"]):
                cmd += " --cuts " + ",".join(str(names.index(c)) for c in g["cuts"])
        if pr.strategy.startswith("data+"):
            cmd += f" --p2 {pr.devices // g['data']}"
        return cmd

    def _layer_json(self, x: Layer) -> dict:
        d = {"name": x.name, "kind": x.kind, "fw_us_per_sample": x.fw_us, "bw_us_per_sample": x.bw_us,
             "fw_call_us": x.fw_call_us, "bw_call_us": x.bw_call_us, "wu_us": x.wu_us,
             "x_bytes": x.x_bytes, "y_bytes": x.y_bytes, "w_bytes": x.w_bytes, "channels": x.channels,
             "filters": x.filters, "height": x.height, "width": x.width, "kernel": x.kernel,
             "batch_rule": self.model.layer_rules.get(x.name, self.model.rule)}
        g = self.model.guards.get(x.name)
        if g is not None:  # the affine fit of its forward + backward per call and what the repeats leave of it
            d["affine_guard"] = {"a_us": g.a_us, "b_us_per_sample": g.b_us, "spread_a_us": g.u_a_us,
                                 "spread_b_us_per_sample": g.u_b_us, "supported": g.supported}
        return d

    def to_json(self) -> dict:
        rows = []
        for x in self.predictions:
            it = x.iteration_us
            d = {"strategy": x.strategy, "devices": x.devices,
                 "iteration_us": it if math.isfinite(it) else None,
                 "compute_us": x.compute_us if math.isfinite(x.compute_us) else None,
                 "communication_us": {k: (v if math.isfinite(v) else None) for k, v in x.communication_us.items()},
                 "exposed_communication_us": x.comm_us if math.isfinite(x.comm_us) else None,
                 "host_us": x.host_us,
                 "memory_bytes": x.memory_bytes, "feasible": x.feasible, "limit": x.limit,
                 "limit_reason": x.limit_reason, "rank": x.rank, "bottleneck": x.bottleneck,
                 "contention": x.contention, "grid": x.grid, "launcher": self.launcher(x),
                 "collective_calls": x.calls,
                 "bucket_refill_us": x.refill_us if math.isfinite(x.refill_us) else None,
                 "bucket_wire_us": ([{"bytes": b, "alpha_us": c.alpha, "wire_us": w} for (c, b), w in x.wires.items()]
                                    if x.wires is not None else None)}
            sim = self.simulated.get((x.strategy, x.devices))
            if sim is not None:  # what the replayed schedule leaves of the communication exposed
                d["simulated_iteration_us"] = sim if math.isfinite(sim) else None
                d["simulated_exposed_communication_us"] = max(0.0, sim - x.busy_us) if math.isfinite(sim) else None
            rows.append(d)
        return {
            "batch": self.batch, "devices": self.devices, "memory_budget_bytes": self.memory_budget,
            "platform": self.platform.to_json(),
            "model": {"profiled_batch_per_device": self.model.batch, "overhead_us": self.model.overhead_us,
                      "batch_rule": self.model.rule, "profiled_batches_per_device": self.model.batches,
                      "layers": [self._layer_json(x) for x in self.model.layers]},
            "strategies": rows,
            "notes": self.notes + self.model.notes,
        }


def memory_reuse(job: Job, model: ModelProfile) -> tuple[float, str]:
    """ParaDL's memory reuse factor γ: the profiled job's peak memory (dpro's memory model
    on the recorded allocations, docs/memory.md) over the naive sum for the profiled
    data-parallel configuration; 1 without recorded allocations."""
    from dpro.oracle.formulas import _memory

    peaks = [m.peak_bytes for m in job.replay().memory.values() if m.source == "allocations"]
    naive = _memory(model.layers, model.batch, 1.0, 1.0)
    if not peaks or naive <= 0:
        return 1.0, "memory reuse factor γ = 1 (no allocations recorded: memory is ParaDL's naive sum)"
    g = max(peaks) / naive
    return g, f"memory reuse factor γ = {g:.3f}: the profiled peak {max(peaks)} bytes over the naive sum {naive}"


def run_oracle(job: Job, devices: list[int], *, batch: int | None = None, memory_budget: int | None = None,
               platform: str | None = None, strategies: tuple[str, ...] = STRATEGIES, micro: int | None = None,
               gamma: float | None = None, contention: bool = True, simulate: bool = False,
               profile_at: list[Job] | tuple[Job, ...] = ()) -> OracleResult:
    """Predict ``strategies`` on each of ``devices`` for the model profiled in ``job``.

    ``batch``: the global batch (default: the profiled per-device batch times the job's
    workers); ``platform``: a platform file (default: the link cost fitted from the trace);
    ``simulate``: also replay each feasible prediction's DFG (dpro/oracle/simulate.py);
    ``gamma``: ParaDL's memory reuse factor (default: :func:`memory_reuse`);
    ``profile_at``: profiles of the same model at other per-device batches: each layer's
    time per call is then fitted as a + b·batch (:func:`affine_profile`), else it is
    proportional to the batch (one profile).
    """
    where = job.path or "trace"
    bad = [p for p in devices if not isinstance(p, int) or p < 1]
    if bad or not devices:
        raise DproInputError(None, f"--devices: device counts must be integers >= 1 (got {bad[0] if bad else 'none'})")
    model = model_profile(job)
    if profile_at:
        model = affine_profile([model, *(model_profile(j) for j in profile_at)])
    if batch is None:
        batch = model.batch * max(1, len(job.trace.workers()))
    if batch < 1:
        raise DproInputError(where, f"--batch must be >= 1 (got {batch})")
    plat = platform_of(job, platform)
    notes = []
    if model.rule != AFFINE:
        notes.append(f"one profile ({model.batch} samples per device): a layer's op time is taken proportional to the "
                     "per-device batch (host gaps per call); a profile at another batch (--profile-at) fits it as "
                     "affine, a + b x batch")
    if gamma is None:
        gamma, how = memory_reuse(job, model)
        notes.append(how)
    if contention and not plat.shares_links:
        notes.append("the platform's ranks have links of their own (calibration topology per-rank): "
                     "no contention penalty between a hybrid's concurrent groups")
    buckets = sorted({f"{c.burst / 1024:.0f} KiB" for d in plat.calibration.links.values() for c in d.values() if c.burst})
    if buckets:
        notes.append(f"the link has a token bucket ({', '.join(buckets)} at the line rate, then the capped rate); "
                     "followed over the step's messages in order, refilled at the capped rate during the "
                     "compute between two (bucket_refill_us) and each call's own per-call time; "
                     "bucket_wire_us: each message's wire time in the step's steady state")
    opts = Options(batch=batch, memory_budget=memory_budget, gamma=gamma, micro=micro, contention=contention)
    preds = [predict(model, s, p, plat, opts) for p in devices for s in strategies]
    for p in devices:
        ok = sorted((x for x in preds if x.devices == p and x.feasible), key=lambda x: x.iteration_us)
        for i, x in enumerate(ok, 1):
            x.rank = i
    res = OracleResult(model, plat, batch, list(devices), preds, memory_budget, notes=notes)
    if simulate:
        from dpro.oracle.simulate import simulate_prediction

        for x in preds:
            if x.feasible:
                res.simulated[(x.strategy, x.devices)] = simulate_prediction(model, x, plat, opts)
    return res
