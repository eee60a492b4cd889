"""``solver="auto"``: the default. Without a budget, the fusion-aware min cut (conservative);
with one, every solver that can plan within it, and the cheapest plan that fits.

Checkmate's MILP for its time limit, the classic baselines and the min cuts each propose a
schedule; the simulator judges each against the budget; the plan of least additive compute
cost (then least peak) wins. When none fits, the plan returned is the one of least peak,
with every attempt in ``details["tried"]``, and :func:`remat.solvers.solve` raises
:class:`~remat.errors.InfeasibleBudgetError` with the smallest feasible budget found.
"""

from __future__ import annotations

import time

from ..cost.model import CostModel, default_cost_model
from ..errors import RematError
from ..graph.graph import Graph
from ..plans.plan import Plan
from .baselines import BASELINES
from .checkmate import checkmate
from .mincut import mincut

AUTO_BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "chen-sqrtn-linearized",
                  "chen-greedy-linearized", "griewank")
"""The baselines ``auto`` tries beside the MILP (in case it finds nothing in its time limit):
the chain policies on the articulation points (``chen-*``, when the graph has any) and on the
whole forward order (``-linearized``: on GPT-2 small only these fit 0.6 of the peak)."""

MINCUT_MODES = ("conservative", "aggressive")


def auto(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
         time_limit: float | None = None) -> Plan:
    """The conservative min cut without a budget; with one, the cheapest plan within it of
    Checkmate's MILP (``time_limit`` seconds), :data:`AUTO_BASELINES` and both min cuts."""
    if budget is None:
        return mincut(g, "conservative")
    t0 = time.perf_counter()
    cm = cost_model or default_cost_model()
    plans = [checkmate(g, budget, time_limit=time_limit, cost_model=cm)]
    plans += [BASELINES[name](g, budget, cost_model=cm) for name in AUTO_BASELINES]
    for mode in MINCUT_MODES:
        try:
            plans.append(mincut(g, mode).judge(budget, cm))
        except RematError as e:  # a graph the min cut cannot plan
            plans.append(Plan.without_schedule(g, solver=f"mincut-{mode}", status="unsupported",
                                               message=str(e)))
    tried = [{"solver": p.solver, "status": p.status, "peak_bytes": p.peak_bytes,
              "compute_cost": p.compute_cost, "message": p.message} for p in plans]
    fits = [p for p in plans if p.feasible]
    if fits:
        best = min(fits, key=lambda p: (p.compute_cost, p.peak_bytes))
    else:
        valid = [p for p in plans if p.peak_bytes is not None and p.status != "invalid"]
        best = min(valid, key=lambda p: p.peak_bytes) if valid else plans[0]
    best.details["tried"] = tried
    best.solve_seconds = time.perf_counter() - t0
    return best
