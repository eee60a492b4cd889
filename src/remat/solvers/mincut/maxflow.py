"""Minimum s-t cuts with OR-Tools' compiled max-flow, including an exact lexicographic cut.

Convention: every function returns the **source side** of the cut as a boolean array. For a
plain min cut it is OR-Tools' minimal source side (the vertices reachable from ``s`` in the
residual graph). "Infinite" capacity is the sum of all finite capacities plus one: the largest
value that cannot be cut, and it keeps OR-Tools fast (with 2**62 it is ~500x slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.graph.python import max_flow

INF = -1
"""Marker for an infinite capacity in the ``caps`` arrays passed to this module."""

_INT64_SAFE = 2**62


@dataclass
class Cut:
    source_side: np.ndarray  # bool per vertex
    value: int  # primary cut value (sum of cut capacities)
    secondary_value: tuple[int, ...] | None = None  # one value per tie-break level


class InfiniteCutError(Exception):
    """Every s-t cut crosses an infinite edge. ``path`` is one all-infinite s-t path."""

    def __init__(self, path: list[int]):
        super().__init__(f"no finite s-t cut; infinite path through vertices {path}")
        self.path = path


def _solve(n: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray, s: int, t: int,
           sink_side: bool = False):
    finite = caps != INF
    total = int(caps[finite].sum()) if finite.any() else 0
    if total >= _INT64_SAFE:
        raise OverflowError(f"sum of capacities {total} exceeds the int64 range max-flow can use")
    inf = total + 1
    real_caps = np.where(finite, caps, inf).astype(np.int64)
    smf = max_flow.SimpleMaxFlow()
    if n:
        smf.add_arc_with_capacity(n - 1, n - 1, 0)  # make sure every vertex exists
    arcs = smf.add_arcs_with_capacity(tails.astype(np.int32), heads.astype(np.int32), real_caps)
    status = smf.solve(s, t)
    if status != smf.OPTIMAL:
        raise RuntimeError(f"OR-Tools max-flow failed with status {status}")
    value = smf.optimal_flow()
    if value >= inf:
        raise InfiniteCutError(_infinite_path(n, tails, heads, finite, s, t))
    flows = smf.flows(arcs)
    source = np.zeros(n, dtype=bool)
    source[np.asarray(smf.get_source_side_min_cut(), dtype=np.int64)] = True
    if sink_side:
        sink = np.zeros(n, dtype=bool)
        sink[np.asarray(smf.get_sink_side_min_cut(), dtype=np.int64)] = True
        return value, flows, real_caps, source, sink
    return value, flows, real_caps, source


def min_cut(n: int, tails, heads, caps, s: int, t: int) -> Cut:
    """Minimum s-t cut of a graph with ``n`` vertices given as arc arrays (``INF`` = infinite)."""
    tails, heads, caps = (np.asarray(a, dtype=np.int64) for a in (tails, heads, caps))
    value, _, _, source = _solve(n, tails, heads, caps, s, t)
    return Cut(source, int(value))


_LEVEL_MAX_TOTAL = 2**58  # a level's prices sum below this, leaving room for its "infinity"


def _tie_break_level(tb) -> np.ndarray:
    """Tie-break prices as int64 summing below ``_LEVEL_MAX_TOTAL``; larger prices are scaled
    down (only that tie-break loses precision: the primary cut stays exact)."""
    arr = np.maximum(np.asarray(tb), 0)
    if arr.dtype != object and (arr.size == 0 or int(arr.max()) < 2**52):
        arr = arr.astype(np.int64)
        if int(arr.sum()) < _LEVEL_MAX_TOTAL:
            return arr
    f = np.array([float(x) for x in arr.tolist()], dtype=np.float64)
    total = float(f.sum())
    if total >= _LEVEL_MAX_TOTAL:
        f *= (_LEVEL_MAX_TOTAL // 2) / total
    return f.astype(np.int64)


def lexicographic_min_cut(n: int, tails, heads, caps, *tie_breaks, s: int = 0, t: int = 1) -> Cut:
    """Among all minimum cuts for ``caps``, one that minimizes ``tie_breaks[0]``, then
    among those ``tie_breaks[1]``, and so on (capacities per arc, >= 0).

    Exact, with no scaling of one objective into another: after a max-flow, a cut is
    minimum iff no residual arc leaves its source side (Picard-Queyranne). Each next
    max-flow keeps those residual arcs as infinite constraints and prices only the saturated
    arcs with the next objective, so a tie-break can never raise an earlier objective.
    The result is the minimal source side among the lexicographically best cuts.

    Each next max-flow runs on the undecided part only: every remaining candidate cut holds
    the vertices reachable from ``s`` in the residual graph on its source side and those
    that reach ``t`` on its sink side, so these are merged into ``s`` and ``t`` (arcs between
    them are cut by every candidate and only add a constant).

    >>> # two cuts of cost 2 (s->a, or a->t); the tie-break prices the second one lower
    >>> cut = lexicographic_min_cut(3, [0, 2], [2, 1], [2, 2], [5, 1])
    >>> cut.value, cut.secondary_value, cut.source_side.tolist()
    (2, (1,), [True, False, True])
    """
    tails, heads, caps = (np.asarray(a, dtype=np.int64) for a in (tails, heads, caps))
    levels = [_tie_break_level(tb) for tb in tie_breaks]
    value, flows, real_caps, source, sink = _solve(n, tails, heads, caps, s, t, sink_side=True)
    cut = Cut(source, int(value))
    label = np.arange(n)  # original vertex -> vertex of the current (merged) network
    origin = np.arange(len(tails))  # which input arc each arc of the current network prices
    always_cut = np.zeros(0, dtype=np.int64)  # input arcs every remaining candidate cuts
    secondary: tuple[int, ...] = ()
    for level in levels:
        undecided = ~source & ~sink
        # the next network: residual arcs as infinite constraints, saturated arcs priced
        forward_residual = flows < real_caps
        backward_residual = flows > 0
        saturated = ~forward_residual
        c_tails = np.concatenate([tails[forward_residual], heads[backward_residual]])
        c_heads = np.concatenate([heads[forward_residual], tails[backward_residual]])
        p_tails, p_heads, p_origin = tails[saturated], heads[saturated], origin[saturated]
        always_cut = np.concatenate([always_cut, p_origin[source[p_tails] & sink[p_heads]]])
        # keep the arcs that some candidate cuts and some does not: they touch an undecided
        # vertex, do not leave the sink part, and do not enter the source part
        keep_c = (undecided[c_tails] | undecided[c_heads]) & ~sink[c_tails] & ~source[c_heads]
        keep_p = (undecided[p_tails] | undecided[p_heads]) & ~sink[p_tails] & ~source[p_heads]
        new_id = np.empty(len(source), dtype=np.int64)
        new_id[source], new_id[sink] = 0, 1
        n_undecided = int(undecided.sum())
        new_id[undecided] = np.arange(2, 2 + n_undecided)
        n_constraints = int(keep_c.sum())
        tails = new_id[np.concatenate([c_tails[keep_c], p_tails[keep_p]])]
        heads = new_id[np.concatenate([c_heads[keep_c], p_heads[keep_p]])]
        origin = np.concatenate([np.full(n_constraints, -1), p_origin[keep_p]])
        price = level[np.maximum(origin, 0)]
        caps2 = np.where(origin >= 0, price, INF)
        label = new_id[label]
        constant = int(level[always_cut].sum())
        value2, flows, real_caps, source, sink = _solve(2 + n_undecided, tails, heads, caps2, 0, 1,
                                                        sink_side=True)
        secondary += (constant + int(value2),)
        cut = Cut(source[label], cut.value, secondary)
    return cut


def _infinite_path(n, tails, heads, finite, s, t) -> list[int]:
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b, f in zip(tails.tolist(), heads.tolist(), finite.tolist()):
        if not f:
            adj[a].append(b)
    parent = {s: -1}
    stack = [s]
    while stack:
        u = stack.pop()
        if u == t:
            break
        for v in adj[u]:
            if v not in parent:
                parent[v] = u
                stack.append(v)
    path, cur = [], t
    while cur in parent and cur != -1:
        path.append(cur)
        cur = parent[cur]
    return list(reversed(path))
