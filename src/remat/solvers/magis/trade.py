"""Recomputations traded for swaps (seeds/004's de-rematerialization beside swapping), a pass
(Schedule -> Schedule): :func:`unrecompute` keeps a value the schedule computes again, and
:func:`trade` swaps out the gap this opens wherever the simulator finds the step faster and
still within the budget (:func:`remat.solvers.magis.swap.offload`)."""

from __future__ import annotations

import time

from ...cost.model import CostModel, default_cost_model
from ...cost.transfer import Link, link_for_graph
from ...plans.schedule import Schedule
from ...plans.simulator import simulate
from ..deadline import Work
from .swap import gaps, offload


def unrecompute(schedule: Schedule, at: int) -> Schedule | None:
    """``schedule`` keeping the value the compute at statement ``at`` computes again instead:
    the free before it and the recomputation go, and so do the recomputations that only fed it
    (computed again, then freed unread). None if ``at`` is not a recomputation, or recomputes
    a value that cannot be saved (a tuple whose items nothing reads: hypothesis found one, and
    the plan's split then refused the schedule)."""
    stmts = list(schedule.statements)
    v = stmts[at].node
    if stmts[at].op != "compute":
        return None
    node = schedule.graph[v]
    if not node.can_save and not node.is_primal:
        return None  # kept from the forward it would cross to the backward, which it cannot
    prev = max((k for k in range(at) if stmts[k].op in ("compute", "reload") and stmts[k].node == v), default=-1)
    if prev < 0 or stmts[prev].op != "compute":
        return None
    free = max((k for k in range(prev, at) if stmts[k].op == "free" and stmts[k].node == v), default=-1)
    if free < 0 or any(stmts[k].node == v and stmts[k].op in ("offload",) for k in range(prev, at)):
        return None
    del stmts[at]
    del stmts[free]
    g = schedule.graph
    ins = g.input_indices
    index = g._index
    changed = True
    while changed:  # recomputations now read by nothing before their free
        changed = False
        seen: set[str] = set()
        for k, st in enumerate(stmts):
            if st.op != "compute":
                continue
            first = st.node not in seen
            seen.add(st.node)
            if first:
                continue
            for f in range(k + 1, len(stmts)):
                s2 = stmts[f]
                if s2.op == "compute" and index[st.node] in ins[index[s2.node]]:
                    break
                if s2.node == st.node and s2.op in ("free", "compute", "offload"):
                    if s2.op == "free":
                        del stmts[f]
                        del stmts[k]
                        changed = True
                    break
            if changed:
                break
    return Schedule(g, stmts, dict(schedule.meta))


def trade(schedule: Schedule, budget: float, cost_model: CostModel | None = None, *,
          link: Link | None = None, time_limit: float | None = None,
          work: Work | None = None) -> Schedule:
    """Recomputations traded for swaps (seeds/004's de-rematerialization beside swapping): each
    recomputation, the costliest first, is dropped (the value kept from its first compute,
    :func:`unrecompute`) and the gap this opens swapped out (:func:`offload`, also hoisted less);
    kept when the simulator finds the step faster and still within ``budget``. ``work``: the
    statements it may simulate in all (:class:`~remat.solvers.deadline.Work`), its
    deterministic stop; ``time_limit`` the safety stop; ``meta["trade_stopped"]`` (and
    ``work.stops["trade"]``) says which stopped it, if one did."""
    g = schedule.graph
    cm = cost_model or default_cost_model(g)
    link = link or link_for_graph(g, cm)
    costs = cm.op_costs(g)
    t0 = time.perf_counter()
    work = work or Work(None)
    cur, sim = schedule, simulate(schedule, cm, link=link)
    work.spend(len(schedule))
    traded = 0
    stopped = None
    tried: set[tuple[str, int]] = set()
    while not stopped:
        seen: dict[str, int] = {}
        again = []
        for k, st in enumerate(cur.statements):
            if st.op == "compute":
                seen[st.node] = seen.get(st.node, 0) + 1
                if seen[st.node] > 1 and (st.node, seen[st.node]) not in tried:
                    again.append((k, seen[st.node]))
        again.sort(key=lambda x: -costs[g.index(cur.statements[x[0]].node)])
        better = None
        for k, nth in again:
            if time_limit is not None and time.perf_counter() - t0 > time_limit:
                stopped = "time"
                break
            if work.exhausted():
                stopped = "work"
                break
            v = cur.statements[k].node
            tried.add((v, nth))
            kept = unrecompute(cur, k)
            if kept is None:
                continue
            cands = [kept] + [offload(kept, gp, link, cm, hide=h) for gp in gaps(kept) if gp.node == v
                              for h in (True, False)]
            for c in cands:
                work.spend(len(c))
                s2 = simulate(c, cm, link=link)
                if s2.valid and s2.peak_bytes <= budget and s2.predicted_seconds < sim.predicted_seconds \
                        and (better is None or s2.predicted_seconds < better[1].predicted_seconds):
                    better = (c, s2)
            if better is not None:
                break
        if better is None:
            break
        cur, sim = better
        traded += 1
    extra = {"trade_stopped": stopped} if stopped else {}
    if stopped:
        work.stops["trade"] = stopped
    if cur is schedule:
        return schedule
    return Schedule(g, cur.statements, {**schedule.meta, "traded": traded, **extra})
