"""Checkmate's optimal rematerialization MILP (seeds/001 Section 4), solved with HiGHS.

:func:`checkmate` builds problem 9 over the staged problem (:mod:`remat.solvers.checkmate.model`),
solves it, rounds the solution's ``R`` and ``S`` (entries above 0.5), emits the schedule with
Algorithm 1 (:func:`remat.plans.stages.schedule_from_rs`) and lets the simulator judge it
(:func:`remat.plans.plan.judged`). Memory is the simulator's: the constant overhead is the
bytes of the inputs and parameters, ``M_i`` the effective bytes of each value, and a view
(which shares its base's storage) keeps the base resident in the model while it lives.

Optimality is relative to Checkmate's search space: frontier-advancing schedules in graph
order, one computation of each node per stage, emitted by Algorithm 1.

:func:`min_budget` finds the smallest feasible budget by minimizing the peak over the same
constraints (a MILP with a peak variable bounding every ``U``); with a time limit it returns
the best schedule found and the proven lower bound. :func:`memory_lower_bound` is a cheap
bound that rejects hopeless budgets before any solver runs, and
:func:`~remat.solvers.checkmate.bounds.checkpoint_all` the schedule that never recomputes (the top of the useful budget range).

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.solvers.checkmate.bounds import checkpoint_all_peak
>>> g = cos_cos_graph()
>>> r = checkmate(g, checkpoint_all_peak(g))
>>> r.status, r.feasible, r.sim.recomputes
('optimal', True, 0)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.plan import Plan, judged
from ...plans.schedule import Schedule
from ...plans.simulator import SimResult, simulate
from ...plans.stages import schedule_from_rs, solve_r, staged
from ..baselines import BASELINES
from ..deadline import Deadline
from ..feasible import smallest_feasible
from .bounds import checkpoint_all_matrix, early_result, memory_lower_bound
from .highs import new_highs, run_highs, setup_seconds
from .lp_rounding import checkmate_lp
from .model import CheckmateModel, build_model, too_large

NAME = "checkmate"
EXPLAIN_SECONDS = 30.0
"""Time spent, at most, finding the smallest feasible budget to explain an infeasible one."""


# ---- cheap bounds and the no-recomputation schedule ------------------------------------------


# ---- emission --------------------------------------------------------------------------------

def _emit(model: CheckmateModel, x: np.ndarray,
          meta: dict) -> tuple[Schedule, np.ndarray, np.ndarray]:
    R, S = model.split(x)
    Rb, Sb = R > 0.5, S > 0.5
    return schedule_from_rs(model.st, Rb, Sb, meta), Rb, Sb


def _judge_solution(model: CheckmateModel, x: np.ndarray, budget: float, cm: CostModel,
                    **kw) -> tuple[Plan, str]:
    """Emit and judge the rounded solution. ``R`` is also re-derived from the rounded ``S``
    with :func:`solve_r` (a subset of any correct ``R``: never more cost nor memory); that
    schedule is used when the simulator rejects the first (rounding noise) or when it drops
    spurious recomputations (the MILP may recompute zero-cost nodes such as tangents)."""
    g = model.st.graph
    sched, Rb, Sb = _emit(model, x, {"solver": NAME})
    res = judged(NAME, g, budget, sched, cost_model=cm, S=Sb, **kw)
    R2 = solve_r(model.st, Sb)
    if (R2 == Rb).all():
        return res, ("milp" if res.feasible else "rejected")
    res2 = judged(NAME, g, budget, schedule_from_rs(model.st, R2, Sb, {"solver": NAME}),
                  cost_model=cm, S=Sb, **kw)
    if res2.feasible and (not res.feasible or (res2.cost, res2.sim.recomputes)
                          <= (res.cost, res.sim.recomputes)):
        return res2, "solve_r"
    return res, ("milp" if res.feasible else "rejected")


# ---- the MILP --------------------------------------------------------------------------------

def strided_matrix(g: Graph, stride: int) -> np.ndarray:
    """A cheap checkpoint policy (Chen et al.'s, on the graph linearized in topological order):
    every ``stride``-th forward value and every backward value is held until its last user's
    stage, the other forward values only until their last forward user; the backward
    recomputes them from the held ones (through :func:`solve_r`)."""
    st = staged(g)
    n = st.n
    S = checkpoint_all_matrix(g)
    fwd = [i for i in range(n) if st.forward_phase[i] and not st.kept[i]]
    for p, i in enumerate(fwd):
        if stride > 1 and p % stride != stride - 1:
            fw_users = [j for j in st.users[i] if st.forward_phase[j]]
            last = max(fw_users, default=i)
            S[last + 1:, i] = False
    return S


WARM_STRIDES = (2, 3, 4, 6, 8, 12, 16, 24, 32)


WARM_BASELINES = ("chen-greedy", "chen-greedy-ap", "chen-greedy-linearized", "griewank")
"""Baselines whose best schedule within the budget is offered to HiGHS as a start, so the
MILP's incumbent is never costlier than theirs."""


def baseline_matrices(g: Graph, budget: float, cost_model: CostModel | None = None,
                      names=WARM_BASELINES, time_limit: float | None = None) -> list[tuple[str, np.ndarray]]:
    """The checkpoint matrices of the cheapest schedule of each baseline in ``names`` that
    fits ``budget`` in the simulator (baselines with none are left out); ``time_limit``
    seconds for all of them."""
    out = []
    clock = Deadline(time_limit)
    for name in names:
        r = BASELINES[name](g, budget, cost_model=cost_model, time_limit=clock.left())
        if r.feasible and r.S is not None:
            out.append((name, r.S))
    return out


def _warm_start(model: CheckmateModel, g: Graph, start, cm: CostModel,
                lp_time: float | None = None, time_left: float | None = None) -> tuple[np.ndarray | None, str]:
    """The cheapest of the starting schedules that fits in the model's accounting
    (``"auto"``: checkpoint-all, the baselines of :data:`WARM_BASELINES` at the budget, then
    :func:`strided_matrix` for :data:`WARM_STRIDES`; ``"lp"``: those and the LP rounding's
    winner) as a column vector, or None; and what happened, in words."""
    clock = Deadline(time_left)  # the baselines and the candidates below share it
    if isinstance(start, str):
        if start not in ("auto", "lp"):
            raise ValueError("warm_start must be 'auto', 'lp', None or a checkpoint matrix, "
                             f"not {start!r}")
        candidates = [("checkpoint-all", checkpoint_all_matrix(g))]
        candidates += baseline_matrices(g, model.budget, cm, time_limit=clock.left())
        candidates += [(f"stride {k}", strided_matrix(g, k)) for k in WARM_STRIDES]
        if start == "lp":
            lp = checkmate_lp(g, model.budget, time_limit=lp_time, cost_model=cm)
            if lp.feasible:
                candidates.insert(0, ("lp rounding", lp.S))
    else:
        candidates = [("given", np.asarray(start, dtype=bool))]
    best = None
    for k, (name, S) in enumerate(candidates):
        if k > 0 and clock.expired():
            break  # out of time: keep the cheapest start found so far, if any
        if S.shape != (model.n, model.n):
            raise ValueError(f"warm_start must be an {model.n} x {model.n} checkpoint matrix")
        S = model.normalize_s(S)
        R = solve_r(model.st, S)
        cost = float((R * model.C[None, :]).sum())
        if best is not None and cost >= best[0]:
            continue
        x = model.solution_from(R, S)
        if model.violation(x) <= 1e-7:
            best = (cost, name, x)
            if name == "checkpoint-all":
                break  # nothing recomputed: nothing cheaper exists
    if best is None:
        return None, "not used (over the budget in the model's accounting)"
    return best[2], f"used ({best[1]})"


WARM_SHARE = 0.5
"""Under a time limit, the share of what is left that the starting schedules may take (each
baseline stops at its best so far when it runs out), so that HiGHS keeps the rest."""

MIN_HIGHS_SHARE = 0.05
"""HiGHS runs only if this share of the time limit is left after the starting schedules: its
presolve cannot be interrupted (7 s on GPT-2 small's 518k columns when started with none left)."""

ROOT_PROBE_COLUMNS = 150_000
"""With a time limit, models with more columns (ResNet50: 286k) first solve the LP relaxation
alone: HiGHS's MIP solver does not stop inside its root LP, which on ResNet50 ran 75-135 s
past a 30-60 s limit, while a plain LP stops on time."""


def _root_probe(model: CheckmateModel, threads, verbose, seconds: float) -> tuple[str, float | None,
                                                                                  float]:
    """Solve the LP relaxation within ``seconds``: ``(status, bound in cost units, seconds)``."""
    h = new_highs(model, relax=True, threads=threads, verbose=verbose)
    out = run_highs(h, time_limit=seconds, mip=False)
    bound = model.objective_bytes_or_cost(out.objective) if out.status == "optimal" else None
    return out.status, bound, out.seconds


def checkmate(g: Graph, budget: float, *, time_limit: float | None = None,
              cost_model: CostModel | None = None, mip_gap: float = 0.0,
              threads: int | None = None, verbose: bool = False, free_form: str = "tight",
              explain_infeasible: bool = True, warm_start="auto",
              highs_options: dict | None = None, max_columns: int | None = None) -> Plan:
    """The cheapest frontier-advancing schedule of ``g`` within ``budget`` bytes (problem 9).

    ``time_limit`` (seconds, the whole call) stops the search: the best schedule found is
    returned with status ``"time_limit"``, its proven lower bound and gap; ``"no_solution"``
    when none was found. ``"optimal"`` when HiGHS proves optimality within ``mip_gap``
    (relative). ``"infeasible"`` when no schedule fits, with the smallest feasible budget found
    in the message (``explain_infeasible``, at most :data:`EXPLAIN_SECONDS`). ``free_form``
    picks the FREE linearization: ``"tight"`` (default, one row per hazard, same optimum,
    faster) or ``"paper"`` (7b/7c as written); see :mod:`remat.solvers.checkmate.model`.
    ``threads`` sets HiGHS's thread count (it resets HiGHS's global scheduler);
    ``highs_options`` passes further HiGHS options (e.g. ``{"mip_heuristic_effort": 0.3}``).
    ``warm_start``: a checkpoint matrix ``S`` (``n x n`` over the stages) completed with
    :func:`solve_r` and handed to HiGHS as a starting incumbent when it fits the budget in the
    model's accounting; ``"auto"`` (default) tries :func:`checkpoint_all_matrix`, the best
    schedules of the baselines in :data:`WARM_BASELINES` and :func:`strided_matrix` policies
    and hands over the cheapest that fits; ``"lp"`` also runs
    :func:`~remat.solvers.checkmate.lp_rounding.checkmate_lp` first (at most half the time limit), so
    the MILP never returns a schedule costlier than LP rounding's; None: no start.

    With a time limit, a model of more than :data:`ROOT_PROBE_COLUMNS` columns first solves
    its LP relaxation alone (HiGHS's MIP solver cannot be stopped inside its root LP): the
    LP's optimum becomes the lower bound, and when the LP took too long for the MILP to get
    past its root in the time left, the starting schedule is returned with status
    ``"time_limit"`` (``details["emission"]`` says so).

    A graph whose model would exceed ``max_columns`` columns
    (:data:`~remat.solvers.checkmate.model.MAX_COLUMNS` by default) is not built: status
    ``"too_large"``, with the estimate in the message.

    If the simulator rejects the rounded schedule, ``R`` is re-derived with :func:`solve_r`;
    if it is still over budget (numerical slack of a few bytes) the MILP is solved again with
    the budget lowered by the excess (twice at most); such re-solves report ``"feasible"``
    (not ``"optimal"``) with the first model's lower bound, or ``"no_solution"`` if the
    stricter model has none (``details["attempts"]``).
    """
    clock = Deadline(time_limit)
    cm = cost_model or default_cost_model()
    budget = float(budget)
    details: dict = {}
    elapsed = clock.elapsed

    early = early_result(NAME, g, budget, cm, details, clock.start, max_columns)
    if early is not None:
        return early
    if staged(g).n == 0:
        return judged(NAME, g, budget, Schedule(g, [], {"solver": NAME}), solve_seconds=elapsed(),
                      status="optimal", cost_model=cm, lower_bound=0.0, details=details)

    # attempt 0 is problem 9 as specified; if the simulator rejects its schedule (numerical
    # slack of a few bytes), re-solve with the budget lowered by the excess
    model_budget = budget
    attempts: list[dict] = []
    first_lower = None
    res: Plan | None = None
    for attempt in range(3):
        if clock.expired() and res is None:
            return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="no_solution",
                          cost_model=cm, details=details, message=(
                              f"the time limit ({time_limit:g} s) ran out before the MILP was built"))
        tb = time.perf_counter()
        model = build_model(g, model_budget, cm, objective="cost", free_form=free_form)
        details.update(model=model.stats, build_seconds=round(time.perf_counter() - tb, 3))
        x0 = None
        if warm_start is not None:
            # the starts get half of what is left, the LP rounding a quarter: HiGHS the rest
            lp_time = None if time_limit is None else clock.left() * WARM_SHARE / 2
            x0, details["warm_start"] = _warm_start(model, g, warm_start, cm, lp_time,
                                                    None if time_limit is None else clock.left() * WARM_SHARE)
        remaining = clock.left()
        if remaining is not None and remaining <= max(MIN_HIGHS_SHARE * time_limit,
                                                      setup_seconds(model.stats["nonzeros"])):
            # the starts used the time up: HiGHS's presolve alone would run past the limit
            details["emission"] = "warm start (MILP not run: the time limit was spent)"
            if x0 is None:
                return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="no_solution",
                              cost_model=cm, details=details, message=(
                                  f"the time limit ({time_limit:g} s) ran out before HiGHS could "
                                  "run and no starting schedule fits the budget"))
            res, _ = _judge_solution(model, x0, budget, cm, solve_seconds=elapsed(),
                                     status="time_limit", lower_bound=first_lower, details=details)
            return res.updated(solve_seconds=elapsed())
        if remaining is not None and model.num_col > ROOT_PROBE_COLUMNS:
            lp_status, lp_bound, lp_s = _root_probe(model, threads, verbose, 0.9 * remaining)
            details["root_lp"] = {"status": lp_status, "seconds": round(lp_s, 3),
                                  "bound": lp_bound}
            if lp_status == "infeasible":
                return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="infeasible",
                              cost_model=cm, details=details, message=(
                                  f"infeasible budget: the LP relaxation has no solution within "
                                  f"{int(model_budget)} bytes, so no frontier-advancing "
                                  "schedule fits"))
            if attempt == 0 and lp_bound is not None:
                first_lower = lp_bound
            remaining = clock.left()
            if lp_bound is None or remaining < 1.5 * lp_s:
                # the MILP would not get past its root LP in time: keep the starting schedule
                if x0 is None:
                    return judged(NAME, g, budget, None, solve_seconds=elapsed(),
                                  status="no_solution", cost_model=cm, lower_bound=first_lower,
                                  details=details, message=(
                                      "no schedule found within the time limit: the root LP "
                                      f"relaxation took {lp_s:.0f} s of it and no starting "
                                      "schedule fits the budget"))
                res, route = _judge_solution(model, x0, budget, cm, solve_seconds=elapsed(),
                                             status="time_limit", lower_bound=first_lower,
                                             details=details)
                return res.updated(solve_seconds=elapsed(), details={
                    "emission": "warm start (MILP not run: root LP too slow for the limit)"})
        h = new_highs(model, threads=threads, verbose=verbose, options=highs_options)
        if x0 is not None:
            h.setSolution(len(x0), np.arange(len(x0), dtype=np.int32), x0)
        out = run_highs(h, time_limit=remaining, mip_gap=mip_gap)
        details.update(highs_status=out.highs_status, highs_seconds=round(out.seconds, 3),
                       mip_nodes=out.nodes, mip_gap=out.gap)
        lower = None if out.dual_bound is None else model.objective_bytes_or_cost(out.dual_bound)
        if attempt == 0:
            # a bound of the model as specified; the stricter re-solves prove nothing below it
            if lower is not None and (first_lower is None or lower > first_lower):
                first_lower = lower
            if first_lower is not None:
                details["lower_bound"] = first_lower
        if out.status == "infeasible" and attempt:
            return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="no_solution",
                          cost_model=cm, lower_bound=first_lower,
                          details={**details, "attempts": attempts}, message=(
                              f"no schedule found: the MILP's schedule peaked at "
                              f"{attempts[-1]['peak_bytes']} bytes in the simulator, over the "
                              f"budget of {int(budget)} (numerical slack), and the model with "
                              f"its budget lowered to {int(model_budget)} bytes has no "
                              "solution"))
        if out.status == "infeasible":
            msg = f"infeasible budget: no frontier-advancing schedule fits in {int(budget)} bytes"
            if explain_infeasible:
                left = EXPLAIN_SECONDS if time_limit is None else min(
                    EXPLAIN_SECONDS, max(1.0, time_limit - elapsed()))
                mb = min_budget(g, time_limit=left, cost_model=cm, threads=threads)
                details["min_budget"] = mb.to_dict()
                msg += (f"; smallest feasible budget found is {mb.budget} bytes"
                        + ("" if mb.status == "optimal" else
                           f" (none exists below {mb.lower_bound} bytes)"))
            return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="infeasible",
                          cost_model=cm, details=details, message=msg)
        if not out.has_solution:
            return judged(NAME, g, budget, None, solve_seconds=elapsed(), status="no_solution",
                          cost_model=cm, lower_bound=first_lower, details=details, message=(
                              f"no schedule found within the time limit ({out.highs_status})"))
        status = "optimal" if out.status == "optimal" else (
            "time_limit" if out.status in ("time_limit", "interrupted") else out.status)
        if status == "optimal" and (attempt or (mip_gap > 0 and (out.gap or 0.0) > 1e-9)):
            status = "feasible"  # optimal for a stricter model, or only within mip_gap
        res, route = _judge_solution(model, out.x, budget, cm, solve_seconds=elapsed(),
                                     status=status, lower_bound=first_lower, details=details)
        attempts.append({"model_budget": model_budget, "route": route,
                         "peak_bytes": res.peak_bytes})
        res = res.updated(details={"emission": route})
        if res.feasible or res.status == "invalid" or res.peak_bytes is None:
            break
        if clock.expired():
            break
        model_budget -= (res.peak_bytes - budget) + 1
    assert res is not None
    return res.updated(solve_seconds=elapsed(), details={"attempts": attempts} if len(attempts) > 1 else None)


# ---- the smallest feasible budget ------------------------------------------------------------

@dataclass
class MinBudget:
    """The smallest budget found at which a schedule fits, and what is proven about it."""

    budget: int  # simulated peak of the best schedule found (a feasible budget)
    lower_bound: int  # no frontier-advancing schedule peaks below this
    status: str  # "optimal" (budget == smallest possible), "time_limit", "no_solution",
    # "too_large" (no model built: budget from the baselines, lower_bound the cheap bound)
    schedule: Schedule | None
    seconds: float
    sim: SimResult | None = field(default=None, repr=False)
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"budget": self.budget, "lower_bound": self.lower_bound, "status": self.status,
                "seconds": round(self.seconds, 3), **self.details}


def min_budget(g: Graph, *, time_limit: float | None = None,
               cost_model: CostModel | None = None, threads: int | None = None,
               verbose: bool = False, free_form: str = "tight",
               max_columns: int | None = None) -> MinBudget:
    """The smallest feasible budget: problem 9's constraints with a peak variable ``P >= U``
    for every ``U``, minimizing ``P`` (no cost objective). The emitted schedule's simulated
    peak is the budget returned; HiGHS's dual bound (and :func:`memory_lower_bound`) give
    ``lower_bound``. HiGHS starts from the lowest of checkpoint-all and the
    :func:`strided_matrix` policies; on a time limit the best schedule found so far is
    returned with status ``"time_limit"``."""
    t0 = time.perf_counter()
    cm = cost_model or default_cost_model()
    lb, _ = memory_lower_bound(g)
    st = staged(g)
    meta = {"solver": "checkmate-min-budget"}
    if st.n == 0:
        sched = Schedule(g, [], meta)
        sim = simulate(sched, cm)
        return MinBudget(sim.peak_bytes, sim.peak_bytes, "optimal", sched,
                         time.perf_counter() - t0, sim)
    big = too_large(st, max_columns)
    if big is not None:
        peak, how = smallest_feasible(g, time_limit=time_limit)
        return MinBudget(int(peak), int(lb), "too_large", None, time.perf_counter() - t0,
                         details={"source": how, "message": big})
    model = build_model(g, None, cm, objective="peak", free_form=free_form)
    # the peak is at least the cheap bound: lets HiGHS stop as soon as an incumbent reaches it
    model.col_lower[model.peak_col] = max(0.0, model.mem_limit(lb) * (1 - 1e-9))
    best = None  # (simulated peak, schedule, sim, source)
    start = None  # (model peak, x)
    for name, S in [("checkpoint-all", checkpoint_all_matrix(g))] + \
            [(f"stride {k}", strided_matrix(g, k)) for k in WARM_STRIDES]:
        S = model.normalize_s(S)
        R = solve_r(st, S)
        sched = schedule_from_rs(st, R, S, meta)
        sim = simulate(sched, cm, timeline=False)
        if sim.valid and (best is None or sim.peak_bytes < best[0]):
            best = (sim.peak_bytes, sched, sim, name)
        x = model.solution_from(R, S)
        if start is None or x[model.peak_col] < start[0]:
            start = (x[model.peak_col], x)
    h = new_highs(model, threads=threads, verbose=verbose)
    h.setSolution(len(start[1]), np.arange(len(start[1]), dtype=np.int32), start[1])
    remaining = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))
    out = run_highs(h, time_limit=remaining, mip_gap=0.0)
    details = {"model": model.stats, "highs_status": out.highs_status,
               "highs_seconds": round(out.seconds, 3), "mip_nodes": out.nodes}
    if out.dual_bound is not None:
        # peaks are whole bytes: round the bound up, less the solver's tolerance
        v = model.objective_bytes_or_cost(out.dual_bound)
        lb = max(lb, int(math.ceil(v - 1e-6 * max(abs(v), model.mem_scale))))
    if out.has_solution:
        sched, Rb, Sb = _emit(model, out.x, meta)
        sim = simulate(sched, cm)
        if not sim.valid:
            sched = schedule_from_rs(st, solve_r(st, Sb), Sb, meta)
            sim = simulate(sched, cm)
        if sim.valid and sim.peak_bytes <= best[0]:
            best = (sim.peak_bytes, sched, sim, "milp")
    budget, sched, sim, source = best
    details["source"] = source
    if out.status == "optimal" or budget <= lb:
        # proven: the smallest model peak equals the smallest simulated one (cleaned schedules
        # are accounted exactly), and the emitted schedule reaches it
        return MinBudget(int(budget), int(budget), "optimal", sched, time.perf_counter() - t0,
                         sim, details)
    return MinBudget(int(budget), int(min(lb, budget)), "time_limit", sched,
                     time.perf_counter() - t0, sim, details)
