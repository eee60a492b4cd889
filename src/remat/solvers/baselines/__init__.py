"""Checkmate's baselines (seeds/001 Table 1) as budgeted solvers: static checkpoint policies
completed with the fewest recomputations (see :mod:`remat.solvers.baselines.policy`)."""

from __future__ import annotations

import time
from typing import Callable

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.result import BudgetResult
from .chen import _chen_greedy, _chen_sqrtn
from .griewank import griewank
from .policy import _context, _evaluate, _result


# -- the baselines --------------------------------------------------------------------------
def checkpoint_all(g: Graph, budget: float | None = None, *,
                   cost_model: CostModel | None = None) -> BudgetResult:
    """Every forward value kept from its computation to its last use: no recomputation."""
    t0 = time.perf_counter()
    cm = cost_model or default_cost_model()
    ctx = _context(g)
    states = [t for t in ctx.fwd_order if ctx.saveable[t]]
    p = _evaluate(g, ctx, states, None, cm, None)
    return _result("checkpoint-all", g, ctx, budget, [p], t0, cm, {})


BASELINES: dict[str, Callable[..., BudgetResult]] = {
    "checkpoint-all": checkpoint_all,
    "chen-sqrtn": _chen_sqrtn("chen-sqrtn", "auto"),
    "chen-sqrtn-ap": _chen_sqrtn("chen-sqrtn-ap", "ap"),
    "chen-sqrtn-linearized": _chen_sqrtn("chen-sqrtn-linearized", "linearized"),
    "chen-greedy": _chen_greedy("chen-greedy", "auto"),
    "chen-greedy-ap": _chen_greedy("chen-greedy-ap", "ap"),
    "chen-greedy-linearized": _chen_greedy("chen-greedy-linearized", "linearized"),
    "griewank": griewank,
}


chen_sqrtn = BASELINES["chen-sqrtn"]


chen_sqrtn_ap = BASELINES["chen-sqrtn-ap"]


chen_sqrtn_linearized = BASELINES["chen-sqrtn-linearized"]


chen_greedy = BASELINES["chen-greedy"]


chen_greedy_ap = BASELINES["chen-greedy-ap"]


chen_greedy_linearized = BASELINES["chen-greedy-linearized"]
