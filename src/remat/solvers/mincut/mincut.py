"""Fusion-aware min-cut checkpointing (seeds/000 Section 3, Algorithms 1 and 2).

Every forward node ``i`` is split into ``i_in -> i_out`` whose capacity is the memory traffic
of saving it: ``w`` if the node is materialized anyway (an input, a forward output, or a node
with a non-fusible user), ``2w`` otherwise (one extra write in the forward, one read in the
backward). Data flow edges are infinite; backward nodes drain to the sink; inputs and nodes
banned from recomputation hang from the source. The minimum cut is the cheapest valid saved
set (Theorem 3.6). Among equally cheap cuts remat prefers those closest to the backward pass
(seeds/000 Section 3.4), resolved exactly by a second max-flow so the preference can never
raise the cost: first the least new memory (inputs and params are held anyway), then the smallest distance-weighted cost.

>>> from remat.graph.examples import cos_cos_graph
>>> mincut(cos_cos_graph()).saved_names
['add_2']
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import PlanError
from ...graph.graph import CATEGORIES, Graph
from ...plans.plan import Plan
from ...plans.saved_set import _required_forward, backward_work
from .maxflow import INF, InfiniteCutError, lexicographic_min_cut, min_cut

MODES = ("conservative", "aggressive")
REDUCTION_RATIO = 4
"""A reduction whose output is more than this many times smaller than its inputs is banned."""
_DIST_CAP = 100


@dataclass(frozen=True)
class Analysis:
    """Per-node facts the cut is built from; exposed for tests, plans and explanations."""

    required_fw: list[bool]
    materialized: list[bool]
    capacity: list[int]  # w or 2w, before any tie-break
    ban: dict[str, str]  # node name -> reason it may not be recomputed
    dist_from_bw: list[int]


def analyse(g: Graph, mode: str = "conservative") -> Analysis:
    """Per-node facts of ``g`` for the cut: which forward values are required, which are
    materialized anyway, their capacities, distances to the backward, and what is banned.

    >>> from remat.graph.examples import cos_cos_graph
    >>> a = analyse(cos_cos_graph())
    >>> a.ban, a.capacity[6]  # add_2: fusible with all its users, so saving it costs 2w
    ({}, 8192)
    """
    facts, ban = _analyse(g, mode)
    return Analysis(list(facts.required), facts.materialized.tolist(), facts.capacity.tolist(),
                    ban, list(facts.dist))


@dataclass(frozen=True)
class _Facts:
    """The mode-independent part of :class:`Analysis`, as arrays (computed once per graph)."""

    required: list[bool]
    required_arr: np.ndarray
    dist: list[int]
    dist_arr: np.ndarray
    materialized: np.ndarray
    capacity: np.ndarray  # int64, or object when the graph's sizes are huge


def _analyse(g: Graph, mode: str) -> tuple[_Facts, dict[str, str]]:
    if mode not in MODES:
        raise ValueError(f"unknown min-cut mode {mode!r}; use one of {MODES}")
    facts = g._derived("mincut_facts", _graph_facts)
    code = _ban_codes(g, facts, mode)
    reasons = (
        None,
        "flagged must_save",
        "random op (recomputing it would draw fresh randomness)",
        "compute-intensive op",
        "not fusible (conservative mode recomputes only fusible ops)",
        f"reduction with output over {REDUCTION_RATIO}x smaller than its inputs",
        "materialized in the backward pass anyway",
    )
    names = g._arrays.names
    idx = np.flatnonzero(code)
    ban = {names[i]: reasons[c] for i, c in zip(idx.tolist(), code[idx].tolist())}
    return facts, ban


def _graph_facts(g: Graph) -> _Facts:
    a = g._arrays
    req = _required_forward(g)
    req_arr = np.array(req, dtype=bool)
    dist_arr = distances_to_backward(g, req_arr)
    # materialized: an input, an output, or a node that does not fuse with all of its users
    non_fusible_user = np.zeros(a.n, dtype=bool)
    non_fusible_user[a.user_src[~a.fusible[a.user_idx]]] = True
    materialized = a.primal | a.is_output | ~a.fusible | non_fusible_user
    capacity = np.where(materialized, a.bytes, 2 * a.bytes)
    return _Facts(req, req_arr, dist_arr.tolist(), dist_arr, materialized, capacity)


FAR = 10**9
"""The distance of a required value from which no path reaches the backward."""


def distances_to_backward(g: Graph, required: np.ndarray, max_levels: int = 256) -> np.ndarray:
    """Per node, how many data-flow arcs separate it from the nearest value outside the
    required forward (a backward node, among others): 0 for those values, ``1 + min`` over
    its users for a required one (:data:`FAR` without a path). A breadth-first search out
    from those values, against the arcs, one array step per distance; past ``max_levels``
    distances (a long chain), the sweep against the topological order instead."""
    a = g._arrays
    dist = np.where(required, FAR, 0).astype(np.int64)
    frontier = np.flatnonzero(~required)
    deg_all = np.diff(a.in_ptr)
    d = 0
    while len(frontier):
        d += 1
        if d > max_levels:
            return _distance_sweep(g, required)
        deg = deg_all[frontier]
        starts = np.repeat(a.in_ptr[frontier] - (np.cumsum(deg) - deg), deg)
        j = a.in_idx[starts + np.arange(int(deg.sum()), dtype=np.int64)]
        j = np.unique(j[dist[j] == FAR])  # required and not reached yet
        dist[j] = d
        frontier = j
    return dist


def _distance_sweep(g: Graph, required: np.ndarray) -> np.ndarray:
    """:func:`distances_to_backward` by one sweep against the topological order (users come
    later): a required node's non-required users are at distance 0."""
    ptr, users = g._arrays.user_lists
    dist = [0] * len(g)
    for i in np.flatnonzero(required)[::-1].tolist():
        us = users[ptr[i]:ptr[i + 1]]
        if us:
            d = min(map(dist.__getitem__, us)) + 1
            dist[i] = d if d < FAR else FAR
        else:
            dist[i] = FAR
    return np.array(dist, dtype=np.int64)


_RANDOM, _COMPUTE, _REDUCTION = (CATEGORIES.index(c) for c in ("random", "compute", "reduction"))


def _ban_codes(g: Graph, facts: _Facts, mode: str) -> np.ndarray:
    """Per node, 0 (not banned) or the index of the reason it is banned (see ``_analyse``)."""
    a = g._arrays
    cat = a.category
    code = np.zeros(a.n, dtype=np.int8)
    candidate = a.forward & ~a.primal
    code[candidate & a.must_save] = 1
    is_random, is_compute = cat == _RANDOM, cat == _COMPUTE
    # random ops are banned even when flagged must_recompute: fresh randomness is never allowed.
    # So is one the forward does not need: if something saved depends on it, the forward runs
    # it, and the backward must then read that value rather than run it again
    code[candidate & ~a.must_save & is_random] = 2
    rest = candidate & ~a.must_save & ~a.must_recompute & ~a.view & facts.required_arr
    code[rest & ~is_random & is_compute] = 3
    if mode != "conservative":
        return code
    rest &= ~is_random & ~is_compute
    code[rest & ~a.fusible] = 4
    rest &= a.fusible
    reduction = rest & (cat == _REDUCTION)
    if reduction.any():
        input_bytes = a.bytes[a.in_idx]
        cumulative = np.concatenate((np.zeros(1, dtype=input_bytes.dtype), np.cumsum(input_bytes)))
        in_bytes = cumulative[a.in_ptr[1:]] - cumulative[a.in_ptr[:-1]]
        reduction &= a.bytes * REDUCTION_RATIO < in_bytes
        code[reduction] = 5
        rest &= ~reduction
    if rest.any():
        code[rest & _materialized_in_backward(g, facts.required_arr)] = 6
    return code


def _materialized_in_backward(g: Graph, req: np.ndarray) -> np.ndarray:
    """Per node: does a user outside the forward pass read it without fusing with it,
    looking through views (a view's users count as the viewed node's users)?"""
    a = g._arrays
    src, dst = a.user_src, a.user_idx
    direct = np.zeros(a.n, dtype=bool)
    direct[src[~req[dst] & ~(a.fusible[src] & a.fusible[dst])]] = True
    # close over chains of views, against the topological order
    view_to_view = a.view[src] & a.view[dst]
    if view_to_view.any():
        closed = direct.tolist()
        view = a.view.tolist()
        ptr, users = a.user_lists
        for v in np.unique(src[view_to_view])[::-1].tolist():
            if not closed[v]:
                for u in users[ptr[v]:ptr[v + 1]]:
                    if view[u] and closed[u]:
                        closed[v] = True
                        break
        through_view = np.array(closed, dtype=bool)
    else:
        through_view = direct
    result = direct.copy()
    result[src[a.view[dst] & through_view[dst]]] = True
    return result


@dataclass(frozen=True)
class FlowNetwork:
    """The auxiliary graph G' of Algorithm 1 as arc arrays. Vertex 0 is s, 1 is t, node i
    has ``2 + 2i`` (in) and ``3 + 2i`` (out). ``caps`` uses ``maxflow.INF`` for infinity;
    ``memory`` (new bytes a saved value holds: zero for inputs and params, which are held anyway)
    and ``distance`` (capacity re-weighted by 1.1 ** distance to the backward) only break
    ties among the cheapest cuts, in that order."""

    num_vertices: int
    tails: list[int]
    heads: list[int]
    caps: list[int]
    memory: list[int]
    distance: list[int]


def flow_network(g: Graph, a: Analysis) -> FlowNetwork:
    """G' for ``g`` with the capacities, distances and bans of ``a``.

    >>> from remat.graph.examples import cos_cos_graph
    >>> g = cos_cos_graph(); net = flow_network(g, analyse(g))
    >>> net.num_vertices, len(net.tails), net.tails[:3], net.heads[:3]
    (34, 34, [0, 2, 3], [2, 3, 10])
    """
    index = g._index
    banned_mask = np.zeros(len(g), dtype=bool)
    banned_mask[[index[name] for name in a.ban if name in index]] = True
    arcs = _flow_arrays(g, _int_array(a.capacity), _int_array(a.dist_from_bw), banned_mask)
    return FlowNetwork(2 + 2 * len(g), *(x.tolist() for x in arcs))


def _int_array(values) -> np.ndarray:
    """int64 when every value is an int that fits, else an object array of the values as is."""
    values = list(values)
    if all(type(v) is int for v in values):
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            pass
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _flow_arrays(g: Graph, capacity: np.ndarray, dist: np.ndarray, banned_mask: np.ndarray):
    """(tails, heads, caps, memory, distance) of G' as arrays (int64; object for huge sizes),
    in the arc order of Algorithm 1: per node in topological order, s->in (inputs and banned
    nodes), in->out, out->t (values the backward must have), then out->in of each user; a
    node outside the forward pass has only in->t."""
    a = g._arrays
    n = a.n
    fw = a.forward
    from_source = fw & (a.primal | banned_mask)
    to_sink = fw & a.backward_output
    n_users = np.diff(a.user_ptr)
    count = np.where(fw, from_source.astype(np.int64) + 1 + to_sink + n_users, 1)
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=start[1:])
    m = int(start[-1])
    start = start[:-1]
    tails = np.empty(m, dtype=np.int64)
    heads = np.empty(m, dtype=np.int64)
    f = np.flatnonzero(fw)
    cap_f = capacity[f]
    weights = _distance_weights(cap_f, dist[f])
    # sizes past int64 (see GraphArrays.bytes) stay Python ints; max-flow then refuses them
    huge = capacity.dtype == object or a.bytes.dtype == object or weights.dtype == object
    dtype = object if huge else np.int64
    caps = np.full(m, INF, dtype=dtype)
    memory = np.zeros(m, dtype=dtype)
    distance = np.zeros(m, dtype=dtype)
    vin = 2 + 2 * np.arange(n, dtype=np.int64)

    p = start[~fw]
    tails[p], heads[p] = vin[~fw], 1
    p = start[from_source]
    tails[p], heads[p] = 0, vin[from_source]
    p = start[f] + from_source[f]
    tails[p], heads[p] = vin[f], vin[f] + 1
    recompute = a.cannot_save[f]
    caps[p] = np.where(recompute, INF, cap_f)
    memory[p] = np.where(a.primal[f], 0, a.bytes[f])
    distance[p] = np.where(recompute, 0, weights)
    d = np.flatnonzero(to_sink)
    p = start[d] + from_source[d] + 1
    tails[p], heads[p] = vin[d] + 1, 1
    e = fw[a.user_src]  # user arcs leave forward nodes only
    src = a.user_src[e]
    rank = np.flatnonzero(e) - a.user_ptr[src]  # position among the node's users
    p = start[src] + from_source[src] + 1 + to_sink[src] + rank
    tails[p], heads[p] = 3 + 2 * src, vin[a.user_idx[e]]
    return tails, heads, caps, memory, distance


def _distance_weights(capacity: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """``int(c * 1.1 ** max(min(d, _DIST_CAP), 1))`` elementwise, bit-identical to Python."""
    if len(capacity) == 0:
        return np.zeros(0, dtype=np.int64)
    if capacity.dtype == np.int64 and dist.dtype == np.int64 and np.abs(capacity).max() < 2**49:
        k = np.maximum(np.minimum(dist, _DIST_CAP), 1)
        factors = np.array([1.1 ** j for j in range(int(k.max()) + 1)])
        return (capacity.astype(np.float64) * factors[k]).astype(np.int64)  # truncates like int()
    return np.array([int(c * 1.1 ** max(min(d, _DIST_CAP), 1))
                     for c, d in zip(capacity.tolist(), dist.tolist())], dtype=object)


def mincut(g: Graph, mode: str = "conservative", tie_break: bool = True) -> Plan:
    """Plan ``g`` with the fusion-aware min cut; returns a saved-set :class:`Plan`.

    ``mode="conservative"`` recomputes only fusible ops (fast step); ``"aggressive"``
    recomputes everything but compute-intensive and random ops (least memory).
    ``tie_break`` prefers, among the cheapest cuts, values closest to the backward pass.
    """
    t0 = time.perf_counter()
    facts, ban = _analyse(g, mode)
    index = g._index
    banned_mask = np.zeros(len(g), dtype=bool)
    banned_mask[[index[name] for name in ban]] = True
    tails, heads, caps, memory, distance = _flow_arrays(g, facts.capacity, facts.dist_arr, banned_mask)
    num_vertices = 2 + 2 * len(g)
    t_build = time.perf_counter()
    nodes = g.nodes
    try:
        if tie_break:
            cut = lexicographic_min_cut(num_vertices, tails, heads, caps, memory, distance, s=0, t=1)
        else:
            cut = min_cut(num_vertices, tails, heads, caps, 0, 1)
    except InfiniteCutError as e:
        names = list(dict.fromkeys(nodes[(v - 2) // 2].name for v in e.path if v >= 2))
        raise PlanError(
            "no valid saved set exists: the backward needs "
            + " -> ".join(names)
            + " but each of these is either banned from recomputation or flagged "
            "cannot be saved (must_recompute, or can_save=False). Clear one of those flags."
        ) from None
    side = cut.source_side
    saved_idx = np.flatnonzero(g._arrays.forward & side[2::2] & ~side[3::2])
    names = g._arrays.names
    saved = [names[i] for i in saved_idx.tolist()]
    cost = int(facts.capacity[saved_idx].sum())
    if cost != cut.value:
        raise AssertionError(f"min-cut bookkeeping: saved set costs {cost}, flow is {cut.value}")
    # a cut may hold values nothing in the backward reads (unrequired or zero-cost ties): drop them
    useful = _read_by_backward(g, saved)
    if len(useful) < len(saved):
        saved = useful
        cost = int(sum(int(facts.capacity[g._index[s]]) for s in saved))
    t_end = time.perf_counter()
    return Plan.from_saved_set(
        g, saved, solver=f"mincut-{mode}", options={} if tie_break else {"tie_break": False},
        cost=float(cost), solve_seconds=t_end - t0, banned=ban,
        details={"build_seconds": t_build - t0, "maxflow_seconds": t_end - t_build,
                 "flow_vertices": num_vertices, "flow_arcs": len(tails)},
    )


def solver(mode: str):
    """The min cut in ``mode`` with the solvers' signature: a budget, if given, is judged by
    the simulator (the cut does not search over it: it fits or it does not)."""
    if mode not in MODES:
        raise ValueError(f"unknown min-cut mode {mode!r}; use one of {MODES}")

    def solve_mincut(g: Graph, *, budget: float | None = None, cost_model=None,
                     time_limit: float | None = None, tie_break: bool = True) -> Plan:
        return mincut(g, mode, tie_break)

    solve_mincut.__name__ = f"mincut_{mode}"
    solve_mincut.__doc__ = f"seeds/000's fusion-aware min cut, {mode} mode."
    return solve_mincut


def _read_by_backward(g: Graph, saved: list[str]) -> list[str]:
    """The saved values that the backward reads (or returns) when ``saved`` is the saved set."""
    work = backward_work(g, saved)
    a = g._arrays
    index = g._index
    reader = ~a.forward | a.backward_output
    reader[[index[c] for c in work.computed]] = True
    read = np.zeros(a.n, dtype=bool)
    read[a.in_idx[np.repeat(reader, np.diff(a.in_ptr))]] = True
    keep = (read | a.backward_output).tolist()
    return [s for s in saved if keep[index[s]]]


def cut_cost(g: Graph, saved, mode: str = "conservative") -> int:
    """The seeds' cost of a saved set: sum of w (materialized) or 2w over the saved nodes."""
    if mode not in MODES:
        raise ValueError(f"unknown min-cut mode {mode!r}; use one of {MODES}")
    capacity = g._derived("mincut_facts", _graph_facts).capacity
    return sum(int(capacity[g.index(s)]) for s in saved)


def banned(g: Graph, mode: str = "conservative") -> dict[str, str]:
    return _analyse(g, mode)[1]


__all__ = ["mincut", "solver", "analyse", "cut_cost", "banned", "MODES"]
