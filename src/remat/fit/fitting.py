"""The largest batch (or sequence) each method fits on a GPU, searched over a step's graphs at
every size (no torch).

For each method the search (:func:`remat.fit.search.max_batch`: galloping, then bisection)
plans the step's graph at each size it probes (:class:`remat.fit.family.GraphFamily`, or
:func:`remat.graph.batch.scale_batch` on Checkmate's graphs) and asks whether the plan's
predicted peak plus the memory outside the graph fits the GPU. It starts where a straight
line through the method's peaks at two sizes (:data:`SEED_SPAN`) meets the GPU's memory,
refined by the secant through the peak planned there, so that most searches take a few probes; the answer does not depend on that start (the search
brackets the boundary from wherever it starts).

The memory outside the graph, on one GPU: the optimizer's state and the fp32 master weights
(:mod:`remat.fit.states`); with FSDP2 over N GPUs the parameters' other shards are taken off
(the graph holds them whole), and the all-gathered parameters of two blocks (the one computing
and the one prefetched) and the unsharded gradients of one (before its reduce-scatter) are
added. The gradients the graph holds are counted whole: an upper bound under FSDP2, whose
reduce-scatter leaves 1/N of each block's after its backward.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..cost.model import CostModel
from ..graph.batch import base_batch_of, scale_batch
from ..graph.graph import Graph
from .family import GraphFamily
from .methods import CHECKMATE_METHODS, METHODS, checkmate_solver, plan_step
from .result import MethodFit
from .search import max_batch, one_forward_overhead
from .states import ModelStates

SEED_SPAN = 64
"""The search starts where a straight line through the method's peaks at the largest captured
size and at :data:`SEED_SPAN` times it meets the GPU's memory (at the captured sizes a small
model's peak can be flat: its parameters' gradients outweigh its activations)."""


@dataclass(frozen=True)
class _Outcome:
    """What :func:`remat.fit.search.probe_batch` reads of a solve."""

    feasible: bool
    status: str
    cost: float | None
    peak_bytes: int | None
    solver: str | None = None
    message: str = ""
    lower_bound: float | None = None
    gap: float | None = None


def outside_graph(states: ModelStates, full_param_bytes: int, gather_bytes: int = 0) -> int:
    """Bytes on one GPU beside the step's graph's own peak (see the module docstring):
    ``full_param_bytes`` is what the graph holds of parameters (unsharded), ``gather_bytes``
    FSDP2's all-gathered blocks and unsharded gradients."""
    return states.beside_graph - (full_param_bytes - states.param_bytes) + (gather_bytes if states.shards > 1 else 0)


def fit_family(family: GraphFamily, cost_model: CostModel, capacity: int, states: ModelStates, *,
               methods: tuple[str, ...], blocks: tuple[str, ...] = (), full_param_bytes: int | None = None,
               gather_bytes: int = 0, max_size: int = 1 << 16, time_limit: float | None = 60.0,
               log: Callable[[str], None] | None = None) -> list[MethodFit]:
    """One :class:`MethodFit` per method of ``methods`` (:data:`remat.fit.methods.METHODS`)
    for the step whose graphs ``family`` gives, on a GPU of ``capacity`` bytes priced by
    ``cost_model``."""
    full = states.param_bytes * states.shards if full_param_bytes is None else int(full_param_bytes)
    extra = outside_graph(states, full, gather_bytes)
    out = []
    for method in methods:
        t0 = time.perf_counter()
        planned: dict[int, object] = {}

        def solve(g: Graph, _budget: float, method=method) -> _Outcome:
            plan = plan_step(method, g, cost_model, blocks=blocks, time_limit=time_limit)
            if not plan.feasible or plan.peak_bytes is None:
                return _Outcome(False, plan.status, None, None, plan.solver, plan.message)
            total = int(plan.peak_bytes) + extra
            return _Outcome(total <= capacity, plan.status if total <= capacity else "over_memory",
                            plan.predicted_seconds, total, plan.solver)

        def at(size: int, g: Graph | None = None, planned=planned) -> _Outcome:
            if size not in planned:
                planned[size] = solve(family.at(size) if g is None else g, capacity)
            return planned[size]

        lo = family.sizes[0]
        hi = min(max_size, family.sizes[-1] * SEED_SPAN)  # where the peak grows as at large sizes
        a, b = at(family.sizes[-1]), at(hi)
        if a.peak_bytes is None or b.peak_bytes is None:
            why = a.message or b.message or a.status
            out.append(MethodFit(method, METHODS[method], 0, False, None, None, None, a.solver, len(planned),
                                 time.perf_counter() - t0, note=why))
            if log:
                log(f"  {method}: {a.status}")
            continue
        start = _secant(at, (family.sizes[-1], a.peak_bytes), (hi, b.peak_bytes), capacity, max_size)

        def show(p, method=method):
            if log:
                log(f"  {method:18s} {family.what} {p.batch:6d}: {'fits' if p.feasible else 'no  '} "
                    f"{p.status:12s} {p.seconds:6.2f} s")

        # fission splits a dimension into divisors of its length: searched in multiples of GRAIN
        grain = GRAIN if method in SPLITTING and start >= 4 * GRAIN and max_size >= 4 * GRAIN else 1
        sizes: dict[int, tuple[int, Graph]] = {}  # id of a graph the search made -> its size (and the graph)

        def scale(g: Graph, k: int, base, sizes=sizes, grain=grain) -> Graph:
            made = family.at(k * grain)
            sizes[id(made)] = (k * grain, made)
            return made

        def probe(g: Graph, budget: float, sizes=sizes, at=at) -> _Outcome:
            return at(sizes[id(g)][0], g)

        def show_k(p, show=show, grain=grain):
            show(dataclasses.replace(p, batch=p.batch * grain))

        r = max_batch(family.base, probe, capacity, None, base_batch=lo, start=max(1, start // grain),
                      max_batch_size=max_size // grain, on_probe=show_k, scale=scale)
        size, exact = r.batch * grain, r.exact and grain == 1
        note = "" if size else "even 1 does not fit"
        if r.batch == max_size // grain:
            note = f"fits at the largest {family.what} tried ({size})"
        elif grain > 1:
            note = (f"searched in multiples of {grain} (fission splits a dimension "
                    f"into divisors of its length: at {size} + 1 it may not split at all)")
        best = planned.get(size)
        out.append(MethodFit(method, METHODS[method], size, exact,
                             best.peak_bytes if best else None,
                             best.peak_bytes - states.total - (gather_bytes if states.shards > 1 else 0)
                             if best and best.peak_bytes is not None else None,
                             best.cost if best else None, best.solver if best else None,
                             len(planned), time.perf_counter() - t0, note))
    return out


SPLITTING = ("remat-min-split", "remat-min-offload")
"""Methods whose plans split sub-graphs (fission). Fission splits a dimension into divisors of
its length, so whether a batch fits is not monotone in it: a small Llama on an H100 fitted
1780 and 1792 (at 37 GiB) but not 1781. Their search runs over multiples of :data:`GRAIN`."""

GRAIN = 64
"""The multiple a fission method's batch (or sequence) is searched in, where the answer is
at least four of them."""


def _secant(at, p: tuple[int, int], q: tuple[int, int], capacity: int, max_size: int,
            rounds: int = 2) -> int:
    """Where the peak meets ``capacity``, by the secant through ``p`` and ``q`` (size, peak),
    refined ``rounds`` times with the peak planned there (``at(size)``, cached: the search
    reads those plans again for free); a start for the search, not its answer."""
    start = max_size
    for _ in range(rounds + 1):
        (x0, y0), (x1, y1) = p, q
        slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
        start = int(x1 + (capacity - y1) / slope) if slope > 0 else max_size
        start = min(max(start, 1), max_size)
        if start in (x0, x1):
            break
        r = at(start)
        if r.peak_bytes is None:
            break
        p, q = q, (start, r.peak_bytes)
    return start


# ---- Checkmate's graphs ------------------------------------------------------------------------

def without_input_bytes(g: Graph) -> Graph:
    """``g`` with its input values at zero bytes: the Checkmate artifact's max-batch memory
    model charges no input (its memory is ``B`` times the nodes' sizes)."""
    return Graph([n.replace(bytes=0) if n.role == "input" else n for n in g.nodes], name=g.name, meta=g.meta)


def fit_checkmate(g: Graph, capacity: float, fixed_bytes: int, *, methods: tuple[str, ...],
                  time_limit: float | None = 60.0, max_size: int = 1 << 16,
                  log: Callable[[str], None] | None = None) -> list[MethodFit]:
    """Checkmate's maximum-batch experiment (its paper's Section 6.4, Figure 6) on one of its
    graphs: for each strategy the largest batch whose schedule fits ``capacity - fixed_bytes``
    at a cost of at most one extra forward pass (eq. 10). The strategies without a time limit
    search from the graph's own batch; the LP and the MILP from the best of them (the artifact's
    warm start, which only saves probes)."""
    base = base_batch_of(g.name)
    if base is None:
        raise ValueError(f"graph {g.name!r}: no batch size in its name (MODEL_BATCH_H_W_C)")
    limit = one_forward_overhead(g)
    budget = capacity - fixed_bytes
    out, best_fixed = [], 0
    for method in methods:
        t0 = time.perf_counter()
        fn = checkmate_solver(method, time_limit)
        start = best_fixed if method in ("checkmate", "checkmate-lp") and best_fixed else base

        def show(p, method=method):
            if log:
                log(f"  {method:15s} batch {p.batch:6d}: {'fits' if p.feasible else 'no  '} {p.status:12s} "
                    f"{p.seconds:6.2f} s" + (" (time limit: undecided)" if p.undecided else ""))

        r = max_batch(g, fn, budget, limit, base_batch=base, start=start, max_batch_size=max_size,
                      max_undecided=2, on_probe=show)
        if method not in ("checkmate", "checkmate-lp"):
            best_fixed = max(best_fixed, r.batch)
        at = next((p for p in r.probes if p.batch == r.batch), None)
        note = f"undecided at {r.undecided} (time limit)" if r.undecided else ""
        out.append(MethodFit(method, CHECKMATE_METHODS[method], r.batch, r.exact,
                             None if at is None or at.peak_bytes is None else int(at.peak_bytes) + fixed_bytes,
                             None if at is None else at.peak_bytes, None, method, len(r.probes),
                             time.perf_counter() - t0, note, None if at is None else at.overhead))
    return out


def scaled_checkmate(g: Graph, batch: int) -> Graph:
    """Checkmate's graph ``g`` at ``batch`` (:func:`remat.graph.batch.scale_batch`)."""
    return scale_batch(g, batch)
