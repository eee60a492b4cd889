"""One registry of solvers, one signature, and the simulator as every solver's judge.

Every solver is a function ``fn(graph, *, budget=None, cost_model=None, time_limit=None,
**options) -> Plan`` registered here with its name, its family and whether it takes a budget
(``budget`` reaches it in bytes). :func:`request` reads the budget and checks the options
against the solver's own, once, into a :class:`~remat.solvers.request.Request` that the
layers pass down. :func:`solve` is how everything else calls a solver: it takes a request
(or makes one), resolves its budget in bytes for the graph, runs the solver, and
replays the plan's schedule in the simulator before returning it (a valid schedule, within
the budget), whatever the solver; a plan that does not fit raises
:class:`~remat.errors.InfeasibleBudgetError`. The PyTorch partitioners (``torch-mincut``,
``no-recompute``) are listed too, so that one list of names serves the API, the command
line and the benchmarks, but they run on captured fx graphs only (:mod:`remat.lower`).
"""

from __future__ import annotations

import difflib
import inspect
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..cost.model import CostModel, constant_bytes, default_cost_model
from ..errors import InfeasibleBudgetError, OptionError, PlanError, UnsupportedGraphError
from ..graph.graph import Graph
from ..graph.limits import check_plannable
from ..plans.budget import Budget, format_bytes
from ..plans.outcome import Attempt
from ..plans.plan import FEASIBLE_STATUSES, Plan
from .feasible import smallest_feasible, staged_schedules_run_as_planned
from .request import Request

DEFAULT_TIME_LIMIT = 60.0
"""Seconds a solver may search, per graph, unless told otherwise (API, CLI and bench alike)."""

FAMILIES = ("auto", "mincut", "checkmate", "baselines", "magis", "pytorch")
BUDGET_USE = ("none", "optional", "required")


@dataclass(frozen=True)
class SolverInfo:
    """A registered solver. ``budget``: ``"none"`` (plans without one), ``"optional"`` (judged
    against one when given) or ``"required"``. ``options``: the keyword options it takes
    beyond the common ones. ``fn`` is None for the PyTorch partitioners."""

    name: str
    family: str
    budget: str
    description: str
    fn: Callable[..., Plan] | None
    options: tuple[str, ...]

    @property
    def runs_on_graphs(self) -> bool:
        return self.fn is not None


_COMMON = ("budget", "cost_model", "time_limit")
_REGISTRY: dict[str, SolverInfo] = {}


def register(name: str, family: str, budget: str, description: str,
             fn: Callable[..., Plan] | None = None) -> None:
    """Add a solver; ``fn`` is None for the PyTorch partitioners (they run on fx graphs)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown solver family {family!r}; use one of {FAMILIES}")
    if budget not in BUDGET_USE:
        raise ValueError(f"budget use {budget!r}: one of {BUDGET_USE}")
    if name in _REGISTRY:
        raise ValueError(f"solver {name!r} registered twice")
    options: tuple[str, ...] = ()
    if fn is not None:
        params = inspect.signature(fn).parameters
        missing = [p for p in _COMMON if p not in params]
        if missing:
            raise TypeError(f"solver {name!r} must take keyword arguments {missing}")
        options = tuple(p for p, v in list(params.items())[1:]
                        if p not in _COMMON and v.kind is v.KEYWORD_ONLY)
    _REGISTRY[name] = SolverInfo(name, family, budget, description, fn, options)


def names(*, family: str | None = None, budget: bool | None = None, graphs: bool | None = None) -> list[str]:
    """Registered solver names: of a ``family``; that take a budget (``budget=True``) or plan
    without one (``False``); that run on a Graph (``graphs=True``)."""
    out = []
    for info in _REGISTRY.values():
        if family is not None and info.family != family:
            continue
        if budget is True and info.budget == "none" or budget is False and info.budget == "required":
            continue
        if graphs is not None and info.runs_on_graphs != graphs:
            continue
        out.append(info.name)
    return out


def info(name: str) -> SolverInfo:
    """The registered solver ``name``; :class:`OptionError` listing the names otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise OptionError(f"unknown solver {name!r}{hint}; solvers: {', '.join(_REGISTRY)}") from None


def check_options(name: str, options: dict[str, Any], budget: Any = None) -> SolverInfo:
    """The solver ``name``, after checking that it takes ``options`` and ``budget``."""
    s = info(name)
    unknown = sorted(set(options) - set(s.options))
    if unknown:
        valid = ", ".join(s.options) or "none"
        raise OptionError(f"solver {name!r} has no option {', '.join(map(repr, unknown))}; "
                          f"its options: {valid}")
    if budget is not None and s.budget == "none":
        takes = ", ".join(names(budget=True))
        raise OptionError(f"solver {name!r} does not take a memory budget; solvers that do: {takes}")
    if budget is None and s.budget == "required":
        raise OptionError(f"solver {name!r} needs a memory budget (budget='6GiB' or a fraction "
                          "such as 0.6); without one use 'auto' or a mincut solver")
    return s


def on_a_graph(s: SolverInfo) -> SolverInfo:
    """``s``, if it runs on a Graph; :class:`OptionError` for PyTorch's partitioners."""
    if not s.runs_on_graphs:
        raise OptionError(f"solver {s.name!r} is PyTorch's own partitioner: it runs on captured "
                          "PyTorch graphs (remat.compile / remat.plan on a model), not on a Graph")
    return s


def check_time_limit(time_limit: float | None) -> float | None:
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or time_limit != time_limit or time_limit < 0:  # NaN is not equal to itself
        raise OptionError(f"time_limit {str(time_limit)[:40]} must be a number of seconds >= 0 (or None: "
                          "no limit)")
    return math.inf if time_limit > 1e300 else float(time_limit)  # an int past float's range: no limit


def request(solver: str = "auto", *, budget: Budget | str | float | None = None,
            time_limit: float | None = DEFAULT_TIME_LIMIT, headroom: float = 0.0,
            cost_model: CostModel | None = None, options: Mapping[str, Any] | None = None,
            on_graphs: bool = True) -> Request:
    """The :class:`~remat.solvers.request.Request` for these settings, checked once: the
    solver and its ``options`` (:func:`check_options`), that it runs on a Graph (``on_graphs``;
    False where PyTorch's partitioners may run too, on captured graphs), the time limit, and
    the budget, read by :meth:`Budget.parse <remat.plans.budget.Budget.parse>` (a parsed
    :class:`~remat.plans.budget.Budget` is taken as it is). Raises
    :class:`~remat.errors.OptionError` or :class:`~remat.errors.BudgetError`."""
    if options is not None and not isinstance(options, Mapping):
        raise OptionError(f"solver_options must be a dict of the solver's options ({{'threads': 1}}), not "
                          f"{options!r}")
    options = dict(options or {})
    s = check_options(solver, options, budget)
    if on_graphs:
        on_a_graph(s)
    time_limit = check_time_limit(time_limit)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0.0 <= headroom < 1.0:
        raise OptionError(f"headroom {headroom!r} must be the share of a byte budget left free, in [0, 1) "
                          "(0.01: plan within 99%)")
    parsed = budget if budget is None or isinstance(budget, Budget) else Budget.parse(budget)
    return Request(solver, parsed, time_limit, options, float(headroom), cost_model)


def solve(graph: Graph, solver: str | Request = "auto", *, budget: Budget | str | float | None = None,
          cost_model: CostModel | None = None, time_limit: float | None = DEFAULT_TIME_LIMIT,
          headroom: float = 0.0, **options: Any) -> Plan:
    """Plan ``graph`` with ``solver``; returns a judged :class:`~remat.plans.Plan`.

    ``budget``: bytes (``"6GiB"``, ``6e9``), a fraction of the activation memory without
    recomputation (``0.6``) or ``"min"`` (the least peak the solver reaches), read by
    :class:`~remat.plans.budget.Budget`; ``headroom``: the share of a byte
    budget left free (:data:`~remat.plans.budget.TORCH_HEADROOM` on a real training step).
    ``solver`` may instead be a :class:`~remat.solvers.request.Request` made by
    :func:`request` (with no other keyword): a layer that holds one passes it down as it is.
    Raises :class:`~remat.errors.InfeasibleBudgetError` (with the smallest feasible budget
    found) when the plan does not fit, :class:`~remat.errors.OptionError` for an unknown
    solver or option, :class:`~remat.errors.PlanError` when the solver returns an invalid
    schedule, :class:`~remat.errors.UnsupportedGraphError` when the solver cannot plan a
    graph this large at all (Checkmate's ``max_columns``).

    >>> from remat.graph.examples import cos_cos_graph
    >>> solve(cos_cos_graph()).saved_names
    ['add_2']
    >>> p = solve(cos_cos_graph(), "checkmate", budget=1.0)
    >>> p.status, p.recomputes
    ('optimal', 0)
    """
    req = as_request(solver, budget=budget, cost_model=cost_model, time_limit=time_limit,
                     headroom=headroom, options=options)
    s = on_a_graph(info(req.solver))
    if not isinstance(graph, Graph):
        raise OptionError(f"remat.solve plans a remat Graph (remat.load_graph('graph.json'), or "
                          f"remat.plan(model, *inputs) for a model), not {type(graph).__name__}")
    check_plannable(graph)
    t0 = time.perf_counter()  # the time limit counts the budget's reference too
    cm = req.cost_model_for(graph)
    parsed, time_limit = req.budget, req.time_limit
    asked, limit = req.asked_bytes(graph), req.planned_bytes(graph)
    left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))
    plan = s.fn(graph, budget=limit, cost_model=cm, time_limit=left, **req.options)
    if parsed is not None and parsed.kind == "min":
        plan = _least(graph, s, plan, cm, time_limit, req.options, t0)
        if plan.peak_bytes is not None and plan.status != "invalid":
            asked = limit = plan.peak_bytes  # the least peak found is the budget asked for
    if plan.status == "too_large":
        # the solver cannot plan this graph at any budget: not a verdict on the budget (a
        # fraction that raised here crashed training; the partitioner falls back on this error)
        raise UnsupportedGraphError(f"{req.solver} cannot plan {graph.name!r}: {plan.message}")
    if plan.statements is not None and (plan.sim is None or plan.budget != limit):
        # the ensures of every solver: valid, and within the budget (a plan the simulator
        # already judged against this budget, as judged() does, is not replayed again); the
        # solver's plan is left as it is, the verdict is a new one
        plan = plan.updated().judge(limit, cm)
        if plan.status == "invalid":
            raise PlanError(f"{req.solver} returned an invalid schedule for {graph.name!r}: {plan.message}")
    budgets = None if parsed is None else {"budget": parsed.text, "budget_bytes": asked, "planned_bytes": limit}
    plan = plan.updated(solve_seconds=max(plan.solve_seconds, time.perf_counter() - t0),  # judging included
                        options=budgets)
    if parsed is not None:
        if not plan.feasible:
            left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))
            if plan.tried:  # auto searched already: the first points only
                left = 0.0
            raise infeasible(graph, plan, asked, limit, req.headroom, time_limit=left,
                             staged=req.solver != "auto" or staged_schedules_run_as_planned(cm))
    return plan  # a plan is frozen: the layers above report on new ones (Plan.updated)


def _least(graph: Graph, s: SolverInfo, plan: Plan, cm: CostModel, time_limit: float | None,
           options: Mapping[str, Any], t0: float) -> Plan:
    """For ``"min"``: the solver's plan asked for 0 bytes, as its least-peak plan. A plan
    made lazily (a saved set) is judged for its peak; a solver that returns no schedule for
    0 bytes (Checkmate's MILP: infeasible) is asked again for the smallest feasible budget the
    baselines find; a plan that said "over budget" at 0 bytes is feasible at its own peak."""
    if plan.statements is None and s.budget != "none":
        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - t0))
        floor, _ = smallest_feasible(graph, [plan], time_limit=left)
        plan = s.fn(graph, budget=floor, cost_model=cm, time_limit=left, **options)
    if plan.peak_bytes is None and plan.statements is not None:
        plan = plan.updated().judge(None, cm)  # a saved-set plan made lazily: its least peak is its peak
    if plan.status in FEASIBLE_STATUSES and "solver_status" in plan.details and plan.message:
        plan = plan.updated(message="", details={"solver_message": ""})  # "no schedule fits 0 bytes": not news
    if plan.peak_bytes is not None and plan.status != "invalid" and plan.status not in FEASIBLE_STATUSES:
        # asked for 0 bytes, it said so at its least peak: feasible there, and its message
        # ("over the budget of 0") no longer holds
        plan = plan.updated(status="feasible", message="",
                            details={"solver_status": plan.status, "solver_message": ""})
    return plan


def as_request(solver: str | Request, *, options: Mapping[str, Any], **settings: Any) -> Request:
    """``solver`` if it is a Request (then ``settings`` and ``options`` must be left as they
    default), else the request :func:`request` makes of them."""
    if not isinstance(solver, Request):
        return request(solver, options=options, **settings)
    given = sorted(k for k, v in settings.items() if v != _DEFAULTS[k]) + sorted(options)
    if given:
        raise TypeError(f"a Request carries its own settings: pass {', '.join(given)} to request(), "
                        "not beside it")
    return solver


_DEFAULTS = {"budget": None, "cost_model": None, "time_limit": DEFAULT_TIME_LIMIT, "headroom": 0.0}


def infeasible(g: Graph, plan: Plan, asked: int, limit: int, headroom: float, *,
               time_limit: float | None = None, staged: bool = True) -> InfeasibleBudgetError:
    """The error for a budget nothing fits: why, and the smallest feasible budget found within
    ``time_limit`` seconds (``staged``: staged schedules count; not where auto keeps to saved
    sets)."""
    peak, how = smallest_feasible(g, [plan], time_limit=time_limit, staged=staged)
    if headroom and limit < asked:
        peak = int(math.ceil(peak / (1.0 - headroom)))  # the budget that leaves the headroom free
    first = (plan.tried or (Attempt.of(plan),))[0]  # auto: the MILP's reason first
    reasons = f"{first.solver}: {first.status}" + (f", {first.message}" if first.message else "")
    others = len(plan.tried) - 1
    if others > 0:
        reasons += f"; none of the {others} other solvers fits either"
    room = f" (planned within {format_bytes(limit)}, {headroom:.0%} left free)" if limit < asked else ""
    return InfeasibleBudgetError(
        f"no schedule of {g.name!r} fits the budget of {format_bytes(asked)}{room} ({reasons}). The "
        f"smallest feasible budget found is {format_bytes(peak)} ({peak} bytes, by {how}); inputs "
        f"and parameters alone take {format_bytes(constant_bytes(g))}.",
        smallest_feasible=peak, plan=plan)
