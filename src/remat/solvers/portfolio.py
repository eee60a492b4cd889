"""The starting plans: what ``auto``, MAGIS's search and ``swap-recompute`` all start from.

:func:`portfolio` makes plans for a budget in this order, each stage only if the ones before
found nothing that fits, and returns the best (every attempt in ``plan.tried``):

1. **the no-budget plan** (conservative min cut): when it fits, it is the answer unless a
   frontier plan is no larger and clearly faster (:data:`CLEARLY_FASTER`), so a budget never
   gives a plan that needs more memory or time than ``remat.compile(model)`` without one.
   Without a budget (``budget=None``) under a compiler that does not fuse (the eager
   compiler; a graph without a device), only this stage and the next run, and the same rule
   picks: the no-budget plan is never beaten on both peak and predicted time by a saved set a
   fraction would get (the min cut assumes the fusion that compiler lacks; on 11 models,
   ``python benchmarks/budget_range.py``, no budget then measured 0.80-1.00 of plain
   torch.compile's peak at 0.85-1.05x its step, BENCHMARKS.md). Under inductor the min cut is
   PyTorch's own plan, and it stays;
2. **the fusion-aware frontier** (:mod:`remat.solvers.mincut.frontier`): every saved set that
   is cheapest for some price of memory, and the aggressive min cut, each judged by the
   simulator (real peak, fusion-aware predicted time); the fastest within the budget wins.
   A few max-flows: well under a second on 50k-node graphs;
3. **peak descent** (:mod:`remat.solvers.descent`) from the saved set of least peak so far:
   one saved value dropped or one recomputed value saved at a time, while the simulated peak
   falls, until it is within the budget (at most
   :data:`~remat.solvers.descent.DESCENT_SHARE` of the scale, 3 s); the frontier prices bytes
   saved, not bytes alive at the peak, and the least memory often lies between its vertices
   (ResNet-18 tiny: 0.77 of the activation memory at the least-memory vertex, 0.66 after the
   descent, PyTorch's knob 0.68; BENCHMARKS.md);
4. **schedules that recompute in stages**, which a saved set cannot express: the classic
   baselines (:data:`STAGED_BASELINES`), then Checkmate's MILP on graphs of at most
   :data:`MILP_MAX_NODES` nodes, within :data:`STAGED_SHARE` of the scale (6 s). Not for graphs
   inductor compiles (:func:`~remat.solvers.feasible.staged_schedules_run_as_planned`): there
   the portfolio keeps to saved sets.
5. **offloading** (``swapping=True``) where a copy runs beside compute (a GPU, or a graph
   without a device): the fastest plan that fits and the smallest, swapped down to the budget
   (seeds/004; :func:`remat.solvers.magis.swap_solver.swap_down`), kept when that is faster or
   the only way to fit. Not on a CPU, where a copy costs the compute stream as much as a
   recomputation.

When nothing fits, the plan of least peak is returned. ``budget=0`` asks for that plan: every
stage runs, and the least peak wins; with ``within`` (seconds: what ``budget="min"`` and
``max_overhead`` ask, :func:`remat.solvers.magis.search.least_within`) the least peak among
the plans predicted that fast and no larger than the plan without a budget, a staged schedule's
time counted :data:`STAGED_PENALTY` times (its prediction is the least reliable), and the
staged baselines are skipped when none of them could qualify.

The stages stop on work, not time, where they search: the descent after
:func:`~remat.solvers.descent.descent_trials` moves, each searching baseline after
:func:`staged_evaluations` schedules; their shares of one scale, within the call's time limit
(:mod:`remat.solvers.deadline`), stay as safety stops under load. The frontier stops after its
vertices or :data:`~remat.solvers.mincut.frontier.FRONTIER_WORK` max-flows (the clock,
:data:`FRONTIER_SHARE`, as its safety stop), Checkmate's MILP and offloading's swap pass on the
clock.

>>> from remat.graph.examples import offload_chain
>>> p = portfolio(offload_chain(), 600)
>>> p.solver, p.peak_bytes, [t.solver for t in p.tried][:2]
('descent', 600, ['mincut-conservative', 'frontier'])
"""

from __future__ import annotations

import time
from typing import Callable

from ..cost.model import CostModel, default_cost_model
from ..cost.transfer import link_for_graph, offload_allowed
from ..errors import RematError
from ..graph.graph import Graph
from ..plans.budget import reference_saved
from ..plans.outcome import Attempt
from ..plans.plan import FEASIBLE_STATUSES, Plan
from .baselines import BASELINES
from .checkmate import checkmate
from .deadline import Deadline, Work
from .descent import DESCENT_SHARE, descend, descent_trials
from .feasible import FIXED, staged_schedules_run_as_planned
from .magis.swap_solver import swap_down
from .mincut import mincut
from .mincut.frontier import frontier
from .progress import report

STAGED_BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-sqrtn-linearized", "chen-greedy",
                    "griewank", "chen-greedy-linearized")
"""The baselines tried when no saved set fits, cheapest first: the chain policies on the
articulation points (``chen-*``, when the graph has any) and on the whole forward order
(``-linearized``: on GPT-2 only these reach 0.2), and REVOLVE. The greedy ones and REVOLVE
search (5-10 s each on an 800-node graph): they share :data:`STAGED_SHARE` evenly, and
each stops at its best so far, its grid sampled coarse to fine."""

STAGED_SHARE = 0.1
"""At most this share of :data:`~remat.solvers.deadline.SCALE` (6 s of 60 s), within the time
limit, goes to the baselines and the MILP, so that a budget nothing reaches is reported in
seconds."""

FRONTIER_SHARE = 0.4
"""The frontier's safety stop: this share of :data:`~remat.solvers.deadline.SCALE` (24 s of
60 s), within the time limit; its deterministic stop is
:data:`~remat.solvers.mincut.frontier.FRONTIER_WORK`. The plans it yields are judged after it,
which takes time of its own (8 s for 15 plans of a 100k-node graph)."""

CLEARLY_FASTER = 0.01
"""Where the plan without a budget fits, another replaces it only if predicted this much faster
(and no larger): a CNN's frontier plan predicted 0.003% faster recomputed 63 batch-norm values
and measured 1.29x the step time under the eager compiler."""

SAVED_SET_SOLVERS = ("mincut-conservative", "mincut-aggressive", "frontier", "torch-mincut")
"""The plans a peak descent may start from: saved sets."""

MILP_MAX_NODES = 400
"""Checkmate's MILP joins the portfolio only on graphs this small: on GPT-2 small (2,000
nodes) HiGHS spends a minute without a first schedule."""

STAGED_WORK = 6_000_000
"""The deterministic stop of the staged baselines that search (Chen's greedy, REVOLVE): each
evaluates at most this many schedules times the graph's nodes squared (a staged schedule has
a statement per stage and ancestor: 20 ms per schedule on GPT-2 quick's 410 nodes, 62 ms on
T5 quick's 674), between 16 and 64 schedules (:func:`staged_evaluations`; their
``evaluations`` option), sampled coarse to fine, so that they finish within
:data:`STAGED_SHARE`, which stays as the safety stop under load: 35 schedules on GPT-2 quick,
where ``chen-greedy-linearized`` needs 32 to reach the least peak its whole grid (300 points,
3.2 s) reaches; 16 on T5 quick (about 1 s per baseline). Their whole grids took 2-8 s each on
these graphs, and were cut by the clock before."""

STAGED_MAX_STAGES = 4096
"""The staged baselines join the portfolio only on graphs of at most this many stages: their
checkpoint policies are ``n x n`` matrices (:func:`~remat.solvers.baselines.policy.policy_matrix`;
16 MB here, 10 GB at 100k stages) and each searching baseline evaluates at least 16 of them.
On a larger graph ``auto`` records them as ``skipped`` in ``plan.tried`` (a size rule:
the clock does not decide it). The solvers by name still run them."""

OFFLOAD_WORK = 1_500_000
"""The deterministic stop of offloading (stage 5): the statements its passes may simulate in
all (:class:`~remat.solvers.deadline.Work`: the swap pass's tries and the trade's, each one
replay of a schedule), shared by the schedules it starts from. About 15 s of the simulator on
this 2-core machine (10 us a statement); 70 replays of a 10k-node graph's schedule, 8 of a
100k-node one's. Offloading is skipped (``skipped`` in ``plan.tried``) where fewer than
:data:`OFFLOAD_MIN_REPLAYS` replays of its starting schedules fit: a swap pass needs a few to
lower a peak at all."""

OFFLOAD_MIN_REPLAYS = 12
"""Replays of its starting schedules that offloading needs within :data:`OFFLOAD_WORK` to run."""

STAGED_PENALTY = 2.3
"""A staged schedule's predicted time is multiplied by this before it is held against a time
bound (``budget="min"``, ``max_overhead``). Measured through the eager compiler
(``remat.compile(..., compiler="eager")``, ``remat.bench.measure.step_time``, one thread on a
shared 2-core machine, step time over the plan without a budget's, least-memory schedules):
T5 quick's ``chen-greedy`` predicted 3.59x, measured 8.18x and 5.01x in two runs;
``chen-sqrtn-linearized`` predicted 5.30x, measured 6.94x; ``chen-greedy-linearized``
predicted 1.87x, measured 2.08x; Llama quick's ``chen-sqrtn-linearized`` predicted 3.13x,
measured 2.5-2.6x. The cost model's time of a staged schedule is off by up to 2.3x, either
way, on this noisy machine; a saved set's was close (T5 quick's ``min`` plan from the search:
predicted 1.12x, measured 1.13x). Under the default bound of ``min``
(:data:`remat.solvers.auto.MIN_OVERHEAD`: 2x) no staged schedule can qualify, and the
baselines are not run at all (a staged schedule is never faster than the fastest saved
set)."""


def portfolio(g: Graph, budget: float | None, cost_model: CostModel | None = None,
              time_limit: float | None = None, *, swapping: bool = False,
              within: float | None = None) -> Plan:
    """The best starting plan for ``budget`` bytes (0: the least peak; None: the conservative
    min cut, or, without fusion, the fastest frontier plan no larger and clearly faster) within ``time_limit`` seconds (see the module docstring); every plan made is in
    ``plan.tried``. ``swapping``: offloading too (stage 5). ``within`` (with budget 0):
    the least peak among the plans predicted within ``within`` seconds (a staged schedule's
    time times :data:`STAGED_PENALTY`) and no larger than the conservative min cut; the fastest
    of those no larger when none is that fast; with a budget, it spares the staged schedules
    (stage 4) where none could be predicted within it."""
    cm = cost_model or default_cost_model(g)
    if budget is None and cm.fused_memory:  # under inductor the min cut is PyTorch's own plan
        return mincut(g, "conservative")
    t0 = time.perf_counter()
    clock = Deadline(time_limit)
    fastest_only = budget is None  # no budget: the fastest plan no larger than the min cut's
    least = not fastest_only and budget <= 0
    plans: list[Plan] = []

    limit = None if least or fastest_only else int(budget)  # least memory: judged without a bound

    def attempt(name: str, make: Callable[[], Plan]) -> Plan | None:
        try:
            p = make()
        except RematError as e:  # a graph this solver cannot plan
            p = Plan.without_schedule(g, solver=name, status="unsupported", message=str(e))
        if p.statements is not None and (p.sim is None or p.budget != limit):
            p = p.judge(limit, cm)
        plans.append(p)
        return p

    report(f"{g.name}: the min cut without a budget")
    if fastest_only:  # the plan without a budget: its errors are the caller's, as the min cut's
        cut = mincut(g, "conservative")
        base = attempt("mincut-conservative", lambda: cut)
    else:
        base = attempt("mincut-conservative", lambda: mincut(g, "conservative"))
    report(f"{g.name}: the fusion-aware frontier")
    points = _frontier_plans(g, cm, clock, attempt)
    attempt("mincut-aggressive", lambda: mincut(g, "aggressive"))
    saved = reference_saved(g)
    if saved is not None:  # plain torch.compile's partition, the reference of a fraction: 1.0 fits
        attempt("torch-mincut", lambda: Plan.from_saved_set(g, saved, solver="torch-mincut"))
    if fastest_only:
        return _done(_clearly_faster(base, plans), plans, t0, points)
    if least or not any(p.feasible for p in plans):
        _descent(g, cm, clock, plans, limit, attempt)
    if base.feasible and not least:
        return _done(_clearly_faster(base, plans), plans, t0, points)
    runs_staged = staged_schedules_run_as_planned(cm)
    fastest = min((p.predicted_seconds for p in plans if p.sim is not None and p.sim.valid), default=None)
    # a staged schedule is never faster than the fastest plan found: within that bound, none can be
    offered = not (within is not None and fastest is not None and within < STAGED_PENALTY * fastest)
    staged = clock.share(STAGED_SHARE)
    if (least or not any(p.feasible for p in plans)) and not offered:
        report(f"{g.name}: no staged schedules within {within:.3g} s (saved sets only)")
    elif (least or not any(p.feasible for p in plans)) and not runs_staged:
        report(f"{g.name}: no staged schedules under a fusing compiler (saved sets only)")
    elif (least or not any(p.feasible for p in plans)) and staged_stages(g) > STAGED_MAX_STAGES:
        report(f"{g.name}: no staged baselines on {staged_stages(g):,} stages (saved sets only)")
        why = (f"{staged_stages(g):,} stages, over STAGED_MAX_STAGES={STAGED_MAX_STAGES:,}: a staged "
               "policy is an n x n matrix")
        for name in STAGED_BASELINES:
            attempt(name, lambda name=name: Plan.without_schedule(g, solver=name, status="skipped",
                                                                  message=why))
    elif least or not any(p.feasible for p in plans):
        _baselines(g, cm, staged, limit, attempt)
    if not least and not any(p.feasible for p in plans) and len(g) <= MILP_MAX_NODES \
            and not staged.expired() and runs_staged and offered:
        report(f"{g.name}: Checkmate's MILP")
        attempt("checkmate", lambda: checkmate(g, budget, time_limit=staged.left(), cost_model=cm,
                                               explain_infeasible=False))
    if swapping:
        _swapped(g, cm, clock, plans, limit, least, attempt)
    valid = [p for p in plans if p.peak_bytes is not None and p.status != "invalid"]
    if least and valid:
        best = min(_bounded(valid, base, within), key=lambda p: (p.peak_bytes, bounded_seconds(p), p.solver))
        if best.status not in FEASIBLE_STATUSES:  # a baseline asked for 0 bytes says "infeasible"
            best = best.updated(status="feasible", details={"solver_status": best.status})
        best = best.judge(best.peak_bytes, cm, sim=best.sim)
        return _done(best, plans, t0, points)
    fits = [p for p in plans if p.feasible]
    if fits:
        return _done(min(fits, key=_speed), plans, t0, points)
    best = min(valid, key=lambda p: p.peak_bytes) if valid else plans[0]
    return _done(best, plans, t0, points)


def _clearly_faster(base: Plan, plans: list[Plan]) -> Plan:
    """``base`` (the conservative min cut, which fits), or the fastest of ``plans`` that fits,
    is no larger and is predicted :data:`CLEARLY_FASTER` faster."""
    if base.sim is None or not base.sim.valid:
        return base
    better = [p for p in plans if p.feasible and p is not base and p.peak_bytes <= base.peak_bytes
              and p.predicted_seconds <= base.predicted_seconds * (1 - CLEARLY_FASTER)]
    return min(better, key=_speed) if better else base


def staged_stages(g: Graph) -> int:
    """The stages of ``g``'s staged problem: every node but the primal inputs and parameters."""
    a = g._arrays
    return int(a.n - a.primal.sum())


def staged_evaluations(g: Graph) -> int:
    """The schedules each searching staged baseline evaluates at most on ``g``
    (:data:`STAGED_WORK`)."""
    return min(64, max(16, int(STAGED_WORK // max(1, len(g)) ** 2)))


def _bounded(valid: list[Plan], base: Plan, within: float | None) -> list[Plan]:
    """The plans ``budget=0`` chooses among: all of ``valid`` without a bound; with one
    (``within`` seconds), those no larger than ``base`` (the plan without a budget) and
    predicted within it (:func:`bounded_seconds`), else the fastest of those no larger."""
    if within is None:
        return valid
    small = [p for p in valid if base.peak_bytes is None or base.status == "invalid"
             or p.peak_bytes <= base.peak_bytes] or valid
    ok = [p for p in small if bounded_seconds(p) <= within * (1 + 1e-9)]
    return ok or [min(small, key=lambda p: (bounded_seconds(p), p.peak_bytes, p.solver))]


def bounded_seconds(p: Plan) -> float:
    """The time a time bound holds ``p`` to: its prediction, times :data:`STAGED_PENALTY` for a
    staged schedule (a baseline's or the MILP's)."""
    return p.predicted_seconds * (STAGED_PENALTY if is_staged(p) else 1.0)


def is_staged(p: Plan) -> bool:
    """Whether ``p`` is a staged schedule (a baseline's or the MILP's), whose time prediction
    is the least reliable (:data:`STAGED_PENALTY`)."""
    return p.solver in STAGED_BASELINES or p.solver.startswith(("checkmate", "chen", "griewank"))


def _baselines(g: Graph, cm: CostModel, staged: Deadline, limit: int | None, attempt) -> None:
    """The :data:`STAGED_BASELINES` in order, within ``staged``: the ones that search evaluate
    :func:`staged_evaluations` schedules each (the deterministic stop) and share the time evenly (the
    safety stop: each stops at its best)."""
    searching = [n for n in STAGED_BASELINES if n not in FIXED]
    for name in STAGED_BASELINES:
        if staged.expired():
            break
        report(f"{g.name}: baseline {name}")
        share = staged.left()
        options = {}
        if name in searching:
            share = None if share is None else share / (len(searching) - searching.index(name))
            options["evaluations"] = staged_evaluations(g)
        attempt(name, lambda name=name, share=share, options=options: BASELINES[name](
            g, limit or 0, cost_model=cm, time_limit=share, **options))


def _swapped(g: Graph, cm: CostModel, clock: Deadline, plans: list[Plan], limit: int | None,
             least: bool, attempt) -> None:
    """Offloading where it can be cheaper than recomputation: on a device whose copies run
    beside compute (a GPU; a graph without a device), the fastest plan so far that fits and the
    smallest one, swapped down to the budget (:func:`remat.solvers.magis.swap_solver.swap_down`).
    On a CPU a copy takes the compute stream's time and memory bandwidth, as recomputing does:
    the portfolio does not offload there (the ``swap`` solvers still do when asked by name).
    It stops on :data:`OFFLOAD_WORK` simulated statements, and is skipped where that does not
    afford :data:`OFFLOAD_MIN_REPLAYS` replays of its starting schedules."""
    link = link_for_graph(g, cm)
    valid = [p for p in plans if p.sim is not None and p.sim.valid]
    if not link.asynchronous or not offload_allowed(g)[0] or not valid or clock.expired():
        return
    fits = [p for p in valid if p.feasible]
    starts = {id(p): p for p in ([min(fits, key=_speed)] if fits and not least else [])
              + [min(valid, key=lambda p: (p.peak_bytes, p.predicted_seconds))]}.values()
    schedules = [(p.solver, p.schedule()) for p in starts]
    need = OFFLOAD_MIN_REPLAYS * sum(len(s) for _, s in schedules)
    if need > OFFLOAD_WORK:
        report(f"{g.name}: no offloading ({need:,} simulated statements needed, over {OFFLOAD_WORK:,})")
        why = (f"offloading would simulate at least {need:,} statements ({OFFLOAD_MIN_REPLAYS} replays "
               f"of its starting schedules), over OFFLOAD_WORK={OFFLOAD_WORK:,}")
        attempt("swap-recompute", lambda: Plan.without_schedule(g, solver="swap-recompute",
                                                                status="skipped", message=why))
        return
    report(f"{g.name}: offloading instead of recomputing")
    best = swap_down(g, schedules, limit or 0, cm, link, clock, limit, work=Work(OFFLOAD_WORK))
    # kept where it swapped a value out or traded a recomputation (read from the schedule, not
    # from the plan's report of it)
    if any(st.op == "offload" for st in best.statements) or best.details.get("recomputations_traded"):
        plans.append(best)


def _speed(p: Plan) -> tuple:
    """Fastest first (the fusion-aware prediction, or the additive cost on profiled graphs),
    then least peak, then the solver's name: a deterministic choice."""
    return (p.predicted_seconds, p.peak_bytes, p.solver)


def _frontier_plans(g: Graph, cm: CostModel, clock: Deadline, attempt) -> int:
    try:
        points = frontier(g, cm, time_limit=clock.share(FRONTIER_SHARE).left())
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
    seconds = clock.share(DESCENT_SHARE).limit

    def make() -> Plan:
        saved, _ = descend(g, start.saved_names, cm, budget=limit, time_limit=seconds,
                           trials=descent_trials(g))
        plan = Plan.from_saved_set(g, saved, solver="descent", details={"descended_from": start.solver})
        return plan.judge(limit, cm)

    attempt("descent", make)


def _done(best: Plan, plans: list[Plan], t0: float, points: int) -> Plan:
    return best.updated(tried=tuple(Attempt.of(p) for p in plans), solve_seconds=time.perf_counter() - t0,
                        details={"frontier_points": points})
