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


def _solve(n: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray, s: int, t: int):
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
    return value, flows, real_caps, source


def min_cut(n: int, tails, heads, caps, s: int, t: int) -> Cut:
    """Minimum s-t cut of a graph with ``n`` vertices given as arc arrays (``INF`` = infinite)."""
    tails, heads, caps = (np.asarray(a, dtype=np.int64) for a in (tails, heads, caps))
    value, _, _, source = _solve(n, tails, heads, caps, s, t)
    return Cut(source, int(value))


def lexicographic_min_cut(n: int, tails, heads, caps, *tie_breaks, s: int = 0, t: int = 1) -> Cut:
    """Among all minimum cuts for ``caps``, one that minimizes ``tie_breaks[0]``, then
    among those ``tie_breaks[1]``, and so on (capacities per arc, >= 0).

    Exact, with no scaling of one objective into another: after a max-flow, a cut is
    minimum iff no residual arc leaves its source side (Picard-Queyranne). Each next
    max-flow keeps those residual arcs as infinite constraints and prices only the saturated
    arcs with the next objective, so a tie-break can never raise an earlier objective.
    """
    tails, heads, caps = (np.asarray(a, dtype=np.int64) for a in (tails, heads, caps))
    levels = [np.asarray(tb, dtype=np.int64) for tb in tie_breaks]
    value, flows, real_caps, source = _solve(n, tails, heads, caps, s, t)
    cut = Cut(source, int(value))
    origin = np.arange(len(tails))  # which input arc each arc of the current network prices
    for level in levels:
        forward_residual = flows < real_caps
        backward_residual = flows > 0
        saturated = ~forward_residual
        t2 = np.concatenate([tails[forward_residual], heads[backward_residual], tails[saturated]])
        h2 = np.concatenate([heads[forward_residual], tails[backward_residual], heads[saturated]])
        sat_origin = origin[saturated]
        priced = sat_origin >= 0
        sec = np.where(priced, level[np.maximum(sat_origin, 0)], 0)
        sec = np.maximum(sec, 0)
        total = int(sec.sum())
        if total >= _INT64_SAFE // 4:  # keep room for the derived "infinity"
            sec = sec // (total // (_INT64_SAFE // 8) + 1)
        n_constraints = int(forward_residual.sum() + backward_residual.sum())
        caps2 = np.concatenate([np.full(n_constraints, INF, dtype=np.int64), sec])
        tails, heads = t2, h2
        origin = np.concatenate([np.full(n_constraints, -1), sat_origin])
        value2, flows, real_caps, source = _solve(n, tails, heads, caps2, s, t)
        cut = Cut(source, cut.value, (cut.secondary_value or ()) + (int(value2),))
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
