"""The memory/time frontier of one graph: every (peak, predicted step time) point remat finds,
the non-dominated ones, and the point each budget picks (no torch).

:func:`tradeoff` runs the real :func:`remat.solve` for each budget a user may ask: none, each
fraction of the activation memory, ``"min"`` and each ``max_overhead``. Every judged, valid
plan those solves return, and every plan they tried (the portfolio's and the search's
``plan.tried``: numbers only, kept ``"summary"``), is a candidate point; the points are
the candidates no other is at least as small and as fast as. Each budget's pick is what
:func:`remat.solve` returned for it (for a fraction nothing reaches, the least peak it found),
with whether it met its budget, whether it is on the frontier or dominated (a finding: the
budget could have had as little memory for less time), and the frontier point that budget
would best have picked: the fastest within a memory budget, the least memory within a time
bound.

>>> from remat.graph.examples import offload_chain
>>> t = tradeoff(offload_chain(), fractions=(1.0, 0.8))
>>> [(p.peak_bytes, p.predicted_seconds) for p in t.points]
[(500, 16.0), (600, 9.0), (700, 8.0)]
>>> [(k.budget, k.peak_bytes, k.met) for k in t.picks]
[('none', 700, True), ('1.0', 700, True), ('0.8', 500, True), ('min', 500, True), ('overhead 0.1', 700, True)]
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Iterable, Mapping, Sequence

from ..cost.model import CostModel, default_cost_model
from ..errors import InfeasibleBudgetError, OptionError, RematError
from ..graph.graph import Graph
from ..plans.budget import (Budget, activation_bytes, format_bytes, reference_name, reference_peak, reference_seconds,
                            resident_bytes)
from ..plans.plan import Plan
from ..solvers.auto import MIN_OVERHEAD, min_seconds
from ..solvers.magis.search import check_overhead
from ..solvers.portfolio import STAGED_PENALTY, bounded_seconds
from ..solvers.progress import report
from ..solvers.registry import info, on_a_graph, solve
from .planner import out_of_reach, within_min_bound

FORMAT = "remat.tradeoff"
VERSION = 1

FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
"""The fractions of plain ``torch.compile``'s activation memory :func:`tradeoff` asks by default."""

OVERHEADS = (0.1,)
"""The ``max_overhead`` values :func:`tradeoff` asks by default."""

SAME = 1e-9
"""Two predicted times this close (relative) are the same time: one point, not two."""

_NO_POINT = ("invalid", "unsupported", "too_large")
"""Statuses of a tried plan that is not a point (no valid schedule)."""


@dataclass(frozen=True)
class Point:
    """One (peak, predicted step time) plan remat found. ``fraction``: its peak above the
    resident inputs and parameters, as a share of the activation memory (what a fractional
    budget bounds); ``ratio``: its predicted step time over the reference's. ``kept``:
    ``"plan"`` (``plan`` is the judged :class:`~remat.plans.Plan`) or ``"summary"`` (a plan a
    solve tried, of which only its numbers are kept). ``found_by``: the budgets whose solves
    found it."""

    peak_bytes: int
    predicted_seconds: float
    solver: str
    fraction: float
    ratio: float
    kept: str
    found_by: tuple[str, ...] = ()
    plan: Plan | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "predicted_seconds": self.predicted_seconds,
                "solver": self.solver, "fraction": self.fraction, "ratio": self.ratio,
                "kept": self.kept, "found_by": list(self.found_by)}


@dataclass(frozen=True)
class Pick:
    """What :func:`remat.solve` returned for one budget. ``kind``: ``"none"``, ``"fraction"``,
    ``"min"`` or ``"overhead"``; ``bound_bytes``: a fraction's budget in bytes;
    ``bound_seconds``: the time bound of an overhead, and of ``"min"`` under ``auto``
    (:data:`~remat.solvers.auto.MIN_OVERHEAD`; other solvers' ``"min"`` has none). ``met``:
    within its bound; ``out_of_reach``: a fraction no plan reached (the pick is then the least
    peak the solve found) or a time bound the pick is over. ``on_frontier``: no point is as
    small and as fast (None without a plan); ``dominated_by``: else the index in
    :attr:`Tradeoff.points` of the point that dominates it (for a memory budget the fastest of
    those, for a time bound the smallest); ``best``: the plan that budget would best pick among
    all found, a :class:`Point` (the fastest within a memory budget, the least memory within a
    time bound; None: none qualifies, or no budget). ``runs_min``: a fraction where
    ``remat.compile``, planning a step of this one graph, runs ``"min"``'s plan instead of this
    pick (:func:`runs_min`)."""

    budget: str
    kind: str
    value: float | None
    solver: str | None
    peak_bytes: int | None
    predicted_seconds: float | None
    fraction: float | None
    ratio: float | None
    met: bool
    out_of_reach: bool
    on_frontier: bool | None
    dominated_by: int | None = None
    best: Point | None = None
    bound_bytes: int | None = None
    bound_seconds: float | None = None
    runs_min: bool = False
    message: str = ""
    plan: Plan | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "budget", "kind", "value", "solver", "peak_bytes", "predicted_seconds", "fraction", "ratio",
            "met", "out_of_reach", "on_frontier", "dominated_by", "bound_bytes", "bound_seconds",
            "runs_min", "message")}
        out["best"] = None if self.best is None else self.best.to_dict()
        return out

    @property
    def best_is_better(self) -> bool:
        """Whether :attr:`best` beats the pick for its budget: faster within a fraction's
        bytes, or less memory within a time bound (a finding: remat's solve missed it)."""
        b = self.best
        if b is None or self.peak_bytes is None:
            return False
        if self.kind == "fraction":
            return b.predicted_seconds < self.predicted_seconds * (1 - SAME)
        if self.kind in ("min", "overhead"):
            return b.peak_bytes < self.peak_bytes
        return False


@dataclass(frozen=True, repr=False)
class Tradeoff:
    """A graph's frontier (:func:`tradeoff`): ``points`` (non-dominated, least peak first),
    ``picks`` (one per budget asked, in the order asked), ``reference`` (plain
    ``torch.compile``'s predicted peak and step time: ``name``, ``peak_bytes``,
    ``predicted_seconds``), the graph's ``resident_bytes`` and ``activation_bytes`` (the scale
    of a fraction), ``candidates`` (valid plans judged, duplicates included), ``seconds``
    (the time the solves took) and the ``graph`` itself (not in :meth:`to_dict`). Prints as
    :meth:`table`."""

    graph_name: str
    nodes: int
    solver: str
    points: tuple[Point, ...]
    picks: tuple[Pick, ...]
    reference: Mapping[str, Any]
    resident_bytes: int
    activation_bytes: int
    candidates: int
    seconds: float
    graph: Graph | None = field(default=None, compare=False)

    def pick(self, budget: str) -> Pick:
        """The pick for ``budget`` as labelled in :attr:`picks` (``"none"``, ``"0.6"``,
        ``"min"``, ``"overhead 0.1"``)."""
        for k in self.picks:
            if k.budget == budget:
                return k
        raise KeyError(f"no pick for budget {budget!r}; asked: {', '.join(k.budget for k in self.picks)}")

    def to_dict(self) -> dict[str, Any]:
        """The frontier as JSON-ready data (``format`` and ``version`` first)."""
        return {"format": FORMAT, "version": VERSION, "graph": self.graph_name, "nodes": self.nodes,
                "solver": self.solver, "reference": dict(self.reference),
                "resident_bytes": self.resident_bytes, "activation_bytes": self.activation_bytes,
                "candidates": self.candidates, "seconds": self.seconds,
                "points": [p.to_dict() for p in self.points], "picks": [k.to_dict() for k in self.picks]}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def table(self) -> str:
        """The points, then the picks, as text (peaks in MiB; ``act``: the share of the
        activation memory; ``step``: predicted step time over the reference's)."""
        ref = self.reference
        unit, size = size_unit(ref["peak_bytes"])
        lines = [f"frontier of {self.graph_name!r} ({self.nodes} nodes), solver {self.solver}: "
                 f"{len(self.points)} points of {self.candidates} plans judged, in {self.seconds:.1f} s",
                 f"  reference ({ref['name']}): peak {format_bytes(ref['peak_bytes'])}, step "
                 f"{ref['predicted_seconds']:.4g} s predicted; resident {format_bytes(self.resident_bytes)}, "
                 f"activations {format_bytes(self.activation_bytes)}",
                 f"  {'#':>2}  {'peak ' + unit:>9}  {'act':>5}  {'step':>6}  {'solver':<22} {'kept':<8} picked by"]
        picked: dict[int, list[str]] = {}
        for k in self.picks:
            i = self._index(k)
            if i is not None:
                picked.setdefault(i, []).append(k.budget)
        for i, p in enumerate(self.points):
            lines.append(f"  {i:>2}  {size(p.peak_bytes):>9}  {p.fraction:>5.2f}  {p.ratio:>5.3f}x  "
                         f"{p.solver:<22} {p.kept:<8} {', '.join(picked.get(i, []))}")
        lines.append(f"  {'budget':<13} {'peak ' + unit:>9}  {'act':>5}  {'step':>6}  {'solver':<22} verdict")
        for k in self.picks:
            if k.peak_bytes is None:
                lines.append(f"  {k.budget:<13} {'-':>9}  {'-':>5}  {'-':>6}  {k.solver or '-':<22} "
                             f"no plan: {k.message}")
                continue
            lines.append(f"  {k.budget:<13} {size(k.peak_bytes):>9}  {k.fraction:>5.2f}  {k.ratio:>5.3f}x  "
                         f"{k.solver:<22} {self._verdict(k)}")
        return "\n".join(lines)

    def _index(self, k: Pick) -> int | None:
        if k.peak_bytes is None or not k.on_frontier:
            return None
        for i, p in enumerate(self.points):
            if _same(p.peak_bytes, p.predicted_seconds, k.peak_bytes, k.predicted_seconds):
                return i
        return None

    def _verdict(self, k: Pick) -> str:
        if k.kind == "fraction":
            what = "met" if k.met else f"out of reach (least found {k.fraction:.2f})"
        elif k.kind in ("min", "overhead") and k.bound_seconds is not None:
            what = "within its time bound" if k.met else "over its time bound"
        elif k.kind == "min":
            what = "the least memory (no time bound)"
        else:
            what = "no budget"
        if k.on_frontier:
            what += f", on the frontier (#{self._index(k)})"
        elif k.dominated_by is not None:
            d = self.points[k.dominated_by]
            what += f", DOMINATED by #{k.dominated_by} ({format_bytes(d.peak_bytes)}, {d.ratio:.3f}x)"
            if k.bound_seconds is not None and _staged(d):
                what += f" (staged: a time bound counts its time {STAGED_PENALTY:g}x)"
        if k.best_is_better:
            b = k.best
            better = "faster within the budget" if k.kind == "fraction" else "less memory within the bound"
            what += f"; {better}: {b.solver} ({format_bytes(b.peak_bytes)}, {b.ratio:.3f}x)"
        if k.runs_min:
            what += "; remat.compile runs min's plan instead"
        return what

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (f"Tradeoff({self.graph_name!r}: {len(self.points)} points, "
                f"{sum(not k.on_frontier for k in self.picks if k.peak_bytes is not None)} dominated picks)")


def _finite(x: Any) -> Any:
    """``x`` with NaN and infinities as None (a graph whose reference takes no time has no
    step ratios): JSON has no NaN."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class Tradeoffs(list):
    """The frontiers of a step's graphs (:func:`remat.frontier`): a list of :class:`Tradeoff`
    that prints as their tables."""

    def table(self) -> str:
        return "\n\n".join(t.table() for t in self)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT + "s", "version": VERSION, "graphs": [t.to_dict() for t in self]}

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(_finite(self.to_dict()), indent=indent)

    def __str__(self) -> str:
        return self.table()


def tradeoff(g: Graph, *, solver: str = "auto", fractions: Iterable[float | str] = FRACTIONS,
             overheads: Iterable[float] = OVERHEADS, cost_model: CostModel | None = None,
             time_limit: float | None = None, solver_options: Mapping[str, Any] | None = None) -> Tradeoff:
    """The memory/time frontier of ``g`` under ``solver`` (see the module docstring): the
    solves with no budget (where the solver plans without one), each of ``fractions`` (of
    plain ``torch.compile``'s activation memory, :class:`~remat.plans.budget.Budget`),
    ``"min"``, and each ``max_overhead`` of ``overheads`` (where the solver takes one), each
    within ``time_limit`` seconds (None: no limit), with ``solver_options``. Raises
    :class:`~remat.errors.OptionError` for a solver that does not run on a Graph or a fraction
    that is not one."""
    s = on_a_graph(info(solver))
    options = dict(solver_options or {})
    if "max_overhead" in options:
        raise OptionError("tradeoff asks each max_overhead itself: pass overheads=(...), not "
                          "max_overhead in solver_options")
    asks = _asks(s, fractions, overheads)
    t0 = time.perf_counter()
    cm = cost_model or default_cost_model(g)
    resident, scale = resident_bytes(g), activation_bytes(g)
    ref_seconds = reference_seconds(g, cm)
    ref = {"name": reference_name(g), "peak_bytes": reference_peak(g), "predicted_seconds": ref_seconds}

    def fraction(peak: int) -> float:
        return (peak - resident) / scale

    def ratio(seconds: float) -> float:
        return seconds / ref_seconds if ref_seconds > 0 else float("nan")

    found: list[Point] = []

    def collect(label: str, plan: Plan | None) -> None:
        if plan is None:
            return
        if plan.statements is not None and plan.sim is not None and plan.sim.valid and plan.peak_bytes is not None:
            found.append(Point(plan.peak_bytes, plan.predicted_seconds, plan.solver, fraction(plan.peak_bytes),
                               ratio(plan.predicted_seconds), "plan", (label,), plan))
        for t in plan.tried:
            if t.status in _NO_POINT or t.peak_bytes is None or t.predicted_seconds is None:
                continue
            found.append(Point(int(t.peak_bytes), float(t.predicted_seconds), t.solver,
                               fraction(int(t.peak_bytes)), ratio(float(t.predicted_seconds)),
                               "summary", (label,)))

    def solved(budget: Budget | None, extra: dict) -> tuple[Plan | None, bool, str]:
        try:
            return solve(g, solver, budget=budget, cost_model=cost_model, time_limit=time_limit,
                         **options, **extra), True, ""
        except InfeasibleBudgetError as e:
            return e.plan, False, (f"smallest feasible budget found {format_bytes(e.smallest_feasible)}"
                                   if e.smallest_feasible is not None else str(e)[:200])
        except RematError as e:  # this solver cannot plan the graph for this budget
            return None, False, str(e)[:200]

    leasts: list[tuple[Plan | None, bool, str]] = []

    def least_solved() -> tuple[Plan | None, bool, str]:
        if not leasts:
            leasts.append(solved(Budget.least(), {}))
        return leasts[0]

    min_bound = min_seconds(g, cm)
    raw: list[tuple[str, str, float | None, Budget | None, Plan | None, bool, str]] = []
    for i, (label, kind, value) in enumerate(asks):
        report(f"{g.name}: the frontier, budget {label} ({i + 1} of {len(asks)})")
        budget = Budget.least() if kind == "min" else Budget.parse(value) if kind == "fraction" else None
        if kind == "min":
            plan, reached, message = least_solved()
        elif kind == "fraction" and solver == "auto":  # as the step planner asks for a fraction
            plan, reached, message = solved(budget, {"staged_within": min_bound, "search": False})
            m = least_solved()[0] if not reached and plan is not None else None
            if m is not None and m.peak_bytes is not None and m.peak_bytes <= budget.bytes_for(g):
                plan, reached, message = solved(budget, {"staged_within": min_bound})  # min meets it: search
        else:
            plan, reached, message = solved(budget, {"max_overhead": value} if kind == "overhead" else {})
        collect(label, plan)
        raw.append((label, kind, value, budget, plan, reached, message))

    merged = _merged(found)
    points = _non_dominated(merged)
    least = leasts[0][0] if leasts else None
    picks = []
    for label, kind, value, budget, plan, reached, message in raw:
        bound_bytes = budget.bytes_for(g) if budget is not None and kind == "fraction" else None
        # "min" is bounded in time under auto only (MIN_OVERHEAD); other solvers' is their least peak
        overhead = value if kind == "overhead" else MIN_OVERHEAD if kind == "min" and solver == "auto" else None
        bound_seconds = None if overhead is None else ref_seconds * (1 + overhead)
        picks.append(_pick(label, kind, value, plan, reached, message, points, merged, bound_bytes,
                           bound_seconds, least, min_bound, fraction, ratio, solver))
    return Tradeoff(g.name, len(g), solver, tuple(points), tuple(picks), ref, resident, scale, len(found),
                    time.perf_counter() - t0, g)


def _asks(s, fractions: Iterable[float | str], overheads: Iterable[float]) -> list[tuple[str, str, Any]]:
    """The budgets asked, as ``(label, kind, value)``: none (where ``s`` plans without a
    budget), each fraction (where it takes one), ``"min"``, each overhead (where it takes
    ``max_overhead``)."""
    asks: list[tuple[str, str, Any]] = []
    if s.budget != "required":
        asks.append(("none", "none", None))
    if s.budget != "none":
        for f in fractions:
            b = Budget.parse(f)
            if b.kind != "fraction":
                raise OptionError(f"fractions: {f!r} is not a fraction in (0, 1] of the activation memory "
                                  "(min is always asked; byte budgets go to remat.solve)")
            label = b.text
            if label not in {a[0] for a in asks}:
                asks.append((label, "fraction", b.value))
        asks.append(("min", "min", None))
    if "max_overhead" in s.options:
        for x in overheads:
            check_overhead(x)
            label = f"overhead {x:g}"
            if label not in {a[0] for a in asks}:
                asks.append((label, "overhead", float(x)))
    return asks


def _same(peak_a: int, sec_a: float, peak_b: int, sec_b: float) -> bool:
    return peak_a == peak_b and abs(sec_a - sec_b) <= SAME * max(abs(sec_a), abs(sec_b))


def dominates(a: Point | Pick, b: Point | Pick) -> bool:
    """``a`` is at least as small and as fast as ``b`` and not the same point (times within
    :data:`SAME` of each other are the same time)."""
    if _same(a.peak_bytes, a.predicted_seconds, b.peak_bytes, b.predicted_seconds):
        return False
    return a.peak_bytes <= b.peak_bytes and \
        a.predicted_seconds <= b.predicted_seconds + SAME * max(abs(a.predicted_seconds), abs(b.predicted_seconds))


def _merged(found: Sequence[Point]) -> list[Point]:
    """``found`` with the same points merged into one (``found_by`` joined): the one kept is a
    full plan over a summary, then a saved set over a staged schedule (whose time a time bound
    counts :data:`~remat.solvers.portfolio.STAGED_PENALTY` times), then the first found."""
    merged: list[Point] = []
    for p in found:
        for j, q in enumerate(merged):
            if _same(p.peak_bytes, p.predicted_seconds, q.peak_bytes, q.predicted_seconds):
                keep = p if _preferred(p) < _preferred(q) else q
                by = tuple(dict.fromkeys(q.found_by + p.found_by))
                merged[j] = Point(keep.peak_bytes, keep.predicted_seconds, keep.solver, keep.fraction, keep.ratio,
                                  keep.kept, by, keep.plan)
                break
        else:
            merged.append(p)
    return merged


def _preferred(p: Point) -> tuple[bool, bool]:
    return (p.kept != "plan", _staged(p))


def _staged(p: Point | Pick) -> bool:
    """A staged schedule (a baseline's, the MILP's): a time bound counts its time
    :data:`~remat.solvers.portfolio.STAGED_PENALTY` times (:func:`~remat.solvers.portfolio.bounded_seconds`)."""
    return p.solver is not None and bounded_seconds(p) > p.predicted_seconds


def _non_dominated(merged: Sequence[Point]) -> list[Point]:
    """The points of ``merged`` (no two the same) no other dominates, least peak first."""
    front = [p for p in merged if not any(dominates(q, p) for q in merged)]
    return sorted(front, key=lambda p: (p.peak_bytes, p.predicted_seconds))


def _pick(label: str, kind: str, value, plan: Plan | None, reached: bool, message: str,
          points: list[Point], merged: list[Point], bound_bytes: int | None, bound_seconds: float | None,
          least: Plan | None, min_seconds: float, fraction, ratio, solver: str = "auto") -> Pick:
    """The pick for one budget: ``plan`` (what :func:`solve` returned, or the least-peak plan
    of the error it raised), placed against ``points``; its best among ``merged``."""
    best = _best(kind, merged, bound_bytes, bound_seconds)
    if plan is None or plan.peak_bytes is None or plan.predicted_seconds is None \
            or plan.sim is None or not plan.sim.valid:
        return Pick(label, kind, value, None if plan is None else plan.solver, None, None, None, None, False,
                    True, None, best=best, bound_bytes=bound_bytes, bound_seconds=bound_seconds,
                    runs_min=kind == "fraction" and runs_min(None, False, least, solver),
                    message=message or (plan.message if plan is not None else "no plan"), plan=plan)
    here = SimpleNamespace(peak_bytes=plan.peak_bytes, predicted_seconds=plan.predicted_seconds)
    over = [i for i, p in enumerate(points) if dominates(p, here)]
    dominated = None
    if over:
        key = (lambda i: (points[i].predicted_seconds, points[i].peak_bytes)) if kind in ("none", "fraction") \
            else (lambda i: (points[i].peak_bytes, points[i].predicted_seconds))
        dominated = min(over, key=key)
    if kind == "fraction":
        met = reached and plan.feasible
    elif kind in ("min", "overhead"):
        met = plan.time_bound is None or plan.time_bound.met
    else:
        met = True
    instead = kind == "fraction" and runs_min(plan, reached, least, solver)
    return Pick(label, kind, value, plan.solver, plan.peak_bytes, plan.predicted_seconds,
                fraction(plan.peak_bytes), ratio(plan.predicted_seconds), met, not met, not over, dominated,
                best, bound_bytes, bound_seconds, instead, message, plan)


def runs_min(plan: Plan | None, reached: bool, least: Plan | None, solver: str = "auto") -> bool:
    """Whether ``remat.compile``, planning a step of one graph at a fraction, runs ``"min"``'s
    plan ``least`` instead of ``plan``, what :func:`remat.solve` returned (or, not ``reached``,
    the least peak it found): the step planner's own rules, called here
    (:func:`~remat.step.planner.out_of_reach` out of reach; met by ``auto`` with a staged
    schedule, :func:`~remat.step.planner.within_min_bound`). False where the two plans are the
    same point."""
    if least is None or least.peak_bytes is None:
        return False
    if plan is None or plan.peak_bytes is None:
        return not reached
    if _same(plan.peak_bytes, plan.predicted_seconds, least.peak_bytes, least.predicted_seconds):
        return False  # the same point either way
    if not reached:
        return out_of_reach(plan, least) is least
    if solver == "auto" and plan.feasible and plan.graph is not None:
        return within_min_bound(plan.graph, plan, lambda: least) is not plan
    return False


def _best(kind: str, merged: list[Point], bound_bytes: int | None, bound_seconds: float | None) -> Point | None:
    """The plan a budget would best pick among all found (``merged``): the fastest within
    ``bound_bytes`` (a fraction), the least peak within ``bound_seconds`` (``"min"`` and an
    overhead; a staged schedule's time counted as the portfolio counts it,
    :func:`~remat.solvers.portfolio.bounded_seconds`). It is on the frontier, except under a
    time bound where a staged schedule dominates it."""
    if kind == "fraction":
        ok = [p for p in merged if p.peak_bytes <= bound_bytes]
        return min(ok, key=lambda p: (p.predicted_seconds, p.peak_bytes)) if ok else None
    if kind in ("min", "overhead"):
        ok = [p for p in merged if bound_seconds is None or bounded_seconds(p) <= bound_seconds * (1 + SAME)]
        return min(ok, key=lambda p: (p.peak_bytes, p.predicted_seconds)) if ok else None
    return None


def size_unit(reference: int):
    """The unit of a table's or a plot's peaks (B, KiB, MiB or GiB, by the reference's peak)
    and a function that writes bytes in it.

    >>> unit, size = size_unit(50 * 2**20)
    >>> unit, size(3 * 2**19)
    ('MiB', '1.50')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if reference >= 10 * scale:
            return unit, lambda n, scale=scale: f"{n / scale:.2f}"
    return "B", lambda n: f"{n:d}"
