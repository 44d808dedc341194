"""Intervals on one time axis (µs): their union, overlaps, and busy periods.

Used where a trace or a replayed schedule is read as intervals: the breakdown of a
replayed iteration (:mod:`dpro.replayer.breakdown`), CPU contention
(:mod:`dpro.replayer.cpu_contention`, :func:`dpro.optimizer.job_model.job_model`) and the
link-cost fits (busy periods of collectives or messages).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals as disjoint intervals, sorted: (starts, ends)."""
    if len(start) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(start, kind="stable")
    bs, be = np.asarray(start, float)[order], np.maximum.accumulate(np.asarray(end, float)[order])
    new = np.ones(len(bs), dtype=bool)
    new[1:] = bs[1:] > be[:-1]
    return bs[new], np.append(be[np.flatnonzero(new)[1:] - 1], be[-1])


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of the intervals (µs)."""
    if len(start) == 0:
        return 0.0
    ms, me = merge(start, end)
    return float((me - ms).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two unions of intervals, each given merged
    (:func:`merge`'s disjoint, sorted (starts, ends))."""
    (a_s, a_e), (b_s, b_e) = a, b
    i = j = 0
    tot = 0.0
    while i < len(a_s) and j < len(b_s):
        lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
        if hi > lo:
            tot += hi - lo
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return tot


def overlap(start: np.ndarray, end: np.ndarray, busy_start: np.ndarray, busy_end: np.ndarray) -> np.ndarray:
    """Per interval [start, end), its overlap with the union of the busy intervals (µs)."""
    start, end = np.asarray(start, float), np.asarray(end, float)
    if len(busy_start) == 0 or len(start) == 0:
        return np.zeros(len(start))
    ms, me = merge(busy_start, busy_end)
    cum = np.concatenate([[0.0], np.cumsum(me - ms)])

    def covered(x: np.ndarray) -> np.ndarray:  # busy length in (-inf, x]
        i = np.searchsorted(ms, x, side="right")  # intervals starting at or before x
        full = cum[np.maximum(i - 1, 0)]
        part = np.where(i > 0, np.clip(x - ms[np.maximum(i - 1, 0)], 0.0, (me - ms)[np.maximum(i - 1, 0)]), 0.0)
        return np.where(i > 0, full + part, 0.0)

    return np.maximum(0.0, covered(end) - covered(start))


class BusyPeriod(NamedTuple):
    """Pieces that overlapped, merged: how many, their bytes, the period's length (µs)."""

    pieces: int
    bytes: int
    group: int
    duration_us: float


def busy_periods(pieces: Iterable[tuple[float, float, int, int]]) -> list[BusyPeriod]:
    """Pieces ``(start, end, bytes, group)`` merged into busy periods, in start order: a
    piece joins the open period when it starts before the period ends and has its
    ``group`` (e.g. the number of ranks of a collective; a constant where any pieces may
    merge). Pieces that run at once share one link, so a period's length is what its
    bytes cost together (the link-cost fits: :mod:`dpro.graph.comm_model`)."""
    out: list[BusyPeriod] = []
    v = sorted(pieces)
    i = 0
    while i < len(v):
        t0, t1, nb, g = v[i]
        m, j = 1, i + 1
        while j < len(v) and v[j][0] < t1 and v[j][3] == g:
            t1 = max(t1, v[j][1])
            nb += v[j][2]
            m, j = m + 1, j + 1
        out.append(BusyPeriod(m, nb, g, t1 - t0))
        i = j
    return out
