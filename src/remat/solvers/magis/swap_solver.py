"""The swap solver (seeds/004): offload values to host memory, alone or after recomputation.

- ``swap``: the step without recomputation (:func:`~remat.plans.budget.reference_schedule`),
  its hot spots swapped out until it fits the budget (:func:`remat.solvers.magis.swap.swap`);
- :func:`swap_down`: any schedules swapped down to a budget, the fastest that fits winning:
  ``swap-recompute`` (:mod:`remat.solvers.magis.swap_recompute`) swaps down recomputation
  plans made for several budgets, and the starting plans (:mod:`remat.solvers.portfolio`)
  their fastest and smallest where copies run beside compute.

``reorder`` re-orders the step without recomputation for a lower peak
(:func:`remat.transforms.reorder.reorder`). The swapping solvers take ``bandwidth=`` (bytes/s of the host link; :func:`remat.cost.transfer.link_for_graph`
by default).
"""

from __future__ import annotations

import time

from ...cost.model import CostModel, default_cost_model
from ...cost.transfer import Link, link_for_graph, offload_allowed
from ...errors import RematError
from ...graph.graph import Graph
from ...plans.budget import reference_schedule
from ...plans.plan import Plan
from ...plans.schedule import Schedule
from ...plans.simulator import simulate
from ...transforms.reorder import reorder
from ..deadline import Deadline, Work
from ..progress import report
from .swap import swap as swap_pass
from .trade import trade


def refuse_without_offloading(g: Graph, solver: str) -> None:
    """Raise :class:`~remat.errors.RematError` when plans of ``g`` may not offload
    (:func:`remat.cost.transfer.offload_allowed`): ``solver`` offloads by design."""
    allowed, why = offload_allowed(g)
    if not allowed:
        raise RematError(f"solver {solver!r} offloads, and plans of {g.name!r} may not: {why}")


def swap_only(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
              time_limit: float | None = None, bandwidth: float | None = None) -> Plan:
    """The step without recomputation, swapped down to ``budget`` (0: as low as it goes)."""
    refuse_without_offloading(g, "swap")
    cm = cost_model or default_cost_model(g)
    link = link_for_graph(g, cm, bandwidth=bandwidth)
    t0 = time.perf_counter()
    out = swap_pass(reference_schedule(g), budget or 0, cm, link=link, time_limit=time_limit)
    return _plan(out, "swap", budget, cm, link, t0)


def reorder_only(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
                 time_limit: float | None = None) -> Plan:
    """The step without recomputation, re-ordered for a lower peak (seeds/004 Section 6.1):
    no work added, none removed."""
    cm = cost_model or default_cost_model(g)
    t0 = time.perf_counter()
    s = reorder(reference_schedule(g), cm, time_limit=time_limit)
    p = Plan.from_schedule(s, solver="reorder", details={k: s.meta[k] for k in ("peak_before", "peak_after")
                                                          if k in s.meta})
    p = p.judge(budget if budget else None, cm)
    return p.updated(solve_seconds=time.perf_counter() - t0)


def swap_down(g: Graph, starts: list[tuple[str, Schedule]], target: int, cm: CostModel, link: Link,
              clock: Deadline, budget: float | None, work: Work | None = None) -> Plan:
    """Each schedule of ``starts`` (``(solver, schedule)``) re-ordered where over ``target``
    bytes (:func:`remat.transforms.reorder.reorder`: a lower peak at no cost), swapped down to
    it (:func:`remat.solvers.magis.swap.swap`), then, where it fits, its recomputations traded for
    swaps while that is faster (:func:`remat.solvers.magis.trade.trade`); the fastest that fits,
    or the smallest where none does. ``work`` (:class:`~remat.solvers.deadline.Work`, in
    simulated statements) is shared by the starts, as ``clock`` is: the work is the stop that
    decides the plan, the clock the safety stop under load; each plan's
    ``details["offload_work"]`` reports both."""
    t0 = time.perf_counter()
    work = work or Work(None)
    best: Plan | None = None
    for k, (name, s) in enumerate(starts):
        left = clock.left()
        if left is not None and left <= 0 and best is not None:
            break
        report(f"{g.name}: swapping {name}'s plan down")
        share = Deadline(None if left is None else left / (len(starts) - k))
        part = Work(None if work.left() is None else work.left() // (len(starts) - k))
        part.spend(len(s))
        if simulate(s, cm, link=link, timeline=False).peak_bytes > target:  # re-ordering first: it costs no time
            part.spend(2 * len(s))  # its simulations before and after
            s = reorder(s, cm, time_limit=None if share.limit is None else share.limit / 4)
        out = swap_pass(s, target, cm, link=link, time_limit=share.left(), work=part)
        part.spend(len(out))
        if target and simulate(out, cm, link=link, timeline=False).peak_bytes <= target:
            out = trade(out, target, cm, link=link, time_limit=share.left(), work=part)
        work.spend(part.done)
        work.stops.update({f"{name} {stage}": why for stage, why in part.stops.items()})
        p = _plan(out, "swap-recompute", budget, cm, link, t0)
        p = p.updated(details={"recomputation_from": name, "offload_work": {
            "limit": work.limit, "done": work.done, "stops": dict(work.stops)}})
        if best is None or _better(p, best, target):
            best = p
    return best


def _better(p: Plan, q: Plan, target: int) -> bool:
    """Fits before does not; then faster (or, where neither fits, smaller)."""
    fp, fq = p.peak_bytes <= target, q.peak_bytes <= target
    if fp != fq:
        return fp
    if fp:
        return (p.predicted_seconds, p.peak_bytes) < (q.predicted_seconds, q.peak_bytes)
    return (p.peak_bytes, p.predicted_seconds) < (q.peak_bytes, q.predicted_seconds)


def _plan(s: Schedule, solver: str, budget, cm: CostModel, link, t0: float) -> Plan:
    p = Plan.from_schedule(s, solver=solver, swaps=s.meta.get("swaps", 0) + s.meta.get("traded", 0), link=link,
                           details={"recomputations_traded": s.meta.get("traded", 0)})
    p = p.judge(budget if budget else None, cm, sim=simulate(s, cm, link=link))
    return p.updated(solve_seconds=time.perf_counter() - t0)
