"""Swapping as a pass (Schedule -> Schedule): offload the values alive at the peak and idle
around it to host memory, and reload them before their next use (seeds/004 Sections 5.2 and
6.2, heuristic H2).

A value's residency (from its compute or reload to its free) has *gaps*: stretches between two
consecutive reads (the first starting at its compute) in which no statement reads it.
:func:`offload` swaps one gap out: ``offload v`` right after the value is computed (as early
as possible: the copy waits only for its producer), ``free v`` after the read that opens the
gap, ``reload v`` before the read that closes it, as late as the transfer can still be hidden
behind the computes before that read (their additive costs summed back from the read until
they cover the copy's time). A value with a host copy already is not copied out again: each
later gap frees and reloads it.

:func:`swap` repeats this on the *hot spots* of the simulated peak (MAGIS's H2: values
resident at the peak statement, not read by it, with a read after it), the one idle longest
around the peak first (MAGIS's ``min(next use - peak, peak - last use)``), keeping a swap only
when the simulator finds the peak lower (or as high, at fewer statements), until the peak is
within the budget or no hot spot helps. The simulator is the judge: a swap that raises the
step's time is still taken if it lowers the peak, since the budget comes first; the solvers
(:mod:`remat.solvers.magis.swap_solver`) weigh time against recomputation, and
:func:`remat.solvers.magis.trade.trade` trades recomputations for swaps.

>>> from remat.cost.transfer import Link
>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.schedule import schedule_from_saved_set
>>> from remat.plans.simulator import simulate
>>> s = schedule_from_saved_set(cos_cos_graph(), ["add_2", "cos"])
>>> out = swap(s, budget=0, link=Link(float("inf")))  # copies that take no time
>>> out.offloaded, simulate(s).peak_bytes, simulate(out, link=Link(float("inf"))).peak_bytes
(['add_2'], 36864, 32768)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...cost.model import CostModel, default_cost_model, storage
from ...cost.transfer import Link, link_for_graph
from ...graph.graph import Graph
from ...plans.schedule import Schedule, Statement, kept_to_end
from ...plans.simulator import SimResult, simulate
from ..deadline import Work

TRIES = 8
"""Hot spots tried at each peak before :func:`swap` gives up on it."""

MAX_SWAPS = 400
"""At most this many gaps swapped out by one :func:`swap`."""


@dataclass(frozen=True)
class Gap:
    """Statements ``after`` < k < ``before`` in which no statement reads ``node``, resident
    throughout: ``after`` is its compute (or reload) or a read, ``before`` the next read;
    ``start`` is where this residency began."""

    node: str
    start: int
    after: int
    before: int


def gaps(schedule: Schedule) -> list[Gap]:
    """Every gap of every value the schedule may swap: not an input, a parameter, a tangent
    (autograd hands it to the backward), a view or a value kept to the end (an output, a
    gradient)."""
    g = schedule.graph
    index = g._index
    ins = g.input_indices
    owner = storage(g)[0]
    keep = kept_to_end(g).tolist()
    primal = [p or n.role == "tangent" for p, n in zip(g._arrays.primal.tolist(), g.nodes)]
    start: dict[int, int] = {}  # resident value -> statement that made it resident
    last: dict[int, int] = {}  # resident value -> its latest read (or start)
    out: list[Gap] = []
    names = g._arrays.names
    for k, st in enumerate(schedule.statements):
        i = index[st.node]
        if st.op == "compute":
            for j in set(ins[i]):
                if j in last:
                    if k > last[j] + 1:
                        out.append(Gap(names[j], start[j], last[j], k))
                    last[j] = k
        if st.op in ("compute", "reload"):
            if not primal[i] and not keep[i] and owner[i] == i:
                start[i] = last[i] = k
        elif st.op == "free":
            start.pop(i, None)
            last.pop(i, None)
    return out


def offload(schedule: Schedule, gap: Gap, link: Link, cost_model: CostModel | None = None, *,
            hide: bool = True) -> Schedule:
    """``schedule`` with ``gap`` swapped out (see the module docstring); ``hide=False`` reloads
    right before the read instead (a long copy hoisted to hide it can raise the peak)."""
    g = schedule.graph
    cm = cost_model or default_cost_model(g)
    stmts = list(schedule.statements)
    v = gap.node
    copied = any(s.op == "offload" and s.node == v for s in stmts[:gap.after + 1]) or \
        stmts[gap.start].op == "reload"
    size = storage(g)[1][g.index(v)]
    need = link.seconds(size)
    costs = cm.op_costs(g)
    at, covered = gap.before, 0.0
    while hide and at > gap.after + 1 and covered < need:
        at -= 1
        if stmts[at].op == "compute":
            covered += costs[g.index(stmts[at].node)]
    stmts.insert(at, Statement("reload", v))
    stmts.insert(gap.after + 1, Statement("free", v))
    if not copied:
        stmts.insert(gap.start + 1, Statement("offload", v))
    return Schedule(g, stmts, dict(schedule.meta))


def hot_spots(schedule: Schedule, sim: SimResult) -> list[Gap]:
    """The gaps open at the peak statement, the longest idle around it first (then larger)."""
    k = sim.peak_statement
    if k < 0:
        return []
    g = schedule.graph
    sizes = storage(g)[1]
    times = sim.times
    at = times[k][1] if times else float(k)

    def t(j: int) -> float:
        return times[j][1] if times else float(j)

    open_ = [gp for gp in gaps(schedule) if gp.after < k < gp.before]
    return sorted(open_, key=lambda gp: (-min(t(gp.before) - at, at - t(gp.after)),
                                         -sizes[g.index(gp.node)], gp.node))


def _rank(sim: SimResult) -> tuple[int, int]:
    return sim.peak_bytes, sum(1 for m in sim.timeline if m >= sim.peak_bytes)


def swap(schedule: Schedule, budget: float | None = 0, cost_model: CostModel | None = None, *,
         link: Link | None = None, time_limit: float | None = None,
         max_swaps: int = MAX_SWAPS, work: Work | None = None) -> Schedule:
    """``schedule`` with hot spots swapped out until its simulated peak is within ``budget``
    bytes (0 or None: as low as swapping takes it). Returns the schedule unchanged when no
    swap lowers its peak; ``meta["swaps"]`` counts the gaps swapped out. ``work``: the
    statements it may simulate in all (:class:`~remat.solvers.deadline.Work`, spent as it
    goes), its deterministic stop; ``time_limit`` the safety stop. Where either stopped it,
    ``meta["swap_stopped"]`` (and ``work.stops["swap"]``) says which (``"work"``, ``"time"``)."""
    g: Graph = schedule.graph
    cm = cost_model or default_cost_model(g)
    link = link or link_for_graph(g, cm)
    target = budget or 0
    t0 = time.perf_counter()
    work = work or Work(None)
    cur, sim = schedule, simulate(schedule, cm, link=link)
    work.spend(len(schedule))
    if not sim.valid:
        return schedule
    done = 0
    stopped = None
    while sim.peak_bytes > target and done < max_swaps:
        if time_limit is not None and time.perf_counter() - t0 > time_limit:
            stopped = "time"
            break
        for gap in hot_spots(cur, sim)[:TRIES]:
            if not work.affords(2 * (len(cur) + 3)):
                stopped = "work"
                break
            work.spend(2 * (len(cur) + 3))
            tried = [(c, simulate(c, cm, link=link)) for c in
                     (offload(cur, gap, link, cm), offload(cur, gap, link, cm, hide=False))]
            tried = [(c, s2) for c, s2 in tried if s2.valid and _rank(s2) < _rank(sim)]
            if tried:
                cur, sim = min(tried, key=lambda t: (t[1].predicted_seconds, _rank(t[1])))
                done += 1
                break
        else:
            break
        if stopped:
            break
    if stopped:
        work.stops["swap"] = stopped
    if cur is schedule:
        return schedule
    return Schedule(g, cur.statements, {**schedule.meta, "swaps": done,
                                        **({"swap_stopped": stopped} if stopped else {})})
