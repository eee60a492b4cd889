"""``solver="auto"``: the default policy. Without a budget, the fusion-aware min cut
(conservative), or a plan of the frontier no larger and clearly faster; with one, the fastest plan within it, fusion-aware first; for the least memory,
the least within a bounded slowdown.

With a budget in bytes (or a fraction), ``auto`` takes the best of the starting plans
(:func:`remat.solvers.portfolio.portfolio`: the no-budget plan when it fits, the fusion-aware
frontier, peak descent, the staged baselines and Checkmate's MILP where small, offloading where
copies run beside compute). When none of them fits and the graph has dimensions (what fission
needs), MAGIS's search (:func:`remat.solvers.magis.search.refine`) goes on from that plan.

``budget="min"`` (``budget=0`` here) and ``max_overhead=x`` ask for the same thing: the least
memory within a bounded slowdown, never more memory than the plan without a budget
(:func:`remat.solvers.magis.search.least_within`): the starting plans for the least memory,
the least peak among those predicted within ``(1 + x)`` times the reference step
(:func:`remat.plans.budget.reference_schedule`: what plain ``torch.compile`` runs), then the
search in time mode from it and from the plan without a budget. ``max_overhead`` alone, or
with ``budget="min"``, sets ``x``; ``budget="min"`` alone uses :data:`MIN_OVERHEAD`.

Every stop of these stages that decides the plan counts work, not seconds (the descent's
moves, the staged baselines' grid points, the search's states: sizes derived from the graph's
nodes), so that one graph and one set of options give one plan on an idle machine; the wall
clock (shares of the time limit, :mod:`remat.solvers.deadline`) stays as a safety stop under
load. The stops that still read the clock: the frontier's (a few max-flows: it finishes first
on every graph we have), the re-ordering after the search (:data:`remat.solvers.magis.search.REORDER_SHARE`:
a DP that finishes well within it on the zoo's graphs), offloading's swap pass, and Checkmate's
MILP (byte budgets nothing else fits, under the eager compiler, graphs of at most
:data:`~remat.solvers.portfolio.MILP_MAX_NODES` nodes), which stops at its time limit.

When nothing fits, the plan of least peak is returned (every attempt in
``plan.tried``) and :func:`remat.solvers.solve` raises
:class:`~remat.errors.InfeasibleBudgetError` naming the least peak found.
"""

from __future__ import annotations

from ..cost.model import CostModel, default_cost_model
from ..errors import OptionError
from ..graph.graph import Graph
from ..plans.plan import Plan
from .deadline import Deadline
from ..plans.budget import reference_seconds
from .magis.search import check_overhead, has_dimensions, least_within, refine
from .portfolio import portfolio

AUTO_SEARCH_SHARE = 1 / 6
"""The share of :data:`~remat.solvers.deadline.SCALE` (10 s of 60 s) after which ``auto``'s
search stops under load (its deterministic stop is
:data:`remat.solvers.magis.search.SEARCH_WORK`), within what is left of the time limit."""

MIN_OVERHEAD = 1.0
"""``budget="min"`` without ``max_overhead``: the least memory whose predicted step is at most
``1 + MIN_OVERHEAD`` (2x) the reference step's. Unbounded, ``min`` chose staged schedules
predicted 1.8-3.6x the reference (GPT-2, Llama, T5 quick under the eager compiler) that ran
up to 8x slower than the plan without a budget (T5's ``chen-greedy``: 5.0x and 8.2x in two
runs) and 8-12x slower than plain ``torch.compile`` in a user trial. Bounded, the least memory
stops falling at 1.25x: with ``max_overhead`` 0.05, 0.1, 0.25, 0.5, 1, 2 and 4 the quick
models' eager graphs reached 0.81, 0.76, 0.70, 0.70, 0.70, 0.70, 0.70 of the reference's peak
(GPT-2; Llama 0.78 .. 0.65 from 0.25 on; T5 0.76 .. 0.65 from 0.25 on), and only at 4 (5x) a
staged schedule came in, for 0.1% less (``benchmarks/min_planning.py``). 2x keeps all of that
with room for larger models, and no staged schedule qualifies under it
(:data:`~remat.solvers.portfolio.STAGED_PENALTY`). T5 quick's ``min`` plan then measured 1.13x
the plan without a budget's step (predicted 1.12x) at 0.66 of its peak."""


def min_seconds(g: Graph, cm: CostModel | None = None) -> float:
    """``"min"``'s time bound on ``g``: ``1 + MIN_OVERHEAD`` times the reference step's predicted
    seconds (:func:`~remat.plans.budget.reference_seconds`). Raises where ``g`` has no
    reference partition recorded."""
    return (1 + MIN_OVERHEAD) * reference_seconds(g, cm or default_cost_model(g))


def auto(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
         time_limit: float | None = None, max_overhead: float | None = None,
         fission: bool = True, staged_within: float | None = None, search: bool = True) -> Plan:
    """The conservative min cut without a budget (or a frontier plan no larger and clearly
    faster: :func:`~remat.solvers.portfolio.portfolio`); with one, the fastest plan within it; for
    the least memory (``budget`` 0, what ``"min"`` asks) or with ``max_overhead``, the least
    memory within that overhead (see the module docstring). Each stage is announced to
    :func:`remat.solvers.progress.report`. ``fission=False``: the search splits no sub-graph.
    ``staged_within`` (seconds): under a budget, staged schedules (baselines, MILP) only where
    one could be predicted within it, its time counted
    :data:`~remat.solvers.portfolio.STAGED_PENALTY` times against the fastest plan found (a
    staged schedule is never faster than that). The step planner passes :func:`min_seconds` for
    a fraction, which runs a staged schedule only within ``"min"``'s time bound: where the
    reference step is no slower than recomputing nothing, none can be, and the baselines'
    seconds are spared; where it is much slower (2.3 / 2 times the fastest plan or more), they
    still run.
    ``search=False``: under a budget, no search after the starting plans (the step planner asks
    so for a fraction first, then asks ``"min"`` whether the search could meet it)."""
    least = budget is not None and budget <= 0
    if max_overhead is not None and budget is not None and not least:
        raise OptionError("give a memory budget or max_overhead, not both: max_overhead goes with "
                          "no budget or with budget='min' (the least memory within that overhead)")
    check_overhead(max_overhead)
    cm = cost_model or default_cost_model(g)
    if budget is None and max_overhead is None:
        return portfolio(g, None, cm, time_limit)
    clock = Deadline(time_limit)
    if least or max_overhead is not None:
        overhead = MIN_OVERHEAD if max_overhead is None else float(max_overhead)
        return least_within(g, overhead, cm, clock, fission=fission, share=AUTO_SEARCH_SHARE)
    plan = portfolio(g, budget, cm, time_limit, swapping=True, within=staged_within)
    if plan.feasible or not has_dimensions(g) or not search:
        return plan
    # nothing fits: MAGIS's search from this plan (fission too)
    return refine(g, plan, budget, cm, clock, AUTO_SEARCH_SHARE, fission=fission)
