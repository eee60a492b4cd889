"""``solver="auto"``: the default. Without a budget, the fusion-aware min cut (conservative);
with one, the fastest plan within it, fusion-aware first.

With a budget, in this order, each stage only if the ones before found nothing that fits:

1. **the no-budget plan** (conservative min cut): when it fits, it is the answer unless a
   frontier plan is no larger and clearly faster (:data:`CLEARLY_FASTER`), so a budget never
   gives a plan that needs more memory or time than ``remat.compile(model)`` without one;
2. **the fusion-aware frontier** (:mod:`remat.solvers.mincut.frontier`): every saved set that
   is cheapest for some price of memory, and the aggressive min cut, each judged by the
   simulator (real peak, fusion-aware predicted time); the fastest within the budget wins.
   A few max-flows: well under a second on 50k-node graphs;
3. **peak descent** (:mod:`remat.solvers.descent`) from the saved set of least peak so far:
   one saved value dropped or one recomputed value saved at a time, while the simulated peak
   falls, until it is within the budget (at most :data:`~remat.solvers.descent.DESCENT_SECONDS`);
   the frontier prices bytes saved, not bytes alive at the peak, and the least memory often
   lies between its vertices (ResNet-18 tiny: 0.77 of the activation memory at the
   least-memory vertex, 0.66 after the descent, PyTorch's knob 0.68; BENCHMARKS.md);
4. **schedules that recompute in stages**, which a saved set cannot express: the classic
   baselines (:data:`AUTO_BASELINES`), then Checkmate's MILP on graphs of at most
   :data:`MILP_MAX_NODES` nodes, all within what is left of ``time_limit``. Not for graphs
   inductor compiles (:func:`staged_schedules_run_as_planned`): there ``auto`` keeps to saved
   sets.

5. **offloading** where a copy runs beside compute (a GPU, or a graph without a device): the
   fastest plan that fits and the smallest, swapped down to the budget (seeds/004;
   :mod:`remat.transforms.swap`), kept when that is faster or the only way to fit. Not on a
   CPU, where a copy costs the compute stream as much as a recomputation.

When nothing fits, the plan of least peak is returned (every attempt in
``details["tried"]``) and :func:`remat.solvers.solve` raises
:class:`~remat.errors.InfeasibleBudgetError` naming the least peak found. ``budget=0``
(``budget="min"``) asks for that plan: every stage runs, and the least peak wins.
"""

from __future__ import annotations

import time
from typing import Callable

from ..cost.model import CostModel, default_cost_model
from ..cost.transfer import link_for_graph, offload_allowed
from ..errors import OptionError, RematError
from ..graph.graph import Graph
from ..plans.budget import reference_saved, reference_schedule
from ..plans.simulator import simulate
from ..plans.plan import FEASIBLE_STATUSES, Plan
from .baselines import BASELINES
from .checkmate import checkmate
from .deadline import Deadline
from .descent import DESCENT_SECONDS, descend
from .feasible import FIXED, staged_schedules_run_as_planned
from .mincut import mincut
from .mincut.frontier import frontier
from .progress import report
from .search import AUTO_SEARCH_SECONDS, has_dimensions, magis, refine
from .swap import refuse_without_offloading, swap_down

AUTO_BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-sqrtn-linearized", "chen-greedy",
                  "griewank", "chen-greedy-linearized")
"""The baselines ``auto`` tries when no saved set fits, cheapest first: the chain policies on
the articulation points (``chen-*``, when the graph has any) and on the whole forward order
(``-linearized``: on GPT-2 only these reach 0.2), and REVOLVE. The greedy ones and REVOLVE
search (5-10 s each on an 800-node graph): they share :data:`STAGED_SECONDS` evenly, and
each stops at its best so far, its grid sampled coarse to fine."""

STAGED_SECONDS = 6.0
"""At most this much of the time limit goes to the baselines and the MILP, so that a budget
nothing reaches is reported in seconds."""

CLEARLY_FASTER = 0.01
"""Where the plan without a budget fits, another replaces it only if predicted this much faster
(and no larger): a CNN's frontier plan predicted 0.003% faster recomputed 63 batch-norm values
and measured 1.29x the step time under the eager compiler."""

SAVED_SET_SOLVERS = ("mincut-conservative", "mincut-aggressive", "frontier", "no-recompute")
"""The plans a peak descent may start from: saved sets."""

MILP_MAX_NODES = 400
"""Checkmate's MILP joins ``auto`` only on graphs this small: on GPT-2 small (2,000 nodes)
HiGHS spends a minute without a first schedule."""


def auto(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
         time_limit: float | None = None, max_overhead: float | None = None,
         fission: bool = True) -> Plan:
    """The conservative min cut without a budget; with one, the fastest plan within it (see
    the module docstring). Each stage is announced to :func:`remat.solvers.progress.report`.
    ``max_overhead`` (no budget): the least memory within that share of extra step time, by
    MAGIS's search (:func:`remat.solvers.search.magis`). ``fission=False``: the search splits
    no sub-graph."""
    if max_overhead is not None:
        if budget is not None:
            raise OptionError("give a memory budget or max_overhead, not both")
        return magis(g, cost_model=cost_model, time_limit=time_limit, max_overhead=max_overhead,
                     fission=fission)
    plan = _auto(g, budget, cost_model, time_limit, swapping=True)
    if budget is None or (plan.feasible and budget > 0) or not has_dimensions(g):
        return plan
    # nothing fits, or the least memory is asked: MAGIS's search from this plan (fission too)
    return refine(g, plan, budget, cost_model or default_cost_model(g), AUTO_SEARCH_SECONDS,
                  fission=fission)


def _auto(g: Graph, budget: float | None, cost_model: CostModel | None, time_limit: float | None, *,
          swapping: bool) -> Plan:
    if budget is None:
        return mincut(g, "conservative")
    t0 = time.perf_counter()
    clock = Deadline(time_limit)
    cm = cost_model or default_cost_model(g)
    least = budget <= 0
    plans: list[Plan] = []

    limit = None if least else int(budget)  # least memory: judged without a bound

    def attempt(name: str, make: Callable[[], Plan]) -> Plan | None:
        try:
            p = make()
        except RematError as e:  # a graph this solver cannot plan
            p = Plan.without_schedule(g, solver=name, status="unsupported", message=str(e))
        if p.statements is not None and (p.sim is None or p.budget != limit):
            p.judge(limit, cm)
        plans.append(p)
        return p

    report(f"{g.name}: the min cut without a budget")
    base = attempt("mincut-conservative", lambda: mincut(g, "conservative"))
    report(f"{g.name}: the fusion-aware frontier")
    points = _frontier_plans(g, cm, clock, attempt)
    attempt("mincut-aggressive", lambda: mincut(g, "aggressive"))
    saved = reference_saved(g)
    if saved is not None:  # the reference of a fraction: budget=1.0 always fits
        attempt("no-recompute", lambda: Plan.from_saved_set(g, saved, solver="no-recompute"))
    if least or not any(p.feasible for p in plans):
        _descent(g, cm, clock, plans, limit, attempt)
    if base.feasible and not least:
        better = [p for p in plans if p.feasible and p is not base and p.peak_bytes <= base.peak_bytes
                  and p.predicted_seconds <= base.predicted_seconds * (1 - CLEARLY_FASTER)]
        return _done(min(better, key=_speed) if better else base, plans, t0, points)
    staged = Deadline(STAGED_SECONDS if clock.limit is None else min(clock.left(), STAGED_SECONDS))
    runs_staged = staged_schedules_run_as_planned(cm)
    if (least or not any(p.feasible for p in plans)) and not runs_staged:
        report(f"{g.name}: no staged schedules under a fusing compiler (saved sets only)")
    elif least or not any(p.feasible for p in plans):
        searching = [n for n in AUTO_BASELINES if n not in FIXED]
        for name in AUTO_BASELINES:
            if staged.expired():
                break
            report(f"{g.name}: baseline {name}")
            share = staged.left()
            if name in searching:  # the searches share the time evenly (each stops at its best)
                share = None if share is None else share / (len(searching) - searching.index(name))
            attempt(name, lambda name=name, share=share: BASELINES[name](
                g, limit or 0, cost_model=cm, time_limit=share))
    if not least and not any(p.feasible for p in plans) and len(g) <= MILP_MAX_NODES \
            and not staged.expired() and runs_staged:
        report(f"{g.name}: Checkmate's MILP")
        attempt("checkmate", lambda: checkmate(g, budget, time_limit=staged.left(), cost_model=cm,
                                               explain_infeasible=False))
    if swapping:
        _swapped(g, cm, clock, plans, limit, least)
    valid = [p for p in plans if p.peak_bytes is not None and p.status != "invalid"]
    if least and valid:
        best = min(valid, key=lambda p: (p.peak_bytes, p.predicted_seconds, p.solver))
        if best.status not in FEASIBLE_STATUSES:  # a baseline asked for 0 bytes says "infeasible"
            best.details["solver_status"], best.status = best.status, "feasible"
        best.judge(best.peak_bytes, cm, sim=best.sim)
        return _done(best, plans, t0, points)
    fits = [p for p in plans if p.feasible]
    if fits:
        return _done(min(fits, key=_speed), plans, t0, points)
    best = min(valid, key=lambda p: p.peak_bytes) if valid else plans[0]
    return _done(best, plans, t0, points)


def _swapped(g: Graph, cm: CostModel, clock: Deadline, plans: list[Plan], limit: int | None,
             least: bool) -> None:
    """Offloading where it can be cheaper than recomputation: on a device whose copies run
    beside compute (a GPU; a graph without a device), the fastest plan so far that fits and the
    smallest one, swapped down to the budget (:func:`remat.solvers.swap.swap_down`). On a CPU a
    copy takes the compute stream's time and memory bandwidth, as recomputing does: auto does
    not offload there (the ``swap`` solvers still do when asked by name)."""
    link = link_for_graph(g, cm)
    valid = [p for p in plans if p.sim is not None and p.sim.valid]
    if not link.asynchronous or not offload_allowed(g)[0] or not valid or clock.expired():
        return
    fits = [p for p in valid if p.feasible]
    starts = {id(p): p for p in ([min(fits, key=_speed)] if fits and not least else [])
              + [min(valid, key=lambda p: (p.peak_bytes, p.predicted_seconds))]}.values()
    report(f"{g.name}: offloading instead of recomputing")
    best = swap_down(g, [(p.solver, p.schedule()) for p in starts], limit or 0, cm, link, clock, limit)
    if best.details.get("swaps"):
        plans.append(best)


def _speed(p: Plan) -> tuple:
    """Fastest first (the fusion-aware prediction, or the additive cost on profiled graphs),
    then least peak, then the solver's name: a deterministic choice."""
    return (p.predicted_seconds, p.peak_bytes, p.solver)


def _frontier_plans(g: Graph, cm: CostModel, clock: Deadline, attempt) -> int:
    try:
        points = frontier(g, cm, time_limit=clock.left())
    except RematError as e:  # no valid saved set (flags that forbid every cut)
        why = str(e)
        attempt("frontier", lambda: Plan.without_schedule(g, solver="frontier", status="unsupported",
                                                          message=why))
        return 0
    seen: set[tuple[str, ...]] = set()
    for k, pt in enumerate(points):
        key = tuple(pt.saved)
        if key in seen:
            continue
        seen.add(key)
        attempt("frontier", lambda pt=pt, k=k: Plan.from_saved_set(
            g, pt.saved, solver="frontier", cost=float(pt.time),
            details={"frontier_point": k, "frontier_points": len(points), "saved_bytes": pt.memory,
                     "memory_price": [pt.lam_low, pt.lam_high]}))
        if clock.expired():
            break
    return len(points)


def _descent(g: Graph, cm: CostModel, clock: Deadline, plans: list[Plan], limit: int | None,
             attempt) -> None:
    """Peak descent (:mod:`.descent`) from the saved set of least peak so far."""
    starts = [p for p in plans if p.sim is not None and p.sim.valid and p.solver in SAVED_SET_SOLVERS]
    if not starts or clock.expired():
        return
    start = min(starts, key=lambda p: (p.peak_bytes, p.predicted_seconds))
    report(f"{g.name}: peak descent from {start.solver} ({start.peak_bytes:,} B)")
    left = clock.left()
    seconds = DESCENT_SECONDS if left is None else min(left, DESCENT_SECONDS)

    def make() -> Plan:
        saved, _ = descend(g, start.saved_names, cm, budget=limit, time_limit=seconds)
        plan = Plan.from_saved_set(g, saved, solver="descent", details={"descended_from": start.solver})
        return plan.judge(limit, cm)

    attempt("descent", make)


def _done(best: Plan, plans: list[Plan], t0: float, points: int) -> Plan:
    best.details["tried"] = [{"solver": p.solver, "status": p.status, "peak_bytes": p.peak_bytes,
                              "predicted_seconds": p.predicted_seconds,
                              "compute_cost": p.compute_cost, "message": p.message} for p in plans]
    best.details["frontier_points"] = points
    best.solve_seconds = time.perf_counter() - t0
    return best


LADDER = (1.0, 1.2, 1.5)
"""Budgets, as multiples of the one asked, that ``swap-recompute`` makes recomputation plans
for before swapping each down: a plan for a larger budget recomputes less."""

PLAN_SHARE = 0.8
"""Of ``swap-recompute``'s time limit, the share its recomputation plans take."""

FIRST_RUNG = 0.5
"""Of that, the share of the plans for the budget asked: ``auto``'s (at most half the plans'
time; it stops once a plan fits), then Checkmate's MILP, where it runs, in the rest. The
other budgets share what is left, a third to ``auto`` and the rest to the MILP."""


def swap_recompute(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
                   time_limit: float | None = None, bandwidth: float | None = None) -> Plan:
    """What to offload chosen jointly with what to recompute (seeds/004's swapping beside
    seeds/000-001's recomputation): :func:`auto`'s plans for a ladder of budgets from the one
    asked up to the step without recomputation (:data:`LADDER`), the least memory
    recomputation reaches, and no recomputation at all, each swapped down to ``budget``
    (:func:`remat.solvers.swap.swap_down`); the fastest that fits wins, timed by the
    simulator's two streams (a recomputation costs compute, a swap only what compute waits
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
    starts = [("no-recompute", ref)]
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
        # auto first (it stops early once a plan fits); the MILP gets what is left of the rung
        made = [_auto(g, b, cm, None if left is None else (left / 2 if k == 0 else rung.limit / 3),
                      swapping=False)]
        if milp:  # Checkmate's optimum for this budget, in what is left of the rung's time
            made.append(checkmate(g, b, cost_model=cm, explain_infeasible=False, time_limit=rung.left()))
        for p in made:
            if p.statements is not None:
                starts.append((p.solver, p.schedule()))
                fits = fits or p.peak_bytes <= target
    best = swap_down(g, starts, target, cm, link, clock, budget)
    best.solve_seconds = time.perf_counter() - t0
    return best
