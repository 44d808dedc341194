"""The report's charts as Vega-Lite specs (data inline, µs and bytes converted here, at
display): the page draws them with the inlined Vega bundle, ``--png`` with vl-convert.
The Gantt is drawn on a canvas in the page (:file:`assets/report.js`);
:func:`gantt_spec` is its PNG form."""

from __future__ import annotations

from dpro.gtrace.schema import CATEGORIES

#: one colour per op category (the page's Gantt uses the same)
CAT_COLORS = {"FW": "#4e79a7", "BW": "#f28e2b", "UPDATE": "#59a14f", "IO": "#b07aa1", "COMM": "#e15759",
              "OTHER": "#9c9c9c"}
PART_COLORS = {"FW": "#4e79a7", "BW": "#f28e2b", "UPDATE": "#59a14f", "IO": "#b07aa1", "OTHER": "#9c9c9c",
               "host_gap": "#edc948", "exposed_COMM": "#e15759", "idle": "#d9d9d9"}
#: the breakdown parts that add up to the iteration (``COMM`` overlaps compute: not stacked)
STACKED_PARTS = list(PART_COLORS)
#: collectives drawn in the exposed-communication chart
TOP_COLLECTIVES = 30

_BASE = {"config": {"view": {"stroke": None}}}


def _spec(**kw) -> dict:
    return {**_BASE, **kw}


def breakdown_rows(breakdown: list[dict]) -> list[dict]:
    """The stacked bars: one per worker and non-zero part."""
    order = {p: i for i, p in enumerate(STACKED_PARTS)}
    return [{**r, "ms": r["us"] / 1e3, "order": order[r["part"]]} for r in breakdown
            if r["part"] in order and r["us"] > 0]


def breakdown_spec(breakdown: list[dict]) -> dict:
    rows = breakdown_rows(breakdown)
    workers = len({r["worker"] for r in rows})
    return _spec(
        title="Where each worker's iteration goes", width=640, height=max(60, 22 * workers),
        data={"values": rows}, mark={"type": "bar", "tooltip": True},
        encoding={
            "y": {"field": "worker", "type": "nominal", "sort": None, "title": None},
            "x": {"field": "ms", "type": "quantitative", "stack": "zero", "title": "time in the iteration (ms)"},
            "color": {"field": "part", "type": "nominal", "title": "part",
                      "scale": {"domain": STACKED_PARTS, "range": list(PART_COLORS.values())}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "worker"}, {"field": "part"}, {"field": "ms", "format": ".3f", "title": "ms"}],
        })


def exposed_spec(exposed: list[dict]) -> dict:
    rows = [{**r, "ms": r["exposed_us"] / 1e3, "pct": 100 * r["share"]} for r in exposed[:TOP_COLLECTIVES]]
    return _spec(
        title=f"Exposed communication per collective (largest first{', top %d' % TOP_COLLECTIVES if len(exposed) > TOP_COLLECTIVES else ''})",
        width=640, height=max(40, 16 * len(rows)), data={"values": rows}, mark={"type": "bar", "tooltip": True},
        encoding={
            "y": {"field": "collective", "type": "nominal", "sort": "-x", "title": None},
            "x": {"field": "pct", "type": "quantitative", "title": "share of the exposed communication (%)"},
            "color": {"value": CAT_COLORS["COMM"]},
            "tooltip": [{"field": "collective"}, {"field": "ms", "format": ".3f", "title": "exposed ms per worker"},
                        {"field": "pct", "format": ".1f", "title": "%"}],
        })


def memory_spec(memory: list[dict]) -> dict | None:
    rows, peaks = [], []
    for m in memory:
        if len(m["timeline"]) < 2:
            continue
        rows += [{"worker": m["worker"], "ms": p["t_us"] / 1e3, "MiB": p["bytes"] / 2**20} for p in m["timeline"]]
        peaks.append({"worker": m["worker"], "ms": m["peak_us"] / 1e3, "MiB": m["peak_bytes"] / 2**20,
                      "op": m["peak_op"] or "", "label": f"peak {m['peak_bytes'] / 2**20:.1f} MiB: {m['peak_op'] or ''}"[:70]})
    if not rows:
        return None
    x = {"field": "ms", "type": "quantitative", "title": "time in the iteration (ms)"}
    y = {"field": "MiB", "type": "quantitative", "title": "predicted memory (MiB)"}
    return _spec(
        title="Predicted memory over the iteration (peak op marked)", width=640, height=220,
        layer=[
            {"data": {"values": rows}, "mark": {"type": "line", "interpolate": "step-after", "tooltip": True},
             "encoding": {"x": x, "y": y, "color": {"field": "worker", "type": "nominal"}}},
            {"data": {"values": peaks}, "mark": {"type": "point", "shape": "triangle-down", "size": 90, "filled": True,
                                                 "tooltip": True},
             "encoding": {"x": x, "y": y, "color": {"field": "worker", "type": "nominal"},
                          "tooltip": [{"field": "worker"}, {"field": "op", "title": "peak op"},
                                      {"field": "MiB", "format": ".1f"}, {"field": "ms", "format": ".2f"}]}},
            {"data": {"values": peaks[:1]}, "mark": {"type": "text", "align": "left", "dx": 6, "dy": -8, "fontSize": 10},
             "encoding": {"x": x, "y": y, "text": {"field": "label"}}},
        ])


def optimize_spec(opt: dict) -> dict:
    rows = [{"strategy": k, "ms": v / 1e3, "kind": "baseline"} for k, v in opt["baselines_us"].items()]
    rows.append({"strategy": "dpro's best strategy", "ms": opt["best_us"] / 1e3, "kind": "best"})
    rows += [{"strategy": f"realized for {r['library']}", "ms": r["iteration_us"] / 1e3, "kind": "realized"}
             for r in opt["realized"]]
    return _spec(
        title="Predicted iteration time of each strategy", width=640, height=max(60, 20 * len(rows)),
        data={"values": rows}, mark={"type": "bar", "tooltip": True},
        encoding={"y": {"field": "strategy", "type": "nominal", "sort": None, "title": None},
                  "x": {"field": "ms", "type": "quantitative", "title": "predicted iteration (ms)"},
                  "color": {"field": "kind", "type": "nominal", "title": None,
                            "scale": {"domain": ["baseline", "best", "realized"],
                                      "range": ["#9c9c9c", "#59a14f", "#4e79a7"]}},
                  "tooltip": [{"field": "strategy"}, {"field": "ms", "format": ".3f"}]})


def bucket_spec(sweep: list[dict]) -> dict:
    rows = [{**p, "ms": p["iteration_us"] / 1e3, "label": "DDP default (25 MiB)" if p["default"] else ""} for p in sweep]
    x = {"field": "bucket_cap_mb", "type": "quantitative", "scale": {"type": "log"}, "title": "bucket_cap_mb (MiB, log)"}
    y = {"field": "ms", "type": "quantitative", "scale": {"zero": False}, "title": "predicted iteration (ms)"}
    tip = [{"field": "bucket_cap_mb", "format": ".3g"}, {"field": "buckets"}, {"field": "ms", "format": ".3f"}]
    return _spec(
        title="DDP: predicted step time against bucket_cap_mb", width=640, height=220, data={"values": rows},
        layer=[{"mark": {"type": "line", "point": True, "tooltip": True}, "encoding": {"x": x, "y": y, "tooltip": tip}},
               {"transform": [{"filter": "datum.default"}], "mark": {"type": "point", "size": 120, "color": "#e15759",
                                                                     "filled": True},
                "encoding": {"x": x, "y": y}},
               {"transform": [{"filter": "datum.default"}], "mark": {"type": "text", "dy": -12, "color": "#e15759"},
                "encoding": {"x": x, "y": y, "text": {"field": "label"}}}])


def scaling_spec(points: list[dict]) -> dict:
    rows = [{**p, "ms": p["iteration_us"] / 1e3} for p in points]
    return _spec(
        title="Scaling: predicted iteration time against devices", width=640, height=220, data={"values": rows},
        mark={"type": "line", "point": True, "tooltip": True},
        encoding={"x": {"field": "devices", "type": "quantitative", "title": "devices"},
                  "y": {"field": "ms", "type": "quantitative", "title": "predicted iteration (ms)"},
                  "color": {"field": "series", "type": "nominal", "title": None},
                  "tooltip": [{"field": "series"}, {"field": "devices"}, {"field": "ms", "format": ".3f"}]})


def gantt_spec(gantt: dict, max_rows: int = 20_000) -> dict:
    """The Gantt as a Vega-Lite chart (for ``--png``): the longest ``max_rows`` ops and
    every critical-path op."""
    ops, names = gantt["ops"], gantt["names"]
    idx = sorted(range(len(ops["start"])), key=lambda i: (not ops["crit"][i], -ops["dur"][i]))[:max_rows]
    rows = [{"lane": gantt["lanes"][ops["lane"][i]], "t0": ops["start"][i] / 1e3,
             "t1": (ops["start"][i] + ops["dur"][i]) / 1e3, "cat": CATEGORIES[ops["cat"][i]],
             "critical": bool(ops["crit"][i]), "name": names[ops["name"][i]]} for i in idx]
    cats = list(CAT_COLORS)
    return _spec(
        title="Simulated iteration (critical path outlined)", width=900, height=max(80, 18 * len(gantt["lanes"])),
        data={"values": rows}, mark={"type": "bar", "tooltip": True},
        encoding={"y": {"field": "lane", "type": "nominal", "sort": gantt["lanes"], "title": None},
                  "x": {"field": "t0", "type": "quantitative", "title": "time (ms)"}, "x2": {"field": "t1"},
                  "color": {"field": "cat", "type": "nominal", "scale": {"domain": cats, "range": list(CAT_COLORS.values())},
                            "title": "category"},
                  "stroke": {"condition": {"test": "datum.critical", "value": "#000"}, "value": None},
                  "strokeWidth": {"condition": {"test": "datum.critical", "value": 1.5}, "value": 0}})


def chart_specs(data: dict) -> dict[str, dict]:
    """The page's Vega-Lite charts by id (those with data)."""
    out = {"breakdown": breakdown_spec(data["breakdown"])}
    if data["exposed"]:
        out["exposed"] = exposed_spec(data["exposed"])
    mem = memory_spec(data["memory"])
    if mem is not None:
        out["memory"] = mem
    if data.get("optimize"):
        out["optimize"] = optimize_spec(data["optimize"])
    if data.get("bucket_sweep"):
        out["bucket_sweep"] = bucket_spec(data["bucket_sweep"])
    if data.get("scaling"):
        out["scaling"] = scaling_spec(data["scaling"])
    return out
