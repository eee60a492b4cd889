"""The fusion-aware frontier: every saved set that is cheapest for some price of memory.

seeds/000's min cut prices a saved value by the memory traffic saving it costs and bans what
it will not recompute; it is blind to a budget. Here the same flow network gets two more
prices, so one family of cuts spans the whole trade-off:

- **recomputation** is priced instead of banned: an arc ``s -> i_in`` (cut when the backward
  runs ``i`` again) costs what the simulator will count for it: ``i``'s FLOPs at the device's
  peak and, for a value written to memory (not fusible, or read by a library call), the
  write, the reads of a non-fusible op's inputs and a kernel launch. Only random ops and
  ``must_save`` values stay banned (fresh randomness is never allowed), and
  ``must_recompute`` values are never saved. Prices are byte-equivalents: seconds times the
  device's bandwidth.
- **memory** costs ``lam`` per byte a saved value holds across the forward and backward: the arc
  ``i_in -> i_out`` costs ``traffic_i + lam * bytes_i``.

A cut's price is ``T + lam * M``: its time price ``T`` and saved bytes ``M``. The least price
over all cuts is a concave piecewise-linear function of ``lam``; its pieces are the vertices
of the lower convex hull of the cuts' ``(M, T)`` points. :func:`frontier` finds every vertex
exactly by Eisner and Severance's recursion: solve at both ends (``lam = 0``: least time,
ties to least memory; ``lam = inf``: least memory, ties to least time), then at the ``lam``
where the two lines cross; a cut cheaper than both there is a new vertex (recurse on both
sides), otherwise the segment is an edge of the hull. That takes ``2k - 1`` max-flows for
``k`` vertices, exact rational prices when the integers fit, and stops at a deadline.

Every vertex is a valid saved set; :func:`remat.solvers.portfolio.portfolio` judges each with the
simulator (real peak, fusion-aware predicted time) and keeps the fastest within the budget.
Between two vertices the Lagrangian sees nothing (a saved set off the hull is never the
cheapest for any price); ``tests/test_frontier.py`` checks the vertices against every cut of
small graphs, and ``benchmarks/frontier_exact.py`` measures what is lost against an
exhaustive search over saved sets.

>>> from remat.graph.examples import cos_cos_graph
>>> [(p.saved, p.memory) for p in frontier(cos_cos_graph())]
[(['add_2'], 4096), (['a', 'b', 'c', 'd'], 0)]
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ...cost.model import CostModel, default_cost_model, materialized
from ...errors import PlanError
from ...graph.graph import Graph
from ..deadline import Deadline
from .maxflow import INF, InfiniteCutError, lexicographic_min_cut, min_cut
from .mincut import _ban_codes, _flow_arrays, _graph_facts, _read_by_backward

HARD_BANS = (1, 2)
"""The min cut's ban codes (:func:`.mincut._ban_codes`) that stay bans on the frontier:
``must_save`` and random ops; every other ban becomes a price."""

FRONTIER_WORK = 2_000_000
"""The frontier's deterministic stop: at most this many max-flow solves times the graph's
nodes (at least :data:`FRONTIER_MIN_SOLVES`), the segments of the hull examined breadth first
so that a frontier stopped early still spans it. A 100k-node joint graph's max-flow takes
0.9 s here: 20 solves there (its whole frontier took 37, 32 s of a 60 s limit, 72 s under
load); graphs of up to 10k nodes are not cut (200 solves, past any frontier we have)."""

FRONTIER_MIN_SOLVES = 8

_FIT = 2**58  # scaled capacities must sum below this (max-flow adds its "infinity" on top)


@dataclass(frozen=True)
class FrontierPoint:
    """One vertex of the frontier: the saved set, its time price ``time`` (byte-equivalents:
    traffic of saving plus the price of recomputing) and the bytes ``memory`` it saves (inputs
    and parameters count 0: they are held anyway), with the price range it is cheapest for."""

    saved: list[str]
    time: int
    memory: int
    lam_low: float
    lam_high: float


@dataclass(frozen=True)
class Prices:
    """The parametric flow network: arcs, the time price and the memory of each arc (``INF``
    arcs are never cut), and the node each arc's cut would save (or -1)."""

    num_vertices: int
    tails: np.ndarray
    heads: np.ndarray
    time: np.ndarray  # int64; INF marks an uncuttable arc
    memory: np.ndarray  # int64 bytes held if the arc is cut (0 on recompute arcs)

    @property
    def finite(self) -> np.ndarray:
        return self.time != INF

    def caps(self, lam: Fraction | None) -> np.ndarray:
        """Capacities at price ``lam`` per byte, as integers (scaled exactly when they fit,
        rounded otherwise); ``None``: memory alone (the ``lam = inf`` end)."""
        fin = self.finite
        t, m = self.time.astype(np.int64), self.memory.astype(np.int64)
        if lam is None:
            out = m.copy()
        else:
            p, q = lam.numerator, lam.denominator
            t_sum, m_sum = int(t[fin].sum()), int(m[fin].sum())
            if q * t_sum + p * m_sum < _FIT:
                out = q * t + p * m
            else:  # scale both down to fit: only this cut's exactness suffers
                scale = _FIT / 2 / (t_sum + float(lam) * m_sum)
                out = np.floor(t * scale + m * (scale * float(lam))).astype(np.int64)
        return np.where(fin, out, INF)

    def price(self, side: np.ndarray) -> tuple[int, int]:
        """``(T, M)`` of the cut whose source side is ``side``."""
        cut = side[self.tails] & ~side[self.heads]
        if (cut & ~self.finite).any():
            raise AssertionError("a minimum cut crossed an infinite arc")
        return int(self.time[cut].sum()), int(self.memory[cut].sum())


def prices(g: Graph, cost_model: CostModel | None = None) -> Prices:
    """The flow network of :mod:`.mincut` (aggressive bans lifted into prices, see above)."""
    cm = cost_model or default_cost_model(g)
    return g._derived(("frontier_prices", cm.device, cm.per_op), lambda g: _prices(g, cm))


def _prices(g: Graph, cm: CostModel) -> Prices:
    facts = g._derived("mincut_facts", _graph_facts)
    a = g._arrays
    hard = np.isin(_ban_codes(g, facts, "aggressive"), HARD_BANS)
    recompute = _recompute_prices(g, cm)
    profiled = cm.uses_profiled_costs(g)
    save = np.zeros(a.n, dtype=np.int64) if profiled else np.asarray(facts.capacity, dtype=np.int64)
    priced = ~hard & (recompute > 0) & facts.required_arr & ~a.primal
    tails, heads, caps, memory, _ = _flow_arrays(g, save, facts.dist_arr, hard | priced)
    time = np.asarray(caps, dtype=np.int64).copy()
    memory = np.asarray(memory, dtype=np.int64).copy()
    source_arcs = np.flatnonzero(tails == 0)
    node = (heads[source_arcs] - 2) // 2
    on = priced[node]
    time[source_arcs[on]] = recompute[node[on]]
    memory[time == INF] = 0
    return Prices(2 + 2 * a.n, np.asarray(tails), np.asarray(heads), time, memory)


def _recompute_prices(g: Graph, cm: CostModel) -> np.ndarray:
    """Byte-equivalent price of running each forward node again in the backward, as the
    simulator counts a compute: its arithmetic (:meth:`CostModel.arithmetic`: its FLOPs at
    the rate of its size); for a value written to memory anyway
    (:func:`remat.cost.model.materialized`: not fusible, or read by a library call) its write
    and a kernel launch; for an op that does not fuse, the reads of its inputs. Graphs with
    profiled costs price each op at its cost; a step run op by op (``per_op``) at its op cost
    in bytes at the bandwidth."""
    a = g._arrays
    dev = cm.device
    out = np.zeros(a.n, dtype=np.int64)
    # one op dearer than this is never worth recomputing; the cap keeps the sums of prices in
    # int64 whatever a graph's FLOPs (remat.graph.limits bounds them at 1e30 each)
    cap = min(2**52, 2**61 // max(1, a.n))
    if cm.uses_profiled_costs(g):
        costs = np.asarray(cm.op_costs(g), dtype=np.float64)
        scale = 2**40 / max(float(costs.sum()), 1e-30)  # seconds -> integers, sums well in range
        out[:] = np.ceil(costs * scale).astype(np.int64)
        out[a.primal] = 0
        return out
    ins = g.input_indices
    mat = materialized(g)
    per_second = dev.bandwidth
    arith = cm.arithmetic(g)
    if cm.per_op:
        costs = cm.op_costs(g)
        for i in range(a.n):
            if a.forward[i] and not a.primal[i]:
                out[i] = min(cap, int(np.ceil(costs[i] * per_second)))
        return out
    for i, n in enumerate(g.nodes):
        if not a.forward[i] or a.primal[i]:
            continue
        price = arith[i] * per_second
        if mat[i]:
            price += int(a.bytes[i]) + dev.launch_seconds * per_second
        if not a.fusible[i]:
            price += sum(int(a.bytes[j]) for j in ins[i])
        out[i] = min(cap, int(np.ceil(price)))
    return out


def frontier(g: Graph, cost_model: CostModel | None = None, *, time_limit: float | None = None,
             max_points: int = 200, work: int | None = FRONTIER_WORK) -> list[FrontierPoint]:
    """The vertices of the frontier of ``g``, from least time to least memory (see the
    module docstring). Stops after ``max_points`` vertices, after ``work`` max-flow solves
    times nodes (:data:`FRONTIER_WORK`; None: no such stop) or after ``time_limit`` seconds
    (the safety stop under load), with the two ends always included."""
    clock = Deadline(time_limit)
    net = prices(g, cost_model)
    fin = net.finite
    solves = None if work is None else max(FRONTIER_MIN_SOLVES, work // max(1, len(g)))
    done = 0

    def solve(lam: Fraction | None) -> tuple[np.ndarray, int, int]:
        nonlocal done
        done += 1
        try:
            if lam is None:  # least memory, then least time
                cut = lexicographic_min_cut(net.num_vertices, net.tails, net.heads, net.caps(None),
                                            np.where(fin, net.time, 0))
            elif lam == 0:  # least time, then least memory
                cut = lexicographic_min_cut(net.num_vertices, net.tails, net.heads, net.caps(lam),
                                            np.where(fin, net.memory, 0))
            else:
                cut = min_cut(net.num_vertices, net.tails, net.heads, net.caps(lam), 0, 1)
        except InfiniteCutError as e:
            nodes = list(dict.fromkeys(g.nodes[(v - 2) // 2].name for v in e.path if v >= 2))
            raise PlanError("no valid saved set exists: the backward needs " + " -> ".join(nodes)
                            + " but each is banned from recomputation or cannot be saved") from None
        t, m = net.price(cut.source_side)
        return cut.source_side, t, m

    first, last = solve(Fraction(0)), solve(None)
    found = {(first[1], first[2]): first[0], (last[1], last[2]): last[0]}
    # segments of the hull still to examine, as pairs of (T, M) with M_a > M_b and T_a < T_b
    todo = [((first[1], first[2]), (last[1], last[2]))] if first[2] > last[2] else []
    while todo and len(found) < max_points and (solves is None or done < solves) and not clock.expired():
        (ta, ma), (tb, mb) = todo.pop(0)  # breadth first: stopped early, the points span the hull
        lam = Fraction(tb - ta, ma - mb)
        side, t, m = solve(lam)
        if t + lam * m < ta + lam * ma and (t, m) not in found:
            found[(t, m)] = side
            todo += [((ta, ma), (t, m)), ((t, m), (tb, mb))]
    pts = sorted(found, key=lambda tm: (-tm[1], tm[0]))
    # keep the lower hull only (a rounded price may have returned a point above it)
    hull: list[tuple[int, int]] = []
    for t, m in pts:  # memory falling; within equal memory, time rising
        if hull and hull[-1][1] == m:
            continue
        while hull and hull[-1][0] >= t:  # dominated: no less memory, no less time
            hull.pop()
        while len(hull) >= 2 and _above(hull[-2], hull[-1], (t, m)):
            hull.pop()
        hull.append((t, m))
    out = []
    names = g._arrays.names
    fw = g._arrays.forward
    for k, (t, m) in enumerate(hull):
        side = found[(t, m)]
        saved_idx = np.flatnonzero(fw & side[2::2] & ~side[3::2])
        saved = _read_by_backward(g, [names[i] for i in saved_idx.tolist()])
        lo = 0.0 if k == 0 else (t - hull[k - 1][0]) / (hull[k - 1][1] - m)
        hi = float("inf") if k == len(hull) - 1 else (hull[k + 1][0] - t) / (m - hull[k + 1][1])
        out.append(FrontierPoint(saved, t, m, lo, hi))
    return out


def _above(a: tuple[int, int], b: tuple[int, int], c: tuple[int, int]) -> bool:
    """Is ``b`` on or above the segment from ``a`` to ``c`` (points are ``(T, M)``, M falling)?"""
    (ta, ma), (tb, mb), (tc, mc) = a, b, c
    # T on the segment at mb: ta + (tc - ta) * (ma - mb) / (ma - mc)
    return (tb - ta) * (ma - mc) >= (tc - ta) * (ma - mb)


__all__ = ["frontier", "prices", "FrontierPoint", "Prices", "HARD_BANS"]
