"""Plans: what a solver decided for one graph, in a form people and programs can read.

A :class:`Plan` holds its :class:`~remat.plans.schedule.Schedule` (``plan.schedule()``: the
``compute``/``free`` statements that run the training step), the :class:`Decision` for every
forward value the backward uses, what the simulator found when it judged the schedule (peak
memory, predicted time, recomputations) and the solver's own report (status, cost, bounds,
solve time). Every solver returns one; every plan, however it was made, lowers to PyTorch
the same way (from its schedule). It renders a summary (``print(plan)``) and round-trips
through JSON (:meth:`Plan.to_dict` / :meth:`Plan.from_dict`), its schedule included.

>>> from remat.graph.examples import cos_cos_graph
>>> p = Plan.from_saved_set(cos_cos_graph(), ["add_2"], solver="example").judge()
>>> p.saved_names, p.decisions["add_2"], p.recomputed, p.feasible
(['add_2'], <Decision.SAVE: 'save'>, ['cos'], True)
>>> Plan.from_dict(p.to_dict()).to_dict() == p.to_dict()
True
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..cost.model import CostModel, default_cost_model
from ..cost.transfer import Link, link_for_graph
from ..errors import PlanError
from ..graph.fission import Fission
from ..graph.graph import Graph
from .budget import format_bytes
from .fission_text import describe_fission
from .outcome import Attempt, OutOfReach, TimeBound
from .phases import split_schedule
from .saved_set import backward_work
from .schedule import Schedule, Statement, schedule_from_saved_set
from .simulator import SimResult, simulate

PLAN_FORMAT = "remat.plan"
PLAN_VERSION = 5
"""3: fissions, swaps and the link are fields of their own (version 2 kept them in
``details``); 4: so are the attempts (``tried``), ``out_of_reach``, ``instead_of`` and the
time bound (``time_bound``: ``details["overhead"]`` and ``["within_overhead"]`` before); 5:
and what the layers around the solvers report, ``cache`` / ``cache_file``, ``fallback`` and
``transfers`` (``details`` holds the solver's own diagnostics alone).
:meth:`Plan.from_dict` reads all four versions."""
_READS = (2, 3, 4, 5)
_TYPED = ("fissions", "swaps", "link", "tried", "out_of_reach", "instead_of", "overhead", "within_overhead",
          "cache", "cache_file", "fallback", "transfers")
"""The fields that rode in ``details`` before version 5 (the first three before 3, the last
four before 5)."""


class Decision(str, Enum):
    """What happens to a forward value the backward uses. A closed set, as in JAX's
    checkpoint policies; the Schedule's statements say the same thing in order:

    - ``SAVE``: computed in the forward and kept until the backward reads it;
    - ``RECOMPUTE``: computed by the backward (again, or for the first time when the forward
      does not need it);
    - ``OFFLOAD``: copied to host memory and back before a later use (``offload``/``reload``
      statements; seeds/004's swapping: the ``swap`` and ``swap-recompute`` solvers);
    - ``SPLIT``: produced in parts along a dimension (fission; MAGIS, not produced yet).
    """

    SAVE = "save"
    RECOMPUTE = "recompute"
    OFFLOAD = "offload"
    SPLIT = "split"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SavedValue:
    """A value that crosses from the forward to the backward. ``role``: ``"input"``,
    ``"param"`` or ``"activation"``; ``module``: the submodule that computes it
    (``model.layers.1.mlp``), when capture knows it."""

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    role: str
    module: str | None = None


class PlanStatus(str, Enum):
    """What a solver (or the simulator, judging its schedule) says of a plan. A closed set: a
    plan's ``status`` is always one of these (a string naming one is read as it), and compares
    equal to its value (``plan.status == "feasible"``).

    - ``OPTIMAL``: proved the cheapest within its budget (the MILP, the min cut);
    - ``FEASIBLE``: within its budget, not proved optimal;
    - ``TIME_LIMIT``: the best found when the time limit stopped the search, within its budget;
    - ``OVER_BUDGET``: a valid schedule that peaks over its budget (the simulator's verdict);
    - ``INVALID``: a schedule the simulator cannot run;
    - ``INFEASIBLE``: the solver proved nothing fits;
    - ``NO_SOLUTION``: the solver stopped without a schedule;
    - ``TOO_LARGE``: the solver cannot plan a graph this large at any budget;
    - ``UNSUPPORTED``: the solver cannot plan this graph (its message says why);
    - ``SKIPPED``: not tried (a size or work rule; its message says which).
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIME_LIMIT = "time_limit"
    OVER_BUDGET = "over_budget"
    INVALID = "invalid"
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no_solution"
    TOO_LARGE = "too_large"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:  # shown as the string it equals (in tuples, reports, doctests)
        return repr(self.value)

    @classmethod
    def of(cls, value: "PlanStatus | str") -> "PlanStatus":
        """``value`` as a status, or a :class:`~remat.errors.PlanError` naming the statuses."""
        try:
            return cls(value)
        except ValueError:
            raise PlanError(f"unknown plan status {value!r}; statuses: "
                            + ", ".join(s.value for s in cls)) from None


FEASIBLE_STATUSES = (PlanStatus.OPTIMAL, PlanStatus.FEASIBLE, PlanStatus.TIME_LIMIT)
"""A plan with one of these statuses has a schedule within its budget (``time_limit``: the
best found when the time limit stopped the search)."""


@dataclass(frozen=True)
class Verdict:
    """The simulator's verdict on a plan's schedule (:meth:`Plan.judge`), as one value:
    ``valid`` (the schedule runs), ``feasible`` (valid and within its budget), ``peak_bytes``,
    ``compute_cost``, ``predicted_seconds``, ``recomputes``, ``budget`` (the bytes it was judged
    against; None: none)."""

    valid: bool
    feasible: bool
    peak_bytes: int | None
    compute_cost: float | None
    predicted_seconds: float | None
    recomputes: int | None
    budget: int | None


@dataclass(frozen=True)
class SolverReport:
    """What the solver said of its plan: its name, status, objective (``cost``), the bound the
    MILP proved and its gap, its message and its seconds."""

    solver: str
    status: PlanStatus
    cost: float | None
    lower_bound: float | None
    gap: float | None
    message: str
    solve_seconds: float


@dataclass(eq=False)
class Plan:
    """One graph's plan. Fields a solver reports: ``solver``, ``options``, ``status``,
    ``cost`` (the solver's own objective: the cut's bytes moved for the min cut, the additive
    compute cost for schedule solvers), ``lower_bound``/``gap`` (proved by the MILP),
    ``message``, ``solve_seconds``, ``banned`` (values the solver may not recompute, and why),
    ``details`` (solver diagnostics). Fields the simulator sets (:meth:`judge`):
    ``feasible``, ``peak_bytes``, ``compute_cost``, ``predicted_seconds``, ``recomputes``.
    Fields that say what crosses and what is computed again: ``saved`` (the values that cross
    from the forward to the backward, activations and the inputs and parameters the backward
    reads; for a plan made from a saved set, that set), ``decisions``, ``recomputed`` and
    ``moved_to_backward`` (computed only by the backward). Lowering passes exactly ``saved``
    to the backward and runs both phases in the schedule's order. ``budget`` is the byte budget it was asked to fit (None: none).
    What the plan splits, swaps and assumes: ``fissions`` (the regions it runs in parts,
    :class:`~remat.graph.fission.Fission`; its schedule names the parts), ``swaps`` (the gaps
    a swapping solver offloaded) and ``link`` (the host link its copies were planned over;
    None: the graph's default, :func:`remat.cost.transfer.link_for_graph`).
    How it was reached: ``tried`` (the :class:`~remat.plans.outcome.Attempt` s a solver made
    on the way, ``auto``'s portfolio and search), ``out_of_reach`` (an
    :class:`~remat.plans.outcome.OutOfReach` where the budget asked for was out of reach and
    this plan, the least memory found, runs instead) and ``instead_of`` (the solver of the plan
    that met the budget where the step planner runs ``"min"``'s plan in its place);
    ``time_bound`` (a :class:`~remat.plans.outcome.TimeBound`: the slowdown bound a
    least-memory plan was chosen within, and whether it keeps it).
    What the layers around the solver did: ``cache`` (``"hit"``, ``"miss"`` or ``"off"``: the
    plan cache, :mod:`remat.plans.cache`; None where the plan did not pass through it) and
    ``cache_file`` (its entry); ``fallback`` (why remat could not plan the graph, where PyTorch's
    partitioner ran instead: :mod:`remat.lower.fallback`); ``transfers`` (the copies to host
    memory a forward of PyTorch's offloading makes: the ``torch-offload`` solver).

    A plan is frozen once made: its fields, options, details, decisions and bans are
    read-only; :meth:`judge` and :meth:`updated` make new plans, and the layers above report on
    those.

    ``graph`` (the :class:`~remat.graph.Graph`), ``sim`` (the simulator's
    :class:`~remat.plans.simulator.SimResult`) and ``S`` (the checkpoint matrix over
    Checkmate's stages, when a staged solver made the plan; used for warm starts) travel
    with a plan in memory but are not part of its JSON.
    """

    graph_name: str
    solver: str
    statements: Sequence[Statement] | None
    options: dict[str, Any] = field(default_factory=dict)
    status: PlanStatus | str = PlanStatus.FEASIBLE
    feasible: bool = True
    cost: float | None = None
    solve_seconds: float = 0.0
    budget: int | None = None
    peak_bytes: int | None = None
    compute_cost: float | None = None
    predicted_seconds: float | None = None
    recomputes: int | None = None
    lower_bound: float | None = None
    gap: float | None = None
    message: str = ""
    decisions: dict[str, Decision] = field(default_factory=dict)
    saved: list[SavedValue] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)
    moved_to_backward: list[str] = field(default_factory=list)
    banned: dict[str, str] = field(default_factory=dict)
    fissions: tuple[Fission, ...] = ()
    swaps: int = 0
    link: Link | None = None
    tried: tuple[Attempt, ...] = ()
    out_of_reach: OutOfReach | None = None
    instead_of: str | None = None
    time_bound: TimeBound | None = None
    cache: str | None = None
    cache_file: str | None = None
    fallback: str | None = None
    transfers: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    graph: Graph | None = field(default=None, repr=False)
    sim: SimResult | None = field(default=None, repr=False)
    S: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.status = PlanStatus.of(self.status)
        # the typed fields from their JSON form, or from details where a plan of version 2 (or
        # a solver written before them) kept them
        legacy = {k: self.details[k] for k in _TYPED if k in self.details}
        if legacy:
            self.details = {k: v for k, v in self.details.items() if k not in _TYPED}
        fissions = self.fissions or legacy.get("fissions") or ()
        self.fissions = tuple(f if isinstance(f, Fission) else Fission.from_dict(f) for f in fissions)
        self.swaps = int(self.swaps or legacy.get("swaps") or 0)
        link = self.link if self.link is not None else legacy.get("link")
        self.link = link if link is None or isinstance(link, Link) else _link(link)
        self.tried = tuple(Attempt.from_dict(t) for t in (self.tried or legacy.get("tried") or ()))
        reach = self.out_of_reach if self.out_of_reach is not None else legacy.get("out_of_reach")
        self.out_of_reach = None if reach is None else OutOfReach.from_dict(reach)
        if self.instead_of is None and legacy.get("instead_of") is not None:
            self.instead_of = str(legacy["instead_of"])
        bound = self.time_bound
        if bound is None and isinstance(legacy.get("overhead"), Mapping):
            bound = {**legacy["overhead"], "met": legacy.get("within_overhead", True)}
        self.time_bound = None if bound is None else TimeBound.from_dict(bound)
        for name in ("cache", "cache_file", "fallback"):
            if getattr(self, name) is None and legacy.get(name) is not None:
                setattr(self, name, str(legacy[name]))
        if self.cache not in (None, "hit", "miss", "off"):
            raise ValueError(f"plan cache {self.cache!r} must be 'hit', 'miss', 'off' or None")
        transfers = self.transfers if self.transfers is not None else legacy.get("transfers")
        self.transfers = None if transfers is None else int(transfers)
        for name in ("options", "details", "decisions", "banned"):  # read-only from here on
            value = getattr(self, name)
            object.__setattr__(self, name, value if isinstance(value, _Sealed) else _Sealed(value))
        self.__dict__["_frozen"] = True

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_schedule(cls, schedule: Schedule, *, solver: str, **report: Any) -> "Plan":
        """The plan that runs ``schedule``; ``report``: the solver's fields (status, cost, ...).
        Its saved set and decisions are read off the schedule's two phases."""
        g = schedule.graph
        phases = split_schedule(schedule)
        computed_fwd = {s.node for s in phases.forward if s.op == "compute"}
        by_backward = sorted({s.node for s in phases.backward if s.op == "compute" and g[s.node].is_forward},
                             key=g.index)
        return cls._made(g, list(schedule.statements), solver, phases.saved,
                         [n for n in by_backward if n in computed_fwd],
                         [n for n in by_backward if n not in computed_fwd], report,
                         offloaded=schedule.offloaded)

    @classmethod
    def from_saved_set(cls, g: Graph, saved: Iterable[str], *, solver: str, **report: Any) -> "Plan":
        """The plan that saves ``saved`` and recomputes the rest, as PyTorch runs a partition:
        the backward computes every forward value it needs that is not saved
        (:func:`~remat.plans.saved_set.backward_work`; a forward output included), in the order
        of :func:`~remat.plans.schedule.schedule_from_saved_set`. A value of ``saved`` nothing
        the backward computes reads is not saved: inductor would hand it to the backward, which
        holds it to its end (a BLOOM plan's peak measured 1.8% above its prediction, which had
        freed it when the forward ended)."""
        saved = list(dict.fromkeys(saved))
        work = backward_work(g, saved)
        if work.unread:
            unread = set(work.unread)
            saved = [s for s in saved if s not in unread]
        recomputed = set(work.recomputed)
        statements = _Deferred(lambda: schedule_from_saved_set(g, saved).statements)
        return cls._made(g, statements, solver, saved, list(work.recomputed),
                         [c for c in work.computed if c not in recomputed], report)

    @classmethod
    def _made(cls, g: Graph, statements: Sequence[Statement], solver: str, saved: Iterable[str],
              recomputed: list[str], moved: list[str], report: dict, offloaded: Iterable[str] = ()) -> "Plan":
        saved = sorted(set(saved), key=g.index)
        decisions = {name: Decision.SAVE for name in saved if not g[name].is_primal}
        decisions.update((name, Decision.RECOMPUTE) for name in recomputed + moved)
        decisions.update((name, Decision.OFFLOAD) for name in offloaded)
        report = {**report, "details": {"nodes": len(g), **(report.get("details") or {})}}
        return cls(graph_name=g.name, solver=solver, statements=statements,
                   saved=[_saved_value(g[name]) for name in saved], decisions=decisions,
                   recomputed=sorted(recomputed, key=g.index), moved_to_backward=sorted(moved, key=g.index),
                   graph=g, **report)

    @classmethod
    def without_schedule(cls, g: Graph, *, solver: str, status: str, message: str = "",
                         **report: Any) -> "Plan":
        """A solver's answer when it found no schedule (infeasible, out of time, too large)."""
        return cls(graph_name=g.name, solver=solver, statements=None, status=status,
                   feasible=False, message=message, graph=g, **report)

    # -- the simulator's verdict -------------------------------------------------------------
    def judge(self, budget: float | None = None, cost_model: CostModel | None = None, *,
              sim: SimResult | None = None) -> "Plan":
        """A new plan: this one with the simulator's verdict on its schedule (:attr:`verdict`):
        feasible only if its schedule is valid and (with ``budget`` bytes) peaks within the
        budget. ``sim``: the simulator's result for this schedule under ``cost_model`` when the
        solver already has it (it is not replayed again). This plan is left as it is."""
        return dataclasses.replace(self, **self._verdict(budget, cost_model, sim))

    def _verdict(self, budget: float | None, cost_model: CostModel | None, sim: SimResult | None) -> dict:
        """The fields :meth:`judge` changes."""
        out: dict[str, Any] = {}
        if budget is not None:
            out["budget"] = int(budget) if math.isfinite(budget) else None
        if self.statements is None:
            return {**out, "feasible": False}
        if sim is None:
            sim = simulate(self.schedule(), cost_model or default_cost_model(self.graph), link=self.link)
        compute = float(sim.compute_cost)
        out.update(sim=sim, peak_bytes=int(sim.peak_bytes), compute_cost=compute,
                   predicted_seconds=float(sim.predicted_seconds), recomputes=int(sim.recomputes))
        if self.cost is None:
            out["cost"] = compute
        if self.lower_bound is not None and compute > 0:
            out["gap"] = max(0.0, (compute - self.lower_bound) / compute)
        details, status, message = dict(self.details), self.status, self.message
        if not sim.valid:
            feasible, status = False, "invalid"
            message = f"the solver returned an invalid schedule: {sim.errors[0]}"
        elif budget is not None and sim.peak_bytes > budget:
            if status != "over_budget":  # the solver's own verdict, if a larger budget fits
                details["solver_status"], details["solver_message"] = status, message
            feasible, status = False, "over_budget"
            own = details.get("solver_message")
            message = (f"schedule peaks at {sim.peak_bytes} bytes, over the budget of {int(budget)}"
                       + (f" ({own})" if own else ""))
        else:
            if status == "over_budget":  # judged again against a budget it fits
                status = details.pop("solver_status", "feasible")
            if "solver_message" in details:  # "over the budget of ..." no longer holds
                message = details.pop("solver_message")
            feasible = PlanStatus.of(status) in FEASIBLE_STATUSES
        return {**out, "details": details, "status": status, "message": message, "feasible": feasible}

    @property
    def verdict(self) -> Verdict | None:
        """The simulator's verdict (:meth:`judge`) as one value; None before it is judged."""
        if self.sim is None:
            return None
        return Verdict(bool(self.sim.valid), bool(self.feasible), self.peak_bytes, self.compute_cost,
                       self.predicted_seconds, self.recomputes, self.budget)

    @property
    def report(self) -> SolverReport:
        """What the solver said (:class:`SolverReport`)."""
        return SolverReport(self.solver, self.status, self.cost, self.lower_bound, self.gap, self.message,
                            self.solve_seconds)

    # -- views -------------------------------------------------------------------------------
    def schedule(self, graph: Graph | None = None) -> Schedule:
        """The statements that run this plan, on ``graph`` (default: the plan's own; a plan
        loaded from JSON needs the graph it was made for)."""
        if self.statements is None:
            raise PlanError(f"plan of {self.graph_name!r} by {self.solver} has no schedule "
                            f"({self.status}: {self.message or 'none found'})")
        g = graph if graph is not None else self.graph
        if g is None:
            raise PlanError(f"plan of {self.graph_name!r} has no graph: load the graph it was made "
                            "for and call plan.schedule(graph)")
        return Schedule(g, list(self.statements), {"solver": self.solver})

    def updated(self, *, options: Mapping[str, Any] | None = None, details: Mapping[str, Any] | None = None,
                **changes: Any) -> "Plan":
        """A new plan: this one with ``changes`` (fields) and ``options``/``details`` added to
        its own; this plan is left as it is."""
        if options:
            changes["options"] = {**self.options, **options}
        if details:
            own = {f.name for f in fields(self)}  # a key that is a field now (_TYPED) sets the field
            changes.update((k, v) for k, v in details.items() if k in _TYPED and k in own)
            details = {k: v for k, v in details.items() if not (k in _TYPED and k in own)}
            if details:
                changes["details"] = {**self.details, **details}
        return dataclasses.replace(self, **changes)

    def on_graph(self, graph: Graph) -> "Plan":
        """This plan's statements as a plan of ``graph``, a graph that holds the same names (the
        joint graph captured again with the plan's fissions unrolled): its saved set, decisions
        and recomputations read off ``graph``, all the solver reported kept; not judged."""
        made = Plan.from_schedule(Schedule(graph, list(self.statements)), solver=self.solver)
        read = ("graph_name", "statements", "decisions", "saved", "recomputed", "moved_to_backward", "graph")
        return dataclasses.replace(self, sim=None, **{name: getattr(made, name) for name in read})

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: the plan of {self.graph_name!r} is frozen; "
                "make a new one with plan.updated(...)")
        object.__setattr__(self, name, PlanStatus.of(value) if name == "status" else value)

    @property
    def saved_names(self) -> list[str]:
        return [s.name for s in self.saved]

    @property
    def saved_activations(self) -> list[SavedValue]:
        """The saved values that are activations (inputs and parameters are held anyway)."""
        return [s for s in self.saved if s.role == "activation"]

    @property
    def saved_activation_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved_activations)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    # -- serialization -----------------------------------------------------------------------
    _RUNTIME = ("graph", "sim", "S")

    def to_dict(self) -> dict[str, Any]:
        """Everything but the graph, the simulator's record and ``S``; JSON-ready."""
        d: dict[str, Any] = {"format": PLAN_FORMAT, "version": PLAN_VERSION}
        for f in fields(self):
            if f.name in self._RUNTIME:
                continue
            v = getattr(self, f.name)
            if f.name == "statements":
                d["schedule"] = None if v is None else [{"op": s.op, "node": s.node} for s in v]
            elif f.name == "saved":
                d["saved"] = [{"name": s.name, "shape": None if s.shape is None else list(s.shape),
                               "dtype": s.dtype, "nbytes": s.nbytes, "role": s.role, "module": s.module}
                              for s in v]
            elif f.name == "decisions":
                d["decisions"] = {k: x.value for k, x in v.items()}
            elif f.name == "fissions":
                d["fissions"] = [x.to_dict() for x in v]
            elif f.name == "status":
                d["status"] = v.value
            elif f.name == "tried":
                d["tried"] = [_jsonable(t.to_dict()) for t in v]
            elif f.name in ("out_of_reach", "time_bound"):
                d[f.name] = None if v is None else _jsonable(v.to_dict())
            elif f.name == "link":
                d["link"] = None if v is None else {"bandwidth": v.bandwidth, "asynchronous": v.asynchronous,
                                                    "latency": v.latency, "source": v.source}
            else:
                d[f.name] = _jsonable(v)
        d["saved_activation_bytes"] = self.saved_activation_bytes
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], graph: Graph | None = None) -> "Plan":
        """The plan :meth:`to_dict` wrote (``remat plan --json`` prints one; version 2 too);
        ``graph``, if given, is attached (and checked to hold every node the schedule names).
        A plan with ``fissions`` names their parts: its graph is the one with them applied
        (:func:`remat.transforms.fission.apply_fissions`; ``graph.meta["fissions"]``), which
        the caller builds."""
        if not isinstance(d, Mapping) or d.get("format") != PLAN_FORMAT:
            raise PlanError(f"not a remat plan: expected a JSON object with \"format\": \"{PLAN_FORMAT}\"")
        if d.get("version") not in _READS:
            raise PlanError(f"remat plan version {d.get('version')!r} is not supported; this remat "
                            f"reads versions {' and '.join(map(str, _READS))} (re-plan the graph to update it)")
        names = {f.name for f in fields(cls)} - set(cls._RUNTIME) - {"statements", "saved", "decisions"}
        kwargs = {k: d[k] for k in names if k in d}
        for key in ("graph_name", "solver"):
            if key not in d:
                raise PlanError(f"remat plan lacks {key!r}")
        sched = d.get("schedule")
        try:
            kwargs["statements"] = None if sched is None else [Statement(s["op"], s["node"]) for s in sched]
            kwargs["saved"] = [SavedValue(s["name"], None if s["shape"] is None else tuple(s["shape"]),
                                          s["dtype"], s["nbytes"], s["role"], s.get("module"))
                               for s in d.get("saved", [])]
            kwargs["decisions"] = {k: Decision(v) for k, v in d.get("decisions", {}).items()}
            kwargs["details"] = dict(kwargs.get("details") or {})
            plan = cls(**kwargs)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"malformed remat plan ({type(e).__name__}: {e})") from None
        if graph is not None:
            if plan.fissions and not (graph.meta or {}).get("fissions"):
                raise PlanError(f"the plan of {plan.graph_name!r} splits {len(plan.fissions)} regions of its "
                                "graph: pass the graph with its fissions applied "
                                "(remat.transforms.fission.apply_fissions(graph, plan.fissions))")
            plan = plan.updated(graph=graph)
            if plan.statements is not None:
                Schedule.from_list(graph, [(s.op, s.node) for s in plan.statements])  # names check
        return plan

    # -- rendering ---------------------------------------------------------------------------
    def summary(self, limit: int = 40) -> str:
        """A readable account: status, memory and time, then each saved activation with the
        module it comes from, and what the backward recomputes."""
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        nodes = self.details.get("nodes")
        head = (f"remat plan for {self.graph_name!r}" + (f" ({nodes} nodes)" if nodes else "")
                + f": {self.solver}" + (f" ({opts})" if opts else "") + f", {self.status}")
        lines = [head]
        if self.fallback:
            lines.append(f"  fell back to PyTorch's partitioner: remat could not plan this graph "
                         f"({self.fallback})")
        if self.message:
            lines.append(f"  {self.message}")
        facts = []
        if self.budget is not None:
            facts.append(f"budget {format_bytes(self.budget)}")
        if self.peak_bytes is not None:
            facts.append(f"simulated peak {format_bytes(self.peak_bytes)}")
        if self.recomputes is not None:
            facts.append(f"{self.recomputes} recomputations")
        facts.append(f"solved in {_seconds(self.solve_seconds)}")
        lines.append("  " + ", ".join(facts))
        off = [n for n, d in self.decisions.items() if d == Decision.OFFLOAD]
        if off:
            sim = self.sim
            copies = "" if sim is None else (f" ({sim.offloads} offloads, {sim.reloads} reloads; compute "
                                             f"waits {sim.wait_seconds:.3g} of {sim.predicted_seconds:.3g})")
            link = self.link or (link_for_graph(self.graph) if self.graph is not None else None)
            timed = bool((self.graph.meta or {}).get("device")) if self.graph is not None else True
            rate = "" if link is None else (f"{link.bandwidth / 1e9:.3g} GB/s" if timed
                                            else f"{link.bandwidth:.3g} bytes per cost unit")
            over = "" if link is None else f", over a {rate} link ({link.source})"
            lines.append(f"  offloaded to host memory: {len(off)} values{copies}{over}")
            lines += [f"    {line}" for line in offload_reasons(self)[:limit]]
        for f in self.fissions:
            outs = ", ".join(list(f.outputs)[:4]) + (", ..." if len(f.outputs) > 4 else "")
            what = describe_fission(self.graph, f) if self.graph is not None else f"{f.n} parts"
            lines.append(f"  split: {what} (a dimension of length {f.length}; {len(f.nodes)} "
                         f"ops, merged at {outs})")
        notes = (self.details or {}).get("search", {}).get("notes", [])
        if notes and not self.fissions:
            more = f" (and {len(notes) - 1} more)" if len(notes) > 1 else ""
            lines.append(f"  not split: {notes[0]}{more}")
        acts = self.saved_activations
        held = len(self.saved) - len(acts)
        lines.append(f"  saved for the backward: {len(acts)} activations, "
                     f"{format_bytes(self.saved_activation_bytes)}"
                     + (f" (and {held} inputs and parameters, held anyway)" if held else ""))
        if acts:
            width = max(len(s.name) for s in acts[:limit])
            mwidth = max([len(s.module or "") for s in acts[:limit]] + [6])
            for s in acts[:limit]:
                shape = "x".join(map(str, s.shape)) if s.shape is not None else "?"
                lines.append(f"    {s.name:<{width}}  {s.module or '':<{mwidth}}  {s.dtype or '?':<9} "
                             f"{shape:<18} {format_bytes(s.nbytes)}"
                             + ("  offloaded" if self.decisions.get(s.name) == Decision.OFFLOAD else ""))
            if len(acts) > limit:
                lines.append(f"    ... and {len(acts) - limit} more")
        lines.append(f"  recomputed in the backward: {len(self.recomputed)}"
                     + (f" ({', '.join(self.recomputed[:12])}{', ...' if len(self.recomputed) > 12 else ''})"
                        if self.recomputed else ""))
        if self.moved_to_backward:
            lines.append(f"  computed only in the backward: {len(self.moved_to_backward)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def offload_reasons(plan: "Plan") -> list[str]:
    """Why each value ``plan`` offloads is worth it, one line a value, from the simulator's
    two-stream times: its bytes, how long it stays off the device (from its free to its
    reload), whether the step's peak falls in that time, and what its copies cost compute
    (hidden behind compute, or the wait at its free and before its reader). Empty without a
    judged schedule."""
    sim, g = plan.sim, plan.graph
    if sim is None or g is None or plan.statements is None or len(sim.times) < len(plan.statements):
        return []
    _ms = _in_ms if (g.meta or {}).get("device") else (lambda t: f"{t:.3g} cost units")
    st = plan.statements
    out = []
    for k, s in enumerate(st):
        if s.op != "offload":
            continue
        free = next((j for j in range(k + 1, len(st)) if st[j].op == "free" and st[j].node == s.node), None)
        back = next((j for j in range(k + 1, len(st)) if st[j].op == "reload" and st[j].node == s.node), None)
        if free is None:
            continue
        t_free = sim.times[free][2]
        t_back = sim.times[back][1] if back is not None else sim.times[-1][2]
        at_peak = free < sim.peak_statement and (back is None or sim.peak_statement < back)
        stall = sim.times[free][2] - sim.times[free][1] if sim.times[free][0] == "wait" else 0.0
        copy = sim.times[k][2] - sim.times[k][1]
        cost = f"waits {_ms(stall)} at its free" if stall > 0 else "its copy hidden behind compute"
        out.append(f"{s.node}: {format_bytes(g[s.node].bytes)} off the device for {_ms(max(0.0, t_back - t_free))} "
                   f"(statements {free}-{back if back is not None else len(st)})"
                   + (", over the peak" if at_peak else "") + f"; copy {_ms(copy)} each way, {cost}")
    return out


class _Sealed(dict):
    """A sealed plan's options, details, decisions or bans: read-only (compared as a plain
    dict; pickled and copied read-only)."""

    def _refuse(self, *args: Any, **kwargs: Any):
        raise TypeError("a judged plan's options, details, decisions and bans are read-only: make a "
                        "new plan with plan.updated(options=..., details=...)")

    __setitem__ = __delitem__ = __ior__ = update = pop = popitem = setdefault = clear = _refuse

    def __reduce__(self):
        return _Sealed, (dict(self),)


class _Deferred(Sequence):
    """Statements made when first read: a saved-set plan (the min cut's) is ready before its
    schedule is needed, and planning a large graph does not wait for it."""

    def __init__(self, make: Callable[[], list[Statement]]) -> None:
        self._make, self._items = make, None

    def _get(self) -> list[Statement]:
        if self._items is None:
            self._items, self._make = self._make(), None
        return self._items

    def __getitem__(self, k):
        return self._get()[k]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self):
        return iter(self._get())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self._get()) == list(other)

    def __repr__(self) -> str:
        return repr(self._get()) if self._items is not None else "<statements made when first read>"


def _link(d: Mapping[str, Any]) -> Link:
    return Link(float(d["bandwidth"]), bool(d["asynchronous"]), float(d.get("latency", 0.0)),
                str(d.get("source", "")))


def _saved_value(node) -> SavedValue:
    module = node.meta.get("module") if node.meta else None
    return SavedValue(node.name, node.shape, node.dtype, node.bytes,
                      node.role if node.is_primal else "activation", module)


def _in_ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _jsonable(x: Any) -> Any:
    """Plain JSON values from numpy scalars, tuples and nested containers."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and not isinstance(x, (str, bytes)):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def judged(solver: str, g: Graph, budget: float | None, schedule: Schedule | None, *,
           solve_seconds: float, status: str, cost_model: CostModel | None = None,
           lower_bound: float | None = None, message: str = "", details: dict | None = None,
           sim: SimResult | None = None, S: Any = None) -> Plan:
    """A schedule solver's result: the plan of ``schedule`` (or none), judged by the simulator
    against ``budget`` bytes (None or infinite: no budget); ``sim``: the simulation of
    ``schedule`` the solver already made, if any; ``S``: a staged solver's checkpoint matrix."""
    report = dict(solve_seconds=solve_seconds, status=status, lower_bound=lower_bound,
                  message=message, details=dict(details or {}), S=S)
    if schedule is None:
        bounded = budget is not None and math.isfinite(budget)
        return Plan.without_schedule(g, solver=solver, budget=int(budget) if bounded else None, **report)
    return Plan.from_schedule(schedule, solver=solver, **report).judge(budget, cost_model, sim=sim)
