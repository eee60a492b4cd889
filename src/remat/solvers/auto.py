"""``solver="auto"``: the default policy. Without a budget, the fusion-aware min cut
(conservative); with one, the fastest plan within it, fusion-aware first.

With a budget, ``auto`` takes the best of the starting plans (:func:`remat.solvers.portfolio.portfolio`:
the no-budget plan when it fits, the fusion-aware frontier, peak descent, the staged baselines
and Checkmate's MILP where small, offloading where copies run beside compute). When none of
them fits, or for the least memory (``budget=0``, ``budget="min"``), and the graph has
dimensions (what fission needs), MAGIS's search (:func:`remat.solvers.magis.search.refine`)
goes on from that plan for at most :data:`AUTO_SEARCH_SHARE` of the scale (10 s), within
what is left of the time limit.

When nothing fits, the plan of least peak is returned (every attempt in
``details["tried"]``) and :func:`remat.solvers.solve` raises
:class:`~remat.errors.InfeasibleBudgetError` naming the least peak found.
"""

from __future__ import annotations

from ..cost.model import CostModel, default_cost_model
from ..errors import OptionError
from ..graph.graph import Graph
from ..plans.plan import Plan
from .deadline import Deadline
from .magis.search import has_dimensions, magis, refine
from .mincut import mincut
from .portfolio import portfolio

AUTO_SEARCH_SHARE = 1 / 6
"""The share of :data:`~remat.solvers.deadline.SCALE` (10 s of 60 s) that ``auto`` gives
MAGIS's search when none of its plans fits, or for the least memory; at most what is left of
the time limit."""


def auto(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
         time_limit: float | None = None, max_overhead: float | None = None,
         fission: bool = True) -> Plan:
    """The conservative min cut without a budget; with one, the fastest plan within it (see
    the module docstring). Each stage is announced to :func:`remat.solvers.progress.report`.
    ``max_overhead`` (no budget): the least memory within that share of extra step time, by
    MAGIS's search (:func:`remat.solvers.magis.search.magis`). ``fission=False``: the search
    splits no sub-graph."""
    if max_overhead is not None:
        if budget is not None:
            raise OptionError("give a memory budget or max_overhead, not both")
        return magis(g, cost_model=cost_model, time_limit=time_limit, max_overhead=max_overhead,
                     fission=fission)
    if budget is None:
        return mincut(g, "conservative")
    clock = Deadline(time_limit)
    plan = portfolio(g, budget, cost_model, time_limit, swapping=True)
    if (plan.feasible and budget > 0) or not has_dimensions(g):
        return plan
    # nothing fits, or the least memory is asked: MAGIS's search from this plan (fission too)
    return refine(g, plan, budget, cost_model or default_cost_model(g), clock, AUTO_SEARCH_SHARE,
                  fission=fission)
