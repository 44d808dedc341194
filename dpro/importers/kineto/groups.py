"""Process groups of gloo collectives in a torch.profiler trace of a CPU job.

A gloo trace says neither the group nor the sequence number of a collective: the issue
(``c10d::allreduce_``) carries only its tensor, and the execution (``gloo:all_reduce``)
runs on a worker thread of the group's ``ProcessGroupGloo``. Each group has its own pool
of worker threads (two by default), created with the group, so on one rank the thread
that ran a collective tells its group, and the pools' thread ids follow the order in
which the groups were created. ``distributedInfo.pg_config`` lists the rank's groups in
that order (``pg_name`` counts up on every rank alike), with their ranks. So the pools,
in thread-id order, are the rank's groups of two or more ranks, in ``pg_name`` order;
where there is one pool fewer than groups, the default group (``default_pg``) is the one
without collectives in the trace (the usual case when a job's collectives all run in
subgroups). Anything else is ambiguous: the collectives keep the whole world as their
group, with a note. A wrong mapping cannot pair collectives silently: the cross-rank join
expands a collective only where every rank of its group has it (docs/kineto.md).
"""

from __future__ import annotations

from dpro.importers.kineto.segments import Seg

#: worker threads of one ProcessGroupGloo (``ProcessGroupGloo.Options.threads``' default)
GLOO_THREADS = 2


def _pools(tids: list[int]) -> list[list[int]]:
    """Worker thread ids grouped into pools: consecutive ids, at most GLOO_THREADS each."""
    pools: list[list[int]] = []
    for t in sorted(tids):
        if pools and t - pools[-1][-1] == 1 and len(pools[-1]) < GLOO_THREADS:
            pools[-1].append(t)
        else:
            pools.append([t])
    return pools


def _rank_groups(dist_info: object) -> list[tuple[str, tuple[int, ...], bool]]:
    """(pg_name, ranks, is the default group) of each of the rank's groups of two or more
    ranks, in creation order; [] where ``distributedInfo`` does not list them."""
    cfg = dist_info.get("pg_config") if isinstance(dist_info, dict) else None
    out = []
    for g in cfg if isinstance(cfg, list) else []:
        if not isinstance(g, dict):
            return []
        name, ranks = g.get("pg_name"), g.get("ranks")
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            return []
        try:
            key = int(str(name))
        except ValueError:
            return []
        if len(ranks) > 1:
            out.append((key, str(name), tuple(ranks), g.get("pg_desc") == "default_pg"))
    return [(n, r, d) for _, n, r, d in sorted(out)]


def assign_gloo_groups(comm: list[Seg], main_tid: object, dist_info: object, fname: str, notes: list[str]) -> None:
    """Set ``group`` and ``pg`` of the gloo collectives in ``comm`` that ran on worker
    threads (not on ``main_tid``, where point-to-point transfers run), see the module doc."""
    workers = [c for c in comm if c.thread != main_tid and c.p2p is None]
    tids = sorted({c.thread for c in workers})
    if not tids:
        return
    groups = _rank_groups(dist_info)
    if not groups or not all(isinstance(t, int) for t in tids):
        return
    pools = _pools(tids)  # type: ignore[arg-type]
    if len(pools) == 1 and len(groups) == 1:
        chosen = groups
    elif len(pools) == len(groups):
        chosen = groups
    elif len(pools) == len(groups) - 1 and sum(d for _, _, d in groups) == 1:
        chosen = [g for g in groups if not g[2]]
    else:
        if len(groups) > 1:
            notes.append(f"{fname}: gloo collectives ran on {len(pools)} thread pools for {len(groups)} process "
                         f"groups; their groups are unknown (the whole world is assumed)")
        return
    if len(chosen) == 1 and chosen[0][2]:
        return  # the default group: the whole world, as without a group
    of: dict[object, tuple[str, tuple[int, ...]]] = {}
    for pool, (name, ranks, _) in zip(pools, chosen):
        for t in pool:
            of[t] = (name, ranks)
    for c in workers:
        c.pg, c.group = of[c.thread]
    if len(chosen) > 1:
        notes.append(f"{fname}: gloo collectives of {len(chosen)} process groups, told apart by their worker "
                     f"threads: " + ", ".join(f"threads {p} = group {n} {list(r)}" for p, (n, r, _) in zip(pools, chosen)))
