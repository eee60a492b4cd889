"""``solver="swap-recompute"``: what to offload chosen jointly with what to recompute
(seeds/004's swapping beside seeds/000-001's recomputation): the starting plans
(:func:`remat.solvers.portfolio.portfolio`) for a ladder of budgets, each swapped down
(:func:`remat.solvers.magis.swap_solver.swap_down`); the fastest that fits wins."""

from __future__ import annotations

import time

from ...cost.model import CostModel, default_cost_model
from ...cost.transfer import link_for_graph
from ...graph.graph import Graph
from ...plans.budget import reference_schedule
from ...plans.plan import Plan
from ...plans.simulator import simulate
from ..checkmate import checkmate
from ..deadline import Deadline
from ..feasible import staged_schedules_run_as_planned
from ..portfolio import MILP_MAX_NODES, portfolio
from ..progress import report
from .swap_solver import refuse_without_offloading, swap_down


LADDER = (1.0, 1.2, 1.5)
"""Budgets, as multiples of the one asked, that ``swap-recompute`` makes recomputation plans
for before swapping each down: a plan for a larger budget recomputes less."""

PLAN_SHARE = 0.8
"""Of ``swap-recompute``'s time limit, the share its recomputation plans take."""

FIRST_RUNG = 0.5
"""Of that, the share of the plans for the budget asked: the starting plans' (at most half
the plans' time; they stop once a plan fits), then Checkmate's MILP, where it runs, in the
rest. The other budgets share what is left, a third to the starting plans and the rest to
the MILP."""


def swap_recompute(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
                   time_limit: float | None = None, bandwidth: float | None = None) -> Plan:
    """What to offload chosen jointly with what to recompute (seeds/004's swapping beside
    seeds/000-001's recomputation): the starting plans (:func:`remat.solvers.portfolio.portfolio`)
    for a ladder of budgets from the one asked up to the step without recomputation
    (:data:`LADDER`), the least memory recomputation reaches, and no recomputation at all,
    each swapped down to ``budget`` (:func:`remat.solvers.magis.swap_solver.swap_down`); the
    fastest that fits wins, timed by the simulator's two streams (a recomputation costs compute, a swap only what compute waits
    for it). Below the least memory recomputation reaches, swapping that plan's idle values
    goes lower. ``bandwidth``: bytes/s of the host link."""
    refuse_without_offloading(g, "swap-recompute")
    cm = cost_model or default_cost_model(g)
    link = link_for_graph(g, cm, bandwidth=bandwidth)
    clock = Deadline(time_limit)
    t0 = time.perf_counter()
    target = int(budget or 0)
    ref = reference_schedule(g)
    ref_peak = simulate(ref, cm, timeline=False).peak_bytes
    starts = [("torch-mincut", ref)]
    ladder = [f * target for f in LADDER if f * target < ref_peak] if target else []
    plan_time = None if clock.limit is None else clock.limit * PLAN_SHARE
    rungs = ladder + [0]  # 0: the least memory recomputation reaches
    fits = False
    for k, b in enumerate(rungs):
        left = None if plan_time is None else plan_time - clock.elapsed()
        if left is not None and left <= 0 or b == 0 and fits:
            break
        report(f"{g.name}: recomputation plan for {f'{b:,.0f} B' if b else 'the least memory'}")
        # the budget asked for first and longest: its plan is the one to beat
        rung = Deadline(None if left is None else left * (FIRST_RUNG if k == 0 else 1 / (len(rungs) - k)))
        milp = b and len(g) <= MILP_MAX_NODES and staged_schedules_run_as_planned(cm)
        # the starting plans first (they stop early once a plan fits); the MILP gets what is
        # left of the rung
        seconds = None if left is None else (left / 2 if k == 0 else rung.limit / 3)
        made = [portfolio(g, b, cm, seconds)]
        if milp:  # Checkmate's optimum for this budget, in what is left of the rung's time
            made.append(checkmate(g, b, cost_model=cm, explain_infeasible=False, time_limit=rung.left()))
        for p in made:
            if p.statements is not None:
                starts.append((p.solver, p.schedule()))
                fits = fits or p.peak_bytes <= target
    best = swap_down(g, starts, target, cm, link, clock, budget)
    return best.updated(solve_seconds=time.perf_counter() - t0)
