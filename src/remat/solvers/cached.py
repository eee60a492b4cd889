"""``cached_solve``: :func:`~remat.solvers.registry.solve` through the plan cache across runs
(:class:`remat.plans.cache.PlanCache`, versioned JSON keyed by the graph and the options).

>>> import tempfile
>>> from remat.graph.examples import cos_cos_graph
>>> d = tempfile.mkdtemp()
>>> cached_solve(cos_cos_graph(), "mincut-aggressive", cache=d).cache
'miss'
>>> p = cached_solve(cos_cos_graph(), "mincut-aggressive", cache=d)
>>> p.cache, p.saved_names, p.feasible
('hit', ['add_2'], True)
>>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from ..cost.model import CostModel, default_cost_model
from ..errors import InfeasibleBudgetError
from ..graph.graph import Graph
from ..plans.budget import Budget
from ..plans.cache import PlanCache, Uncacheable, budget_record, cache_key, resolve
from ..plans.outcome import OutOfReach
from ..plans.plan import Plan
from ..transforms.fission import apply_fissions
from .registry import DEFAULT_TIME_LIMIT, as_request, solve
from .request import Request


def cached_solve(graph: Graph, solver: str | Request = "auto", *, budget: Budget | str | float | None = None,
                 cost_model: CostModel | None = None, time_limit: float | None = DEFAULT_TIME_LIMIT,
                 headroom: float = 0.0, cache: "PlanCache | str | os.PathLike | bool | None" = True,
                 on_infeasible: Callable[[InfeasibleBudgetError], Plan] | None = None,
                 **options: Any) -> Plan:
    """:func:`~remat.solvers.registry.solve`, through the cache (:mod:`remat.plans.cache`): a plan stored for the same graph and
    options is loaded and judged by the simulator as a fresh one would be; otherwise the
    solver runs and its plan is stored. ``solver`` may be a
    :class:`~remat.solvers.request.Request` (the settings checked once, upstream) instead of a
    name and settings. ``plan.cache`` says ``"hit"`` or
    ``"miss"`` (``"off"`` without a cache); on a hit ``solve_seconds`` is the time the lookup
    took and ``details["cached_solve_seconds"]`` the original solve's. An infeasible budget
    raises as :func:`~remat.solvers.solve` does and nothing is stored, unless
    ``on_infeasible(error)`` says what runs instead (the least memory, for a fraction that is
    a target): that plan is returned and stored for the budget, with
    ``plan.out_of_reach`` (the error's ``message`` and ``smallest_feasible``), so that the
    next run with the same budget gets it without searching again. ``on_infeasible`` may
    raise (the budget refused). A cache file that cannot be used never raises: it is ignored
    with a :class:`~remat.errors.RematCacheWarning` and replaced."""
    req = as_request(solver, budget=budget, cost_model=cost_model, time_limit=time_limit,
                     headroom=headroom, options=options)
    store = resolve(cache)
    key = record = None
    if store is not None:
        t0 = time.perf_counter()
        cm = req.cost_model_for(graph)
        try:
            key = cache_key(graph, req.solver, budget=req.budget, cost_model=cm, time_limit=req.time_limit,
                            headroom=req.headroom, options=req.options)
        except Uncacheable:
            key = None
        if key is not None:
            record = budget_record(req.budget, graph, req.headroom)
            plan = _hit(graph, req, store, key, cm, t0, record)
            if plan is not None:
                return plan
    reach = None
    try:
        plan = solve(graph, req)
    except InfeasibleBudgetError as e:
        if on_infeasible is None:
            raise
        reach = OutOfReach(str(e), e.smallest_feasible)
        plan = on_infeasible(e)  # raises where the budget is refused
    if key is None:
        return _reached(plan.updated(cache="off", cache_file=None), reach)
    path = None
    if plan.feasible and plan.statements is not None:
        path = store.put(key, plan, graph, planned_for=record,
                         out_of_reach=None if reach is None else reach.to_dict())
    return _reached(plan.updated(cache="miss", cache_file=None if path is None else str(path)), reach)


def _reached(plan: Plan, reach: OutOfReach | None) -> Plan:
    return plan if reach is None else plan.updated(out_of_reach=reach)


def _hit(graph: Graph, req: Request, store: PlanCache, key: str, cm: CostModel, t0: float,
         record: dict | None) -> Plan | None:
    """The plan stored under ``key``, reported as :func:`~remat.solvers.registry.solve` reports
    a fresh one, or None."""
    limit = req.planned_bytes(graph) if req.bounded else None
    plan = store.get(key, graph, budget=limit, cost_model=cm, split=apply_fissions, planned_for=record)
    if plan is None:
        return None
    report: dict = {}
    if req.budget is not None and plan.out_of_reach is None:
        # as solve() reports it; "min" asks for the least peak, which is the plan's
        asked = req.asked_bytes(graph) if req.bounded else plan.peak_bytes
        limit = limit if req.bounded else plan.peak_bytes
        report = {"budget": limit, "options": {"budget": req.budget.text, "budget_bytes": asked,
                                               "planned_bytes": limit}}
    return plan.updated(solve_seconds=time.perf_counter() - t0, **report, cache="hit",
                        cache_file=str(store.path(key)), details={"cached_solve_seconds": plan.solve_seconds})


__all__ = ["cached_solve"]
