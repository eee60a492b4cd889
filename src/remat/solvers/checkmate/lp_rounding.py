"""Checkmate's approximation: LP relaxation and two-phase rounding (seeds/001 Section 5).

:func:`checkmate_lp` relaxes problem 9 (:mod:`remat.solvers.checkmate.model`; ``R``, ``S``,
``FREE`` in ``[0, 1]``) and solves the LP with a reduced budget ``(1 - epsilon) * budget``
(Section 5.3: rounding makes no attempt to keep the budget, so the LP leaves an allowance).
Each fractional checkpoint matrix ``S*`` is rounded deterministically,
``S_int = [S* > threshold]`` (Algorithm 2 uses 0.5), and the computations are completed with
the fewest recomputations (:func:`remat.plans.stages.solve_r`, Algorithm 2's second phase).
Every candidate (one per epsilon and threshold, duplicates skipped) is emitted with
Algorithm 1 and replayed by the simulator; the cheapest within the real budget wins. The LP
optimum at ``epsilon = 0`` is a lower bound on the MILP's optimal cost (Section 5.1).

The LP is solved once per epsilon on the same HiGHS instance (only the ``U`` bounds change),
so each solve after the first starts from the previous basis. ``free_form`` is the FREE
linearization relaxed (:mod:`remat.solvers.checkmate.model`): the default ``"tight"`` relaxation
is tighter than the paper's (``"paper"``) and solves faster. When no candidate of the
epsilon grid fits, ``refine`` tries LP budgets spread down to the memory lower bound (the
paper suggests searching epsilon over [0, 1]).
"""

from __future__ import annotations

import time

import numpy as np

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.schedule import Schedule
from ...plans.simulator import simulate
from ...plans.plan import Plan, judged
from ..deadline import Deadline
from .bounds import early_result
from .model import build_model
from .highs import new_highs, run_highs
from ...plans.stages import schedule_from_rs, solve_r, staged

NAME = "checkmate-lp"
DEFAULT_THRESHOLDS = (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.1, 0.9)
DEFAULT_EPSILONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
REFINE_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)
"""With ``refine``, when no candidate of the grid fits: further epsilons at these fractions of
the largest useful one, ``1 - memory_lower_bound / budget`` (a smaller LP budget is hopeless)."""


def checkmate_lp(g: Graph, budget: float, *, time_limit: float | None = None,
                 cost_model: CostModel | None = None,
                 thresholds=DEFAULT_THRESHOLDS, epsilons=DEFAULT_EPSILONS,
                 threads: int | None = None, verbose: bool = False,
                 free_form: str = "tight", refine: bool = True,
                 max_columns: int | None = None) -> Plan:
    """Two-phase LP rounding at ``budget`` bytes, swept over ``thresholds`` x ``epsilons``.

    Returns the cheapest simulated-feasible candidate (status ``"feasible"``) with the LP lower
    bound; ``"infeasible"`` when the relaxation itself is infeasible (then no schedule fits);
    ``"no_solution"`` when no candidate fits the budget; ``"time_limit"`` when the limit
    stopped the sweep before any candidate fitted; ``"too_large"`` when the model would
    exceed ``max_columns`` (see :func:`~remat.solvers.checkmate.checkmate`).
    """
    clock = Deadline(time_limit)
    cm = cost_model or default_cost_model()
    budget = float(budget)
    details: dict = {}
    elapsed, out_of_time = clock.elapsed, clock.expired

    early = early_result(NAME, g, budget, cm, details, clock.start, max_columns)
    if early is not None:
        return early
    lb_bytes = details["memory_lower_bound"]
    st = staged(g)
    if st.n == 0:
        return judged(NAME, g, budget, Schedule(g, [], {"solver": NAME}), solve_seconds=elapsed(),
                      status="feasible", cost_model=cm, lower_bound=0.0, details=details)

    tb = time.perf_counter()
    model = build_model(g, budget, cm, objective="cost", free_form=free_form)
    h = new_highs(model, relax=True, threads=threads, verbose=verbose)
    details.update(model=model.stats, build_seconds=round(time.perf_counter() - tb, 3))

    state = {"lp_bound": None, "tried": 0, "unique": 0, "best": None, "closest": None}
    lps: list[dict] = []
    seen: set[bytes] = set()

    def sweep(eps: float) -> str | None:
        """Solve the LP at ``(1 - eps) * budget`` and judge its roundings; returns "stop"
        (time limit), "infeasible" (the relaxation at the full budget) or None."""
        if out_of_time():
            return "stop"
        limit = (1.0 - eps) * budget
        rec: dict = {"epsilon": eps, "lp_budget": int(limit) if np.isfinite(limit) else limit}
        lps.append(rec)
        if limit < lb_bytes:
            rec["status"] = "skipped (below the memory lower bound)"
            return None
        model.set_budget_bounds(h, limit)
        remaining = clock.left()
        out = run_highs(h, time_limit=remaining, mip=False)
        rec.update(status=out.status, seconds=round(out.seconds, 3))
        if out.status != "optimal":
            if out.status == "infeasible" and eps == 0.0:
                return "infeasible"
            return "stop" if out.status == "time_limit" else None
        obj = model.objective_bytes_or_cost(out.objective)
        rec["lp_cost"] = obj
        if eps == 0.0:
            state["lp_bound"] = obj
        _, S_star = model.split(out.x)
        for thr in thresholds:
            if out_of_time():
                return "stop"
            state["tried"] += 1
            S_int = np.tril(S_star > thr, -1)
            key = np.packbits(S_int).tobytes()
            if key in seen:
                continue
            seen.add(key)
            state["unique"] += 1
            R_int = solve_r(st, S_int)
            sched = schedule_from_rs(st, R_int, S_int, {"solver": NAME, "threshold": thr,
                                                        "epsilon": eps})
            sim = simulate(sched, cm, timeline=False)
            if not sim.valid:  # cannot happen: solve_r completes any S
                continue
            closest, best = state["closest"], state["best"]
            if closest is None or sim.peak_bytes < closest[0]:
                state["closest"] = (sim.peak_bytes, thr, eps)
            if sim.peak_bytes <= budget and (best is None or sim.compute_cost < best[0] - 1e-12):
                state["best"] = (sim.compute_cost, sim.peak_bytes, thr, eps, sched, sim)
                state["S"] = S_int
        return None

    grid = sorted(set(float(e) for e in epsilons))
    stopped = refined = False
    for eps in grid:
        outcome = sweep(eps)
        if outcome == "infeasible":
            return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="infeasible",
                          cost_model=cm, details={**details, "lps": lps}, message=(
                              f"infeasible budget: the LP relaxation has no solution within "
                              f"{int(budget)} bytes, so no frontier-advancing schedule fits"))
        if outcome == "stop":
            stopped = True
            break
    if refine and not stopped and state["best"] is None:
        # nothing in the grid fits: try LP budgets spread over the useful range
        eps_max = 1.0 - lb_bytes / budget
        extra = [eps_max * f for f in REFINE_FRACTIONS]
        extra = [e for e in extra if all(abs(e - x) > 1e-9 for x in grid)]
        refined = bool(extra)
        for eps in extra:
            if sweep(eps) == "stop":
                stopped = True
                break
    lp_bound, tried, unique = state["lp_bound"], state["tried"], state["unique"]
    best, closest = state["best"], state["closest"]

    details.update(lp_bound=lp_bound, lps=lps, candidates=tried, unique_candidates=unique,
                   refined=refined, stopped_by_time_limit=stopped)
    if best is None:
        msg = "no rounding of the LP relaxation fits the budget"
        if closest is not None:
            msg += (f" (the lowest candidate peaks at {closest[0]} bytes, threshold "
                    f"{closest[1]}, epsilon {closest[2]})")
        status = "time_limit" if stopped else "no_solution"
        if stopped:
            msg += "; the time limit stopped the sweep"
        return judged(NAME, g, budget, None, solve_seconds=elapsed(), status=status,
                      cost_model=cm, lower_bound=lp_bound, details=details, message=msg)
    _, _, thr, eps, sched, sim = best
    details.update(threshold=thr, epsilon=eps)
    res = judged(NAME, g, budget, sched, solve_seconds=elapsed(), status="feasible",
                 cost_model=cm, lower_bound=lp_bound, details=details, sim=sim, S=state["S"])
    return res
