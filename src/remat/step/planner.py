"""The step planner: one graph of a training step planned within its share of one request.

Everything that decides which plan a graph of a step runs lives here, without torch; the
partitioner (:mod:`remat.lower.partitioner`) only captures the graph before and lowers the
plan after. For each graph, :meth:`StepPlanner.plan`:

1. takes the graph's share of the step's budget (:class:`~remat.step.budget.StepBudget`):
   none, ``"min"`` (the least memory), or bytes (a fraction's share is in bytes too);
2. solves it with the request's solver (:func:`remat.solvers.cached.cached_solve`: the plan
   cache first), with a fallback request where the solver offloads and the graph may not;
3. where the share is out of reach: a byte budget's first graph (or a fraction under
   ``strict=True``) is refused; otherwise the graph runs at the least memory remat finds,
   and the plan that runs is never slower than ``"min"``'s (:func:`out_of_reach`), with a
   warning naming the fraction reached, its floor and its predicted slowdown. A fraction's
   share is tried with ``auto``'s starting plans first; where none meets it, ``"min"``'s plan
   decides whether the search runs for it (only where min's plan meets it: the search for a
   share min misses is spared: a depth-32 Llama's first call at 0.5, out of reach, measured
   1.79x plain torch.compile's where it had been 2.96x, ``benchmarks/planner_scale.py
   --llama`` in BENCHMARKS.md);
4. a fraction of a step of several graphs is planned again so that it leaves the graphs
   after it their shares (:meth:`StepPlanner._leave_shares`);
5. a plan with fissions is split by the caller's ``split`` (the partitioner unrolls them on
   the joint graph and captures it again); where that fails, the graph is planned again
   without fission, with a warning;
6. the plan is recorded in the step (what it saves and its peak) for the graphs after it.

Whether the step needs PyTorch's own partition as its reference (:meth:`StepPlanner.needs_reference`)
is decided here too: only a fraction (its scale) and ``"min"`` / ``max_overhead`` (their time
bound's scale) need it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

from ..cost.model import constant_bytes, default_cost_model
from ..cost.transfer import offload_allowed
from ..errors import (InfeasibleBudgetError, RematBudgetWarning, RematError, RematFallbackWarning,
                      RematOffloadWarning, UnsupportedGraphError)
from ..graph.graph import Graph
from ..plans.budget import TORCH_HEADROOM, Budget, format_bytes, reference_seconds
from ..plans.outcome import OutOfReach
from ..plans.plan import Plan
from ..solvers import info
from ..solvers.auto import MIN_OVERHEAD, min_seconds
from ..solvers.cached import cached_solve
from ..solvers.feasible import staged_schedules_run_as_planned
from ..solvers.portfolio import bounded_seconds, is_staged
from ..solvers.progress import delayed, shown  # delayed: stages on stderr once planning takes > 2 s
from ..solvers.request import Request
from .budget import StepBudget, floor

OFFLOADING_SOLVERS = ("swap", "swap-recompute")
"""Solvers that offload by design (auto and magis offload only where plans may)."""

_warned: set[str] = set()

Split = Callable[[Plan], "tuple[Any, Plan]"]
"""What the caller does with a plan that has fissions: ``split(plan) -> (lowered, plan)``, the
graph it will lower with the fissions unrolled and the plan on it; a
:class:`~remat.errors.RematError` when the plan does not replay there."""


class StepPlanner:
    """Plans the graphs of one training step, in the order they run, within one request.

    ``request``: the solver, its options, the time limit and the step's budget, checked once at
    the API; ``step``: the budget's state across the step's graphs (one per step, shared with
    the fallback path); ``strict``: errors instead of fallbacks and warnings; ``cache``: the
    plan cache; ``verbose``: planning stages on stderr from the start (else after 2 s)."""

    def __init__(self, request: Request, *, step: StepBudget | None = None, strict: bool = False,
                 cache: bool = True, verbose: bool = False) -> None:
        self.request = request
        self.step = step if step is not None else StepBudget(request.budget, strict=strict)
        self.strict = strict
        self.cache = cache
        self.verbose = verbose

    @property
    def budget(self) -> Budget | None:
        return self.request.budget

    def needs_reference(self) -> bool:
        """Whether plans of this step need plain ``torch.compile``'s partition recorded on each
        graph (:data:`~remat.plans.budget.REFERENCE_SAVED`): a fraction is a share of its peak,
        and ``"min"`` / ``max_overhead`` bound time by its step. No budget and byte budgets do
        not: PyTorch's min cut is not run for them (at depth 32 it took longer than plain
        torch.compile's whole partitioner)."""
        b = self.budget
        if b is not None and b.kind in ("fraction", "min"):
            return True
        return self.request.options.get("max_overhead") is not None

    def plan(self, graph: Graph, split: Split | None = None) -> tuple[Any, Plan]:
        """Plan ``graph`` within its share of the step's budget (the module docstring's steps).
        Returns ``(lowered, plan)``: ``lowered`` is what ``split`` returned for a plan with
        fissions (None otherwise: the caller lowers the graph it captured)."""
        b = self.budget
        step = self.step
        share = step.share(graph, constant_bytes(graph)) if b is not None else None
        if share is None:
            budget, headroom = None, 0.0
        elif b.kind == "min":
            budget, headroom = Budget.least(), 0.0
        else:
            budget, headroom = Budget.of_bytes(max(1, share)), TORCH_HEADROOM if b.kind == "bytes" else 0.0
        req = base = self._solver_for(graph, self.request)
        target = b is not None and b.kind == "fraction" and req.solver == "auto" and not self.strict
        if target:  # a fraction is a target: what runs is within min's time bound
            req = fraction_request(graph, req)

        def solve_within(budget, headroom, on_infeasible=None, using=None):
            title = f"remat: planning {graph.name} ({len(graph)} nodes)"
            with shown(title) if self.verbose else delayed(title):
                return cached_solve(graph, (using or req).within(budget, headroom), cache=self.cache,
                                    on_infeasible=on_infeasible)

        def no_plan(e: InfeasibleBudgetError):
            """The solver found no plan at any budget (its time limit ran out first): remat
            cannot plan this graph, so it falls back, a fraction or "min" being a target."""
            raise UnsupportedGraphError(f"{req.solver} found no plan of {graph.name!r} at any "
                                        f"budget ({e.args[0]})") from e

        leasts: list[Plan] = []

        def least() -> Plan:
            """``"min"``'s plan of this graph (solved once per call)."""
            if not leasts:
                try:
                    leasts.append(solve_within(Budget.least(), 0.0, using=base))
                except InfeasibleBudgetError as again:
                    no_plan(again)
            return leasts[0]

        def least_instead(e: InfeasibleBudgetError) -> Plan:
            """What runs where the share is out of reach (stored in the plan cache with it)."""
            if step.may_refuse(graph):
                raise e  # a byte budget's first graph (or a fraction under strict=True)
            return out_of_reach(least_found(e), least())

        def reachable_only_by_search(e: InfeasibleBudgetError) -> Plan:
            """No starting plan meets a fraction's share: ``"min"``'s plan decides. Where it
            misses the share too, the share is out of reach and the least memory runs (stored
            in the plan cache with it; the search for the share is spared: what it found
            below min's plan was past min's time bound, or min's search should have found it).
            Where min's plan meets it, the search goes on for the fastest plan within it."""
            m = least()
            if m.peak_bytes is not None and m.peak_bytes <= share:
                raise _SearchOn
            return out_of_reach(least_found(e), m)

        on_infeasible = None if budget is None else no_plan if b.kind == "min" else least_instead
        if target:
            try:  # the starting plans first; the search only where min shows it can meet the share
                plan = solve_within(budget, headroom, reachable_only_by_search,
                                    using=req.using(options={**req.options, "search": False}))
            except _SearchOn:
                plan = solve_within(budget, headroom, on_infeasible)
        else:
            plan = solve_within(budget, headroom, on_infeasible)
        if plan.out_of_reach is not None:
            self._missed(graph, plan, share)
        elif budget is not None and b.kind != "min" and req.solver == "auto" and plan.feasible:
            plan = within_min_bound(graph, plan, least, fraction=b.kind == "fraction" and not self.strict)
            if plan.out_of_reach is not None:
                self._missed(graph, plan, share)
        if b is not None and b.kind == "fraction" and plan.feasible and step.followed(graph):
            plan = self._leave_shares(graph, plan, share, solve_within)
        lowered = None
        if split is not None and plan.fissions:
            try:
                lowered, plan = split(plan)
            except RematError as e:  # the plan without fission is as safe as any other
                if self.strict or "fission" not in info(req.solver).options:
                    raise
                warn_once(f"remat could not split {graph.name!r} as planned ({e}); planning it "
                          "without fission")
                req = req.using(options={**req.options, "fission": False})
                plan = solve_within(budget if plan.feasible or budget is None else Budget.least(), headroom,
                                    least_instead if budget is not None else None)
        if b is not None:
            # the budget asked for the step; budget_bytes is this graph's share of it
            plan = plan.updated(options={"budget": b.text, "step_graph": len(step.graphs) + 1})
        step.planned(graph, plan.saved_activation_bytes, plan.peak_bytes)
        self._warn_if_staged(graph)
        return lowered, plan

    def _missed(self, graph: Graph, plan: Plan, share: int) -> None:
        """``graph`` runs ``plan``, its least memory, having missed its share: refused now, or
        left to the step's verdict, or warned (see :class:`~remat.step.budget.StepBudget`)."""
        step, b = self.step, self.budget
        reach = plan.out_of_reach
        e = InfeasibleBudgetError(reach.message, reach.smallest_feasible, plan)
        if step.may_refuse(graph):
            raise e  # stored when this step did not refuse it (strict=False then)
        slower = slowdown(graph, plan) + (f" {reach.note}" if reach.note else "")
        if step.refuse_later(graph, e):  # the step's forward decides (StepBudget.verdict)
            step.floors.append(f"{floor(graph, plan)} {slower}")
        elif b.kind == "fraction" and len(step.graphs) == 0:
            warn_once(f"{step.missed(graph, plan)}. {slower}", RematBudgetWarning)
        else:
            warnings.warn(
                f"graph {graph.name!r} (graph {len(step.graphs) + 1} of its step) cannot meet its "
                f"share of the step's budget {b.text!r} ({format_bytes(share)}); it runs at "
                f"its least memory, {format_bytes(plan.peak_bytes)}, and the graphs after it get "
                f"{format_bytes(max(0, plan.peak_bytes - share))} less ({e.args[0][:200]})",
                RematBudgetWarning, stacklevel=3)

    def _leave_shares(self, graph: Graph, plan: Plan, share: int, solve_within) -> Plan:
        """A graph of a step of several, planned within its share of a fraction, whose plan
        saves more than its share of the reference's saved bytes (what the graphs after it
        hold: :meth:`~remat.step.budget.StepBudget.excess_saved`): planned again within its
        share less that excess, which leads the solvers to save less, at most twice; the plan
        that leaves the later graphs most is kept. A DDP step's second bucket at budget 1.0
        had saved 526 KB where PyTorch's partition saves 364 KB, and the step reached 1.08."""
        step = self.step
        for _ in range(2):
            over = step.excess_saved(graph, plan.saved_activation_bytes)
            if over <= 0:
                break
            try:
                tighter = solve_within(Budget.of_bytes(max(1, share - over)), 0.0)
            except InfeasibleBudgetError:
                break
            if step.excess_saved(graph, tighter.saved_activation_bytes) >= over:
                break
            plan = tighter
        return plan

    def _solver_for(self, graph: Graph, req: Request) -> Request:
        """The request asked for, or one for ``auto`` where its solver offloads by design and
        plans of ``graph`` may not offload (with one warning; strict mode raises instead)."""
        solver = req.solver
        allowed, why = offload_allowed(graph)
        if allowed or solver not in OFFLOADING_SOLVERS:
            return req
        if self.strict:
            raise RematError(f"solver {solver!r} offloads, and this step may not: {why} "
                             "(strict=True: no fallback; use another solver or offload=True)")
        warn_once(f"solver {solver!r} offloads, and this step may not ({why}); remat plans it "
                  "with 'auto', without offloading, instead", RematOffloadWarning)
        return req.using("auto", {k: v for k, v in req.options.items() if k in info("auto").options})

    def _warn_if_staged(self, graph: Graph) -> None:
        """A staged solver asked for by name under inductor: its schedule does not run as
        planned (:func:`remat.solvers.feasible.staged_schedules_run_as_planned`), so say so
        once; ``auto`` never picks one there."""
        solver = self.request.solver
        if info(solver).family not in ("checkmate", "baselines") or \
                staged_schedules_run_as_planned(default_cost_model(graph)) or solver in _warned:
            return
        _warned.add(solver)
        warnings.warn(
            f"solver {solver!r} recomputes values several times in the backward; inductor fuses "
            "those copies and runs them early, so the step can peak above the plan (a CNN under "
            "checkmate measured 4.90 MiB against a budget of 4.20 MiB). Use solver='auto', which "
            "keeps to saved sets under inductor, or compiler='eager'.", RematBudgetWarning, stacklevel=3)


class _SearchOn(Exception):
    """A fraction's starting plans missed its share and ``"min"``'s plan meets it: search."""


def fraction_request(graph: Graph, req: Request) -> Request:
    """``auto``'s request for a fraction of ``graph``'s reference: staged schedules only where
    one could be predicted within ``"min"``'s time bound (:func:`~remat.solvers.auto.min_seconds`),
    since a fraction runs one only there (:func:`within_min_bound`). Where plain torch.compile's
    step is no slower than recomputing nothing none can be, and the baselines' seconds are
    spared (depth-2 Llama at 0.5: 8.6 s to 1.9 s); where it is much slower (recorded from an
    offloading partition, say) they still run. Under ``strict=True`` a plan that meets a fraction runs rather than an error, so the
    step planner does not ask this there."""
    try:
        bound = min_seconds(graph)
    except Exception:  # noqa: BLE001 - no reference recorded: staged schedules as auto tries them
        return req
    return req.using(options={**req.options, "staged_within": bound})


def out_of_reach(found: Plan | None, least: Plan) -> Plan:
    """What a graph runs when its share of a budget is out of reach: ``least`` (``"min"``'s
    plan, the least memory within :data:`~remat.solvers.auto.MIN_OVERHEAD`), or ``found`` (the
    least peak the budgeted solve reached) where it is smaller and predicted no slower, so that
    asking for less never gives more memory than a fraction that is met (Mamba quick: 0.8 met
    at 0.70 of plain torch.compile's, 0.6 fell back to min's 0.91 when bounded) nor a slower
    step than ``"min"``'s (a LoRA Llama at 0.5 had run ``chen-sqrtn-linearized``, predicted
    18.1x, measured 9.7x and 64.2 MiB, where ``"min"`` measured 52.2 MiB at 1.87x). The warning
    says how much slower its step is predicted (:func:`slowdown`)."""
    if found is None or least.peak_bytes is None or found.peak_bytes >= least.peak_bytes:
        return least
    if bounded_seconds(found) > bounded_seconds(least):
        return least
    return found


def within_min_bound(graph: Graph, plan: Plan, least: Callable[[], Plan], *, fraction: bool = True) -> Plan:
    """What runs where ``auto`` met a budget with ``plan``: for a staged schedule (tried only
    where no saved set fits), ``"min"``'s plan where that fits too and is no slower
    (:func:`min_if_it_fits`); for a fraction (a target) met only by a plan predicted past
    ``"min"``'s time bound (:data:`~remat.solvers.auto.MIN_OVERHEAD`, a staged time counted with
    its penalty), ``"min"``'s plan as the fraction's least, out of reach
    (``plan.out_of_reach``, its note naming the plan and the byte budget that runs it).
    So ``"min"`` is the least memory any fraction runs, and asking for less never gives more:
    a depth-2 Llama at 0.5 had run ``chen-sqrtn-linearized``, predicted 2.7x plain
    torch.compile's step at 7.29 MiB (and 0.575 of its activation memory, measured 0.744),
    while 0.4, out of reach, ran ``"min"``'s 8.62 MiB. A byte budget keeps its plan: bytes are a
    guarantee, time is not. Otherwise ``plan``."""
    if is_staged(plan):
        instead = min_if_it_fits(plan, least)
        if instead is not plan:
            return instead
    if not fraction:
        return plan
    try:
        bound = min_seconds(graph)
    except Exception:  # noqa: BLE001 - no reference step to bound by: the plan met runs
        return plan
    if bounded_seconds(plan) <= bound * (1 + 1e-9):
        return plan
    try:
        m = least()
    except RematError:
        return plan
    if m.peak_bytes is None:
        return plan
    kind = "a staged schedule" if is_staged(plan) else "a plan"
    asked = math.ceil(plan.peak_bytes / (1 - TORCH_HEADROOM))  # remat.compile plans within 99% of bytes
    note = (f"Only {kind} ({plan.solver}, {format_bytes(plan.peak_bytes)}) meets it, predicted "
            f"{bounded_seconds(plan) / max(bound / (1 + MIN_OVERHEAD), 1e-30):.1f}x plain torch.compile's step, past min's "
            f"{1 + MIN_OVERHEAD:g}x; budget={asked} (bytes) runs it.")
    return m.updated(out_of_reach=OutOfReach(f"only {kind} ({plan.solver}) meets it, past min's time bound",
                                             plan.peak_bytes, note), instead_of=plan.solver)


def min_if_it_fits(plan: Plan, least: Callable[[], Plan]) -> Plan:
    """A staged schedule met a budget (``auto`` tries one only where no saved set fits):
    ``"min"``'s plan (``least()``: the least memory within its time bound, which the search may
    reach where the budgeted portfolio did not) runs instead where it fits the same budget and
    is predicted no slower, the staged time counted with its penalty. Random joint graphs had
    0.9 met by Checkmate's MILP at a larger peak and a slower step than ``"min"``'s plan."""
    try:
        m = least()
    except RematError:
        return plan
    asked = plan.options.get("planned_bytes", plan.budget)
    if m.peak_bytes is None or asked is None or m.statements is None or m.peak_bytes > asked \
            or bounded_seconds(m) > bounded_seconds(plan):
        return plan
    judged = m.judge(asked)  # min's plan as a plan of this budget (judged against its bytes)
    if not judged.feasible or bounded_seconds(judged) > bounded_seconds(plan):
        return plan
    return judged.updated(options={k: plan.options[k] for k in ("budget_bytes", "planned_bytes")
                                   if k in plan.options}, instead_of=plan.solver)


def slowdown(graph: Graph, plan: Plan) -> str:
    """How much slower than plain torch.compile's ``plan``'s step is predicted (a staged
    schedule's time counted :data:`~remat.solvers.portfolio.STAGED_PENALTY` times, its
    prediction the least reliable), and, past ``min``'s bound, what to ask for instead."""
    try:
        ratio = bounded_seconds(plan) / reference_seconds(graph, default_cost_model(graph))
    except Exception:  # noqa: BLE001 - a figure for the warning only
        return ""
    if ratio <= 1.0 + MIN_OVERHEAD:
        return f"Its step is predicted {ratio:.2f}x plain torch.compile's."
    return (f"Its step is predicted {ratio:.1f}x plain torch.compile's: budget='min' keeps the "
            f"step within {1 + MIN_OVERHEAD:g}x for more memory.")


def least_found(e: InfeasibleBudgetError) -> Plan | None:
    """The plan of least peak the solve that missed the budget found, as a plan to run
    (feasible at its own peak), or None where it has no valid schedule
    (:func:`out_of_reach` decides)."""
    p = e.plan
    if p is None or p.statements is None or p.peak_bytes is None or p.status == "invalid" \
            or p.sim is None or not p.sim.valid:
        return None
    return p.updated(status="feasible", feasible=True, budget=p.peak_bytes, message="",
                     options={"budget_bytes": p.peak_bytes, "planned_bytes": p.peak_bytes},
                     details={"solver_status": p.status, "missed_budget": p.budget})


def warn_once(text: str, category: type[Warning] = RematFallbackWarning) -> None:
    """Warn ``text`` once per process."""
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, category, stacklevel=3)
