"""The largest batch (or sequence) a solver fits: galloping, then bisection (no torch).

Checkmate's maximum-batch-size experiment (seeds/001 Section 6.4, Figure 6; the MLSys 2020
artifact's ``experiments/experiment_max_batchsize_{baseline,ilp}.py``) asks, for each
rematerialization strategy, for the largest batch size ``B`` whose training step fits the GPU
memory at a cost of at most one extra forward pass:

    sum of computations <= 2 * cost(forward) + cost(backward)          (paper eq. 10)
                         = cost(no recomputation) + cost(forward pass)

:func:`~remat.graph.batch.scale_batch` rebuilds a Checkmate graph (``MODEL_BATCH_H_W_C``) at
another batch size and :func:`max_batch` searches for the largest batch a budgeted solver fits.
Any other way of making the graph at a size (a captured PyTorch step scaled from captures at
a few sizes: :class:`remat.fit.family.GraphFamily`) goes in as ``scale``.

How a graph scales with the batch (the assumption, from the paper and its artifact):

- **Memory.** Every value except parameters is a per-example tensor, so its bytes are
  ``bytes * batch / base_batch``: activations, gradients, the ``data`` input (``B*H*W*C`` float32)
  and the loss (the artifact exports it as ``4 * batch`` bytes). The artifact's max-batch MILP
  does exactly this, using ``B * M_i`` for every node ``M_i`` measured at batch 1 (eq. 10's
  reformulation of problem 9). Values with role ``param`` keep their bytes. The Checkmate graphs
  carry no parameter nodes; the artifact charges parameters (and their gradients) as a fixed
  ``M_fixed = 2 * M_param`` taken off the 16 GB budget, which is how
  ``benchmarks/max_batch_checkmate.py`` treats them.
- **Compute cost.** Every node's cost is multiplied by ``batch / base_batch``. The paper's
  max-batch experiment measures "costs in FLOPs, determined statically" (Section 6.4; the
  artifact's default ``--platform flops``), and a layer's FLOPs are linear in the batch. The
  profiled costs in these files are per batch; a profiled per-example cost falls somewhat with
  the batch (Section 4.10), which this ignores. The cost limit of eq. 10 is a ratio to the
  graph's own costs, and scaling every cost by one factor leaves that ratio unchanged, so the
  feasibility test does not depend on this choice (up to float rounding).

Because every byte scales with the batch, a schedule's peak is linear in ``B`` and the largest
batch a fixed schedule fits is ``floor(budget * base_batch / peak(base_batch))`` (the artifact's
eq. 11 for the baselines). :func:`max_batch` does not rely on this: it re-solves at each
batch it probes (galloping from a start batch, then bisection), as the schedule a solver picks
depends on the budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cost.model import default_cost_model
from ..graph.batch import base_batch_of, scale_batch
from ..graph.graph import Graph

Scale = Callable[[Graph, int, "int | None"], Graph]
"""``scale(graph, size, base_size) -> graph at size``."""


# ---- cost limits -----------------------------------------------------------------------------

def cost_split(g: Graph, cost_model=None) -> tuple[float, float]:
    """``(cost with no recomputation, cost of the forward pass)``: the sum of every node's
    cost, and of the forward (non-primal) nodes' costs, under ``cost_model``."""
    costs = (cost_model or default_cost_model()).op_costs(g)
    total = float(sum(costs))
    fwd = float(sum(c for n, c in zip(g.nodes, costs) if n.role == "forward"))
    return total, fwd


def one_forward_overhead(g: Graph, cost_model=None) -> float:
    """The paper's limit (eq. 10) as a ratio to the cost with no recomputation:
    ``(total + forward) / total``, i.e. at most one extra forward pass."""
    total, fwd = cost_split(g, cost_model)
    return (total + fwd) / total if total > 0 else math.inf


# ---- the search ------------------------------------------------------------------------------

@dataclass
class Probe:
    """One solve at one batch size."""

    batch: int
    feasible: bool  # within the memory budget *and* the cost limit
    status: str  # the solver's status, or "over_cost" when it fitted memory but not the cost limit
    cost: float | None
    overhead: float | None  # cost / cost with no recomputation (same graph)
    peak_bytes: int | None
    seconds: float
    undecided: bool = False  # no schedule within the limits was found but none was ruled out
    lower_bound: float | None = None
    gap: float | None = None


@dataclass
class MaxBatch:
    """The largest batch found feasible (``batch``; 0 when not even ``min_batch`` fits) and the
    smallest found infeasible (``infeasible_batch``; ``None`` when the search hit ``max_batch_size``).
    ``exact`` is true when the two are adjacent and no probe in the search was undecided by a
    time limit (see :class:`Probe`)."""

    batch: int
    infeasible_batch: int | None
    exact: bool
    probes: list[Probe] = field(default_factory=list)
    seconds: float = 0.0
    undecided: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"batch": self.batch, "infeasible_batch": self.infeasible_batch, "exact": self.exact,
                "seconds": round(self.seconds, 3), "undecided": self.undecided,
                "probes": [asdict(p) for p in self.probes]}


def probe_batch(g: Graph, solver_fn: Callable[..., Any], batch: int, budget_bytes: float,
                max_overhead: float | None, *, base_batch: int | None = None,
                tolerance: float = 1e-9, scale: Scale | None = None) -> tuple[Probe, Any]:
    """Solve ``g`` scaled to ``batch`` within ``budget_bytes`` and judge the cost limit.
    ``scale(g, batch, base_batch)`` makes the graph at ``batch`` (default
    :func:`~remat.graph.batch.scale_batch`).

    ``solver_fn(graph, budget) -> Plan`` returns the cheapest schedule it finds within
    the budget, so when that one is over the cost limit the solver has nothing within both.
    A probe is *undecided* when the solver stopped on a time limit (status ``time_limit``, or
    ``no_solution`` with a message naming the time limit, as the MILP reports it) without a
    schedule within the cost limit, and its proven lower bound (when it gives one) does not
    exceed the limit: a longer solve might still find one.
    """
    gb = (scale or scale_batch)(g, batch, base_batch)
    total = cost_split(gb)[0] if max_overhead is not None else None
    limit = None if max_overhead is None else max_overhead * total * (1 + tolerance)
    t0 = time.perf_counter()
    r = solver_fn(gb, budget_bytes)
    secs = time.perf_counter() - t0
    overhead = (r.cost / total) if r.feasible and r.cost is not None and total else None
    ok = bool(r.feasible) and (limit is None or r.cost <= limit)
    status = r.status if (ok or not r.feasible) else "over_cost"
    timed_out = r.status == "time_limit" or (
        r.status == "no_solution" and "time limit" in (getattr(r, "message", "") or "").lower())
    proved_over = (limit is not None and r.lower_bound is not None and r.lower_bound > limit)
    undecided = (not ok) and timed_out and not proved_over
    return Probe(int(batch), ok, status, r.cost if r.feasible else None, overhead,
                 r.peak_bytes if r.feasible else None, secs, undecided,
                 getattr(r, "lower_bound", None), getattr(r, "gap", None)), r


def max_batch(g: Graph, solver_fn: Callable[..., Any], budget_bytes: float,
              max_overhead: float | None = None, *, base_batch: int | None = None,
              start: int | None = None, min_batch: int = 1, max_batch_size: int = 1 << 16,
              max_probes: int | None = None, max_undecided: int | None = None,
              on_probe: Callable[[Probe], None] | None = None, scale: Scale | None = None) -> MaxBatch:
    """The largest batch size at which ``solver_fn`` fits ``g`` in ``budget_bytes`` with cost at
    most ``max_overhead`` times the cost with no recomputation (``None``: no cost limit; the
    paper's rule is :func:`one_forward_overhead`).

    Galloping then bisection: from ``start`` (default ``base_batch``, the graph's own batch)
    the search steps up (``start+1, start+3, start+7, ...``, the step doubling) while feasible,
    or down (``start-1, start-3, ...``) while infeasible, until it brackets the boundary, then
    bisects the bracket. It assumes feasibility is monotone in the batch (true for exact
    solvers: every byte grows with the batch and the cost limit is batch-invariant). An
    undecided probe (time limit, see :func:`probe_batch`) counts as infeasible and is listed in
    ``undecided``; ``max_probes`` caps the solves and ``max_undecided`` stops the search after
    that many undecided probes in a row (a solver that cannot decide at one batch within its
    time limit rarely can at the next); the bracket found so far is then reported. ``scale``:
    as in :func:`probe_batch`.
    """
    t0 = time.perf_counter()
    if base_batch is None:
        base_batch = base_batch_of(g.name)
        if base_batch is None:
            raise ValueError(f"graph {g.name!r}: no batch size in its name; pass base_batch")
    cache: dict[int, Probe] = {}
    probes: list[Probe] = []

    def feasible(b: int) -> bool:
        if b not in cache:
            p, _ = probe_batch(g, solver_fn, b, budget_bytes, max_overhead, base_batch=base_batch,
                               scale=scale)
            cache[b] = p
            probes.append(p)
            if on_probe is not None:
                on_probe(p)
        return cache[b].feasible

    def budget_left() -> bool:
        if max_probes is not None and len(probes) >= max_probes:
            return False
        if max_undecided is not None and len(probes) >= max_undecided:
            return not all(p.undecided for p in probes[-max_undecided:])
        return True

    b0 = min(max(int(start if start is not None else base_batch), min_batch), max_batch_size)
    lo: int | None = None  # largest known feasible
    hi: int | None = None  # smallest known infeasible
    if feasible(b0):
        lo, step = b0, 1
        while budget_left():
            b = min(lo + step, max_batch_size)
            if b == lo:
                break
            if feasible(b):
                lo, step = b, step * 2
            else:
                hi = b
                break
    else:
        hi, step = b0, 1
        while budget_left():
            b = max(hi - step, min_batch)
            if b == hi:
                break
            if feasible(b):
                lo = b
                break
            hi, step = b, step * 2
    if lo is None and hi == min_batch:
        lo = min_batch - 1  # nothing fits
    while lo is not None and hi is not None and hi - lo > 1 and budget_left():
        mid = (lo + hi) // 2
        if feasible(mid):
            lo = mid
        else:
            hi = mid
    undecided = sorted(p.batch for p in probes if p.undecided)
    best = lo if lo is not None else min_batch - 1
    adjacent = hi is not None and hi - best == 1 or (hi is None and best == max_batch_size)
    return MaxBatch(best, hi, bool(adjacent and not undecided), probes,
                    time.perf_counter() - t0, undecided)
