"""``solver="magis"``: MAGIS's coordinated search (seeds/004 Section 6.2, Algorithm 3) over
fission, recomputation and swapping together.

A *state* is a graph (the F-Tree's state: how many parts each candidate region runs as,
:mod:`remat.solvers.magis.ftree`), the values its forward saves (the rest the backward
recomputes) and the values swapped out at their longest idle gap. Its schedule is rebuilt from
these (fission applied, :func:`~remat.plans.schedule.schedule_from_saved_set`, offloads placed
as :func:`~remat.solvers.magis.swap.offload` places them: stores early, loads as late as the copy
hides) and judged by the simulator: peak bytes and predicted time.

The rules, from a popped state: the F-Tree's (enable, lift, disable, more or fewer parts),
recompute a hot spot (a saved value resident at the peak, idle around it: MAGIS's H2) and, on
a link whose copies run beside compute, swap one out; and their inverses (save again the
recomputed value that costs most, drop a swap). Best-first: states are compared
lexicographically with the limit (``BetterThan``): under a memory budget M,
``(max(mem, M), time)``; under a time limit T (``max_overhead``: T = (1 + max_overhead) x the
reference step's time, :func:`remat.plans.budget.reference_seconds`), ``(max(time, T), mem)``, and with a memory
cap C (the plan without a budget's peak, :func:`least_within`) ``(max(mem, C), max(time, T),
mem)``. A child is kept in the queue when it is
better than the best so far with both its measures relaxed by :data:`DELTA` (1.1). A state
seen before (same graph, saved set and swaps: a canonical hash of the state, which fixes the
graph and its schedule) is skipped before it is scheduled.

It starts from remat's own plans without fission (the best starting plan,
:func:`remat.solvers.portfolio.portfolio`, within the budget or for the least memory within the
time limit; in time mode the plan without a budget too; the reference step), so it never
returns a plan worse than those; the best plan found is returned with its fissions in
``plan.fissions``, and its graph (``plan.graph``) is the graph with them applied.

Deterministic: no random choices, ties broken by the order states were made, and it stops
after scheduling :func:`search_states` states (:data:`SEARCH_WORK` over the graph's nodes),
a count, not a time; the wall-clock share stops it only when the machine is too loaded to
get there in time (``details["search"]["stopped"]`` says ``"work"``, ``"done"``,
``"iterations"`` or ``"time"``; ``iterations`` caps the states expanded, for tests).

Re-scheduling is not Algorithm 2's interval DP: a state's schedule is rebuilt whole in linear
time (a few milliseconds on a 2,000-node graph; simulating it costs more); MAGIS's released
code does not use its DP scheduler either (MAGIS.md Section 2.3). The best state's schedule
is re-ordered once at the end (the DP over narrow-waist parts of
:mod:`remat.transforms.reorder`), kept where the simulator finds it better.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import time
from dataclasses import dataclass, field

from ...cost.model import CostModel, default_cost_model
from ...cost.transfer import Link, link_for_graph, offload_allowed
from ...errors import OptionError, PlanError, RematError
from ...graph.graph import Graph
from ...plans.budget import reference_saved, reference_seconds
from ...plans.outcome import Attempt, TimeBound
from ...plans.plan import Plan
from ...plans.saved_set import backward_work
from ...plans.schedule import Schedule, schedule_from_saved_set
from ...plans.simulator import SimResult, simulate
from ...transforms.fission import apply_fissions
from ...transforms.reorder import reorder
from ..deadline import Deadline
from ..mincut import mincut
from ..portfolio import portfolio
from ..progress import report
from .ftree import LEVELS, FTree, ftree, mutations
from .swap import gaps, hot_spots, offload

DELTA = 1.1
"""The relaxation of ``BetterThan`` that decides which children enter the queue (Section 7.1)."""

SEARCH_SHARE = 0.25
"""The search's own share of :data:`~remat.solvers.deadline.SCALE` (15 s of 60 s), at most
what the starting plans left of the time limit (:meth:`remat.solvers.deadline.Deadline.share`)."""

TOP = 4
"""Hot spots tried per rule and state."""

REORDER_SHARE = 1 / 12
"""At most this share of :data:`~remat.solvers.deadline.SCALE` (5 s of 60 s), within the time
limit, re-ordering the best state's schedule after the search."""

DEFAULT_OVERHEAD = 0.10
"""Without a budget, the least memory within this share of extra step time."""

SEARCH_WORK = 40_000
"""The search's deterministic stop: it schedules at most this many states times nodes (a
state's schedule and simulation cost about linear time in the graph's nodes), between
:data:`MIN_SEARCH_STATES` and :data:`MAX_SEARCH_STATES` states (:func:`search_states`): 97
states on GPT-2 quick (410 nodes), 47 on ResNet-18 tiny (853). On the ``quick`` models of
``remat.zoo.trials.budget_case`` (GPT-2, Llama, T5, ResNet-18; eager and inductor graphs)
``budget="min"`` reached the same plan with 25 states as with 800 (T5 eager: 0.653 of the
reference's peak with 25, 0.641 from 50 on; ``benchmarks/min_planning.py --states``), while
500 states took 6-10 s on the inductor graphs, whose simulation costs 5-7x the eager one's. The wall-clock share
(:data:`SEARCH_SHARE`, ``auto``'s :data:`~remat.solvers.auto.AUTO_SEARCH_SHARE`) stays as a
safety stop under load."""

MIN_SEARCH_STATES = 32
"""The least states the search schedules, however large the graph."""

MAX_SEARCH_STATES = 400
"""The most states the search schedules, however small the graph: a state costs a fixed part
too (its graph with fission, its schedule), about 0.7 ms here on a 12-node graph, where
:data:`SEARCH_WORK` alone would allow 3,333 states (2.5 s)."""

PROGRESS_EVERY = 25
"""The search reports its best state every this many states expanded."""


@dataclass(frozen=True)
class State:
    ns: tuple[int, ...]
    saved: frozenset[str]
    swaps: frozenset[str] = frozenset()

    def key(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(self.ns).encode())
        for part in (sorted(self.saved), ["|"], sorted(self.swaps)):
            h.update("\0".join(part).encode())
        return h.hexdigest()


@dataclass
class Judged:
    state: State
    graph: Graph
    schedule: Schedule
    sim: SimResult
    rule: str
    path: tuple[str, ...] = field(default=())

    @property
    def mem(self) -> int:
        return self.sim.peak_bytes

    @property
    def lat(self) -> float:
        return self.sim.predicted_seconds


@dataclass(frozen=True)
class Objective:
    """``BetterThan``: memory mode (``memory`` = M bytes) or time mode (``seconds`` = T). In
    time mode ``cap`` (bytes) comes first: a state above it is worse than any within it, so a
    search that starts from a plan within the cap never returns one above it (``auto``'s
    least memory within an overhead: never more than its plan without a budget)."""

    memory: float | None = None
    seconds: float | None = None
    cap: float | None = None

    def key(self, j: Judged, delta: float = 1.0) -> tuple[float, ...]:
        return self.key_of(j.mem, j.lat, delta)

    def key_of(self, mem: float, lat: float, delta: float = 1.0) -> tuple[float, ...]:
        if self.memory is not None:
            return (max(delta * mem, self.memory), delta * lat)
        if self.cap is not None:
            return (max(delta * mem, self.cap), max(delta * lat, self.seconds), delta * mem)
        return (max(delta * lat, self.seconds), delta * mem)

    def better(self, a: Judged, b: Judged, delta: float = 1.0) -> bool:
        return self.key(a) < self.key(b, delta)


class Search:
    """One run of Algorithm 3 on ``g`` (see the module docstring)."""

    def __init__(self, g: Graph, objective: Objective, cm: CostModel, link: Link, *,
                 swapping: bool, levels: int = LEVELS) -> None:
        self.g, self.objective, self.cm, self.link = g, objective, cm, link
        self.swapping = swapping
        self.levels = levels
        self.tree = FTree((), ())
        self.graphs: dict[tuple[int, ...], Graph | None] = {}
        self.seen: set[str] = set()  # state keys (the queue holds the judged states themselves)
        self.judged = 0  # states scheduled and found valid
        self.scheduled = 0  # states scheduled (the work the deterministic stop counts)
        self.expanded = 0
        self.stopped = ""

    # -- states ---------------------------------------------------------------------------
    def graph(self, ns: tuple[int, ...]) -> Graph | None:
        if ns not in self.graphs:
            try:
                self.graphs[ns] = apply_fissions(self.g, self.tree.fissions(ns))
            except PlanError:
                self.graphs[ns] = None
        return self.graphs[ns]

    def judge(self, state: State, rule: str, path: tuple[str, ...] = ()) -> Judged | None:
        k = state.key()
        if k in self.seen:
            return None  # seen: skipped before it is scheduled
        self.seen.add(k)
        gf = self.graph(state.ns)
        if gf is None:
            return None
        self.scheduled += 1
        try:
            s = schedule_from_saved_set(gf, _saved_in(gf, state.saved))
            for w in sorted(state.swaps):
                s = _swapped(s, w, self.link, self.cm)
        except RematError:
            return None
        sim = simulate(s, self.cm, link=self.link)
        if not sim.valid:
            return None
        self.judged += 1
        return Judged(state, gf, s, sim, rule, path + (rule,))

    def start(self, saved_sets: list[tuple[str, list[str]]]) -> list[Judged]:
        ns0 = ()
        starts = []
        for name, saved in saved_sets:
            j = self.judge(State(ns0, frozenset(saved)), name)
            if j is not None:
                starts.append(j)
        if not starts:
            return []
        first = min(starts, key=self.objective.key)
        self.tree = ftree(self.g, _resident_at_peak(first.schedule, first.sim), self.levels)
        ns = (1,) * len(self.tree)
        out = []
        for j in starts:  # the same states, in the tree's terms
            state = State(ns, j.state.saved, j.state.swaps)
            self.seen.add(state.key())
            out.append(Judged(state, j.graph, j.schedule, j.sim, j.rule, j.path))
        return out

    def children(self, j: Judged) -> list[tuple[str, State]]:
        """The states one rule away from ``j``'s, in a fixed order."""
        st = j.state
        out = [(rule, State(ns, st.saved, st.swaps)) for rule, ns in mutations(self.tree, st.ns)]
        spots = hot_spots(j.schedule, j.sim)[:TOP]
        for gap in spots:
            v = gap.node
            if v in st.saved and j.graph[v].role == "forward":
                out.append((f"recompute {v}", State(st.ns, st.saved - {v}, st.swaps)))
            if self.swapping and gap.node not in st.swaps:
                out.append((f"swap {gap.node}", State(st.ns, st.saved, st.swaps | {gap.node})))
        for w in sorted(st.swaps):
            out.append((f"unswap {w}", State(st.ns, st.saved, st.swaps - {w})))
        for v in _recomputed(j)[:TOP]:
            if v not in st.saved:
                out.append((f"save {v}", State(st.ns, st.saved | {v}, st.swaps)))
        return out

    def run(self, starts: list[Judged], clock: Deadline, iterations: int | None,
            work: int | None = None) -> Judged:
        """The best state found from ``starts``: the queue runs out, ``iterations`` states are
        expanded, ``work`` states are scheduled (the deterministic stops), or ``clock`` expires
        (the safety stop); ``self.stopped`` says which."""
        obj = self.objective
        best = min(starts, key=obj.key)
        counter = itertools.count()
        queue = [(obj.key(j), next(counter), j) for j in starts]
        heapq.heapify(queue)
        popped: set[str] = set()
        self.stopped = "done"
        while queue:
            if iterations is not None and self.expanded >= iterations:
                self.stopped = "iterations"
                break
            if work is not None and self.scheduled >= work:
                self.stopped = "work"
                break
            if clock.expired():
                self.stopped = "time"
                break
            _, _, j = heapq.heappop(queue)
            k = j.state.key()
            if k in popped:
                continue
            popped.add(k)
            self.expanded += 1
            if self.expanded % PROGRESS_EVERY == 0:
                report(f"{self.g.name}: searching, {self.expanded} states expanded, best "
                       f"{best.mem:,} B at {best.lat:.3g} s")
            for rule, child in self.children(j):
                if work is not None and self.scheduled >= work or clock.expired():
                    break
                c = self.judge(child, rule, j.path)
                if c is None:
                    continue
                if obj.better(c, best):
                    best = c
                if obj.better(c, best, DELTA):
                    heapq.heappush(queue, (obj.key(c), next(counter), c))
        return best


def magis(g: Graph, *, budget: float | None = None, cost_model: CostModel | None = None,
          time_limit: float | None = None, max_overhead: float | None = None,
          iterations: int | None = None, fission: bool = True, bandwidth: float | None = None) -> Plan:
    """The best plan Algorithm 3 finds: the fastest within ``budget`` bytes (0: the least
    memory), or, without a budget (or with ``budget="min"`` and ``max_overhead``), the least
    memory within ``max_overhead`` (default :data:`DEFAULT_OVERHEAD`) more time than the
    reference step (:func:`least_within`). ``fission=False`` searches recomputation and
    swapping only; ``iterations`` caps the states expanded."""
    t0 = time.perf_counter()
    if budget is not None and budget > 0 and max_overhead is not None:
        raise OptionError("give a memory budget or max_overhead, not both (budget='min' with "
                          "max_overhead: the least memory within that overhead)")
    check_overhead(max_overhead)
    cm = cost_model or default_cost_model(g)
    link = link_for_graph(g, cm, bandwidth=bandwidth)
    clock = Deadline(time_limit)
    if budget is None or max_overhead is not None:
        overhead = DEFAULT_OVERHEAD if max_overhead is None else float(max_overhead)
        plan = least_within(g, overhead, cm, clock, link=link, iterations=iterations, fission=fission)
    else:
        report(f"{g.name}: starting plans for the search")
        half = clock.left() / 2 if clock.limit is not None else None
        base = portfolio(g, budget, cm, half, swapping=_swaps(link, g))
        plan = _search(g, base, Objective(memory=float(budget)), cm, link, clock, SEARCH_SHARE,
                       iterations, fission)
    return plan.updated(solve_seconds=time.perf_counter() - t0)


def check_overhead(max_overhead: float | None) -> None:
    """Raise :class:`~remat.errors.OptionError` unless ``max_overhead`` is None or a share >= 0."""
    if max_overhead is not None and (isinstance(max_overhead, bool)
                                     or not isinstance(max_overhead, (int, float)) or not 0 <= max_overhead <= 1e6):
        raise OptionError(f"max_overhead {str(max_overhead)[:40]} must be a finite share of the step time "
                          ">= 0, such as 0.10 for 10% more time")


def least_within(g: Graph, overhead: float, cm: CostModel, clock: Deadline, *,
                 link: Link | None = None, iterations: int | None = None, fission: bool = True,
                 search: bool = True, share: float = SEARCH_SHARE) -> Plan:
    """The least memory within ``overhead`` more predicted step time than the reference
    (:func:`~remat.plans.budget.reference_seconds`), never more memory than the plan without a budget (the
    conservative min cut), by prediction: the starting plans for the least memory with that
    bound (:func:`remat.solvers.portfolio.portfolio`, ``within``), then, with ``search``, the
    search in time mode from the best of them and the plan without a budget, that plan's peak
    its cap (:class:`Objective`). When the plan without a budget is itself over the bound,
    nothing within both is known: the fastest plan no larger than it is returned
    (``plan.time_bound.met`` says whether the bound was met)."""
    link = link or link_for_graph(g, cm)
    seconds = reference_seconds(g, cm, link) * (1 + overhead)
    report(f"{g.name}: starting plans for the least memory within {overhead:.0%} more time")
    base = portfolio(g, 0, cm, clock.left(), swapping=_swaps(link, g), within=seconds)
    default = _default_plan(g, cm, link)
    cap = None if default is None else float(default.peak_bytes)
    plan = base
    if search:
        plan = _search(g, base, Objective(seconds=seconds, cap=cap), cm, link, clock, share,
                       iterations, fission, extra=[] if default is None else [default])
        if plan is not base:
            plan = plan.updated(tried=base.tried + (Attempt.of(base),))
    if default is not None and (plan.peak_bytes is None or plan.peak_bytes > default.peak_bytes):
        plan = default  # never above the plan without a budget (a base that is not valid)
    met = plan.predicted_seconds is not None and plan.predicted_seconds <= seconds * (1 + 1e-9)
    return plan.updated(time_bound=TimeBound(float(overhead), float(seconds), bool(met),
                                             None if default is None else default.peak_bytes))


def _default_plan(g: Graph, cm: CostModel, link: Link) -> Plan | None:
    """The plan without a budget (the conservative min cut), judged; None if not valid."""
    try:
        p = mincut(g, "conservative")
    except RematError:
        return None
    if p.statements is None:
        return None
    p = p.judge(None, cm)
    return p if p.sim is not None and p.sim.valid else None


def refine(g: Graph, base: Plan, budget: float, cm: CostModel, clock: Deadline, share: float,
           iterations: int | None = None, fission: bool = True) -> Plan:
    """``base`` or a better plan the search finds from it within ``budget`` bytes (0: least
    memory), searching for ``share`` of the scale at most, within what is left of ``clock``:
    how ``auto`` uses the search."""
    t0 = time.perf_counter()
    plan = _search(g, base, Objective(memory=float(budget)), cm, link_for_graph(g, cm),
                   clock, share, iterations, fission)
    tried = base.tried + (Attempt.of(base),) if plan is not base else plan.tried
    return plan.updated(tried=tried, solve_seconds=base.solve_seconds + time.perf_counter() - t0)


def has_dimensions(g: Graph) -> bool:
    """Whether capture recorded dimensions for ``g``'s ops (what fission needs)."""
    return any("dims" in n.meta for n in g.nodes)


def _swaps(link: Link, g: Graph) -> bool:
    """Whether the search swaps: copies run beside compute and plans of ``g`` may offload
    (:func:`remat.cost.transfer.offload_allowed`)."""
    return link.asynchronous and offload_allowed(g)[0]


def _search(g: Graph, base: Plan, objective: Objective, cm: CostModel, link: Link, clock: Deadline,
            share: float, iterations: int | None, fission: bool, extra: list[Plan] = ()) -> Plan:
    """Algorithm 3 from ``base``, the plans in ``extra`` and the reference step, until it has
    scheduled :func:`search_states` states (the deterministic stop) or for ``share`` of the
    scale at most (the safety stop under load), then the re-ordering (:data:`REORDER_SHARE`),
    within what is left of ``clock``; ``base`` when the search finds nothing better."""
    saved_sets = [(base.solver, base.saved_names)] if base.statements is not None else []
    saved_sets += [(p.solver, p.saved_names) for p in extra if p.statements is not None]
    ref = reference_saved(g)
    if ref is not None:
        saved_sets.append(("torch-mincut", ref))
    search = Search(g, objective, cm, link, swapping=_swaps(link, g), levels=LEVELS if fission else 0)
    starts = search.start(saved_sets)
    if not starts:
        return base
    report(f"{g.name}: searching ({len(search.tree)} fission candidates)")
    found = search.run(starts, clock.share(share), iterations, search_states(g))
    report(f"{g.name}: re-ordering the best schedule")
    best = _reordered(found, search, objective, clock.share(REORDER_SHARE))
    plan = _plan(best, search, objective)
    if base.peak_bytes is not None and base.status != "invalid" and \
            objective.key_of(base.peak_bytes, base.predicted_seconds) <= objective.key(best):
        return base.updated(details={"search": plan.details["search"]})
    return plan


def search_states(g: Graph) -> int:
    """The states the search schedules at most on ``g``: :data:`SEARCH_WORK` over its nodes,
    at least :data:`MIN_SEARCH_STATES`, at most :data:`MAX_SEARCH_STATES`."""
    return min(MAX_SEARCH_STATES, max(MIN_SEARCH_STATES, int(SEARCH_WORK // max(1, len(g)))))


def _reordered(j: Judged, search: Search, objective: Objective, clock: Deadline) -> Judged:
    """``j`` with its schedule re-ordered for a lower peak (seeds/004 Section 6.1,
    :func:`remat.transforms.reorder.reorder`) where that is better, within ``clock``; a schedule with copies is
    left as it is."""
    if j.state.swaps:
        return j
    s = reorder(j.schedule, search.cm, time_limit=clock.limit)
    if s is j.schedule:
        return j
    sim = simulate(s, search.cm, link=search.link)
    c = Judged(j.state, j.graph, s, sim, "reorder", j.path + ("reorder",))
    return c if sim.valid and objective.better(c, j) else j


def _plan(best: Judged, search: Search, objective: Objective) -> Plan:
    fissions = search.tree.fissions(best.state.ns)
    details = {
        "search": {"expanded": search.expanded, "judged": search.judged,
                   "scheduled": search.scheduled, "stopped": search.stopped,
                   "seen": len(search.seen), "candidates": len(search.tree),
                   "rules": list(best.path), "notes": list(search.tree.notes),
                   "limit": {"memory": objective.memory, "seconds": objective.seconds}},
    }
    p = Plan.from_schedule(best.schedule, solver="magis", details=details, fissions=tuple(fissions),
                           link=search.link if best.state.swaps else None)
    limit = objective.memory or None
    return p.judge(limit, search.cm, sim=best.sim)


def _saved_in(gf: Graph, saved: frozenset[str]) -> list[str]:
    """The saved set in the graph with fission: a value split into parts is not saved (the
    backward computes its parts again, one part at a time, beside its own parts: how a region
    that spans both phases lowers the peak); the rule "save" can save a part by its name."""
    kept = [v for v in sorted(saved) if v in gf]
    return kept + list(backward_work(gf, kept).missing_inputs)  # parameters the parts read


def _swapped(s: Schedule, w: str, link: Link, cm: CostModel) -> Schedule:
    """``s`` with ``w``'s longest idle gap swapped out (unchanged if it has none)."""
    own = [gp for gp in gaps(s) if gp.node == w]
    if not own:
        return s
    gap = max(own, key=lambda gp: (gp.before - gp.after, -gp.after))
    return offload(s, gap, link, cm)


def _recomputed(j: Judged) -> list[str]:
    """Forward values the schedule computes more than once and may save (not ``can_save=False``
    nor ``must_recompute``: a random graph's search had saved such a value, and its plan could
    not be split into phases), costliest first (names in the state's graph: a part is saved by
    its own name)."""
    seen: dict[str, int] = {}
    for st in j.schedule.statements:
        if st.op == "compute":
            seen[st.node] = seen.get(st.node, 0) + 1
    gf = j.graph
    again = [v for v, c in seen.items() if c > 1 and gf[v].role == "forward" and gf[v].can_save
             and not gf[v].must_recompute]
    return sorted(again, key=lambda v: (-gf[v].flops, -gf[v].bytes, v))


def _resident_at_peak(s: Schedule, sim: SimResult) -> set[str]:
    """The values resident when the simulated peak is first reached (MAGIS's hot spots)."""
    resident: set[str] = set()
    for k, st in enumerate(s.statements):
        if k > sim.peak_statement:
            break
        if st.op in ("compute", "reload"):
            resident.add(st.node)
        elif st.op == "free":
            resident.discard(st.node)
    return resident
