"""Checkmate's baselines (seeds/001 Table 1) as budgeted solvers: static checkpoint policies
completed with the fewest recomputations (see :mod:`remat.solvers.baselines.policy`).

Each is ``fn(graph, budget=None, *, cost_model=None, time_limit=None, **options) -> Plan``;
without a budget the plan is the one of least peak the baseline can build.
"""

from __future__ import annotations

import time
from typing import Callable

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.plan import Plan
from .chen import _chen_greedy, _chen_sqrtn
from .griewank import griewank
from .policy import _context, _evaluate, _result


def checkpoint_all(g: Graph, budget: float | None = None, *, cost_model: CostModel | None = None,
                   time_limit: float | None = None) -> Plan:
    """Every forward value kept from its computation to its last use: no recomputation."""
    t0 = time.perf_counter()
    cm = cost_model or default_cost_model()
    ctx = _context(g)
    states = [t for t in ctx.fwd_order if ctx.saveable[t]]
    p = _evaluate(g, ctx, states, None, cm, None)
    return _result("checkpoint-all", g, ctx, budget, [p], t0, cm, {})


BASELINES: dict[str, Callable[..., Plan]] = {
    "checkpoint-all": checkpoint_all,
    "chen-sqrtn": _chen_sqrtn("chen-sqrtn", "auto"),
    "chen-sqrtn-ap": _chen_sqrtn("chen-sqrtn-ap", "ap"),
    "chen-sqrtn-linearized": _chen_sqrtn("chen-sqrtn-linearized", "linearized"),
    "chen-greedy": _chen_greedy("chen-greedy", "auto"),
    "chen-greedy-ap": _chen_greedy("chen-greedy-ap", "ap"),
    "chen-greedy-linearized": _chen_greedy("chen-greedy-linearized", "linearized"),
    "griewank": griewank,
}
"""Every baseline by name."""

DESCRIPTIONS = {
    "checkpoint-all": "keep every forward value until its last use (no recomputation)",
    "chen-sqrtn": "Chen et al.: every sqrt(n)-th articulation point (or node) is a checkpoint",
    "chen-sqrtn-ap": "chen-sqrtn on the articulation points",
    "chen-sqrtn-linearized": "chen-sqrtn on every forward node in order",
    "chen-greedy": "Chen et al.: greedy segments, searched for the cheapest within the budget",
    "chen-greedy-ap": "chen-greedy on the articulation points",
    "chen-greedy-linearized": "chen-greedy on every forward node in order",
    "griewank": "Griewank & Walther's REVOLVE (binomial checkpointing) on the candidate chain",
}

__all__ = ["BASELINES", "DESCRIPTIONS", "checkpoint_all", "griewank"]
