"""The arrays the cost model prices a graph's nodes from, all nodes at once (issue 39).

:class:`remat.cost.model.CostModel` prices every node of a graph once per device: its arithmetic
seconds (its FLOPs at the rate a call of its size reaches on an efficiency curve) and its
additive cost ``C_i``. It does so with array operations over the graph's arrays
(:class:`remat.graph.graph.GraphArrays`) and these helpers, in the very operations of the scalar
definitions (:func:`remat.cost.model.curve_rate`, :func:`remat.cost.model.elements`): numpy's
``+ - * /`` and comparisons round as Python's floats do, and the logarithms and exponentials
are ``math``'s (numpy's differ in the last bit), so every price comes out bit for bit the same.
On a 50,000-node graph this takes milliseconds; the loop over the nodes took a third of a cold
solve.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph.graph import _ROLE_CODE, CATEGORIES, Graph

OTHER, MATMUL, CONV = 0, 1, 2
"""Kernel kinds (:func:`remat.cost.model.kernel_kind`) as codes."""

_COMPUTE, _POINTWISE, _REDUCTION, _VIEW = (CATEGORIES.index(c) for c in ("compute", "pointwise", "reduction", "view"))
_TANGENT = _ROLE_CODE["tangent"]

ITEMSIZE = {"float64": 8, "int64": 8, "complex64": 8, "float16": 2, "bfloat16": 2, "int16": 2,
            "bool": 1, "int8": 1, "uint8": 1}
"""Bytes per element by dtype name (others: 4)."""


def curve_rates(curve: tuple, x: np.ndarray) -> np.ndarray:
    """:func:`~remat.cost.model.curve_rate` of ``curve`` (a
    :data:`~remat.cost.model.Curve`) at each of ``x``, bit for bit.

    >>> from remat.cost.model import curve_rate
    >>> c = ((1e3, 1e9), (1e5, 1e11))
    >>> [float(r) for r in curve_rates(c, np.array([10.0, 1e4, 3e4, 1e9]))] == \\
    ...     [curve_rate(c, f) for f in (10.0, 1e4, 3e4, 1e9)]
    True
    """
    x = np.asarray(x, dtype=np.float64)
    fs = np.array([p[0] for p in curve], dtype=np.float64)
    out = np.empty(len(x), dtype=np.float64)
    low = x <= fs[0]
    high = ~low & (x >= fs[-1])
    out[low] = float(curve[0][1])
    out[high] = float(curve[-1][1])
    mid = np.flatnonzero(~low & ~high)
    if len(mid):
        xu, at = np.unique(x[mid], return_inverse=True)  # graphs repeat their sizes
        k = np.searchsorted(fs, xu, side="left")  # the first point at or above: segment (k-1, k)
        log_f = np.array([math.log(p[0]) for p in curve])
        log_r = np.array([math.log(p[1]) for p in curve])
        log_x = np.fromiter(map(math.log, xu.tolist()), dtype=np.float64, count=len(xu))
        t = (log_x - log_f[k - 1]) / (log_f[k] - log_f[k - 1])
        y = log_r[k - 1] + t * (log_r[k] - log_r[k - 1])
        out[mid] = np.fromiter(map(math.exp, y.tolist()), dtype=np.float64, count=len(y))[at.reshape(-1)]
    return out


def kernel_kinds(g: Graph) -> np.ndarray:
    """:func:`~remat.cost.model.kernel_kind` of every node as a code (:data:`OTHER`,
    :data:`MATMUL`, :data:`CONV`), once per graph."""
    def kinds(g: Graph) -> np.ndarray:
        a = g._arrays
        out = np.where(a.category == _COMPUTE, MATMUL, OTHER).astype(np.int8)
        ops = a.ops
        conv = [i for i in np.flatnonzero(out).tolist() if ops[i].startswith("convolution")]
        out[conv] = CONV
        return out
    return g._derived("kernel_kinds", kinds)


def itemsizes(g: Graph) -> np.ndarray:
    """Bytes per element of each node's dtype (:data:`ITEMSIZE`; others: 4)."""
    def sizes(g: Graph) -> np.ndarray:
        dtypes = [n.dtype for n in g.nodes]
        size = {d: ITEMSIZE.get(str(d), 4) for d in set(dtypes)}
        return np.fromiter(map(size.__getitem__, dtypes), dtype=np.int64, count=len(dtypes))
    return g._derived("itemsizes", sizes)


def element_counts(g: Graph) -> np.ndarray:
    """:func:`~remat.cost.model.elements` of every node: a pointwise op's output elements, a
    reduction's largest input's (the first of the largest), 0 for the rest."""
    a = g._arrays
    size = itemsizes(g)
    out = np.zeros(a.n, dtype=np.float64)
    pw = a.category == _POINTWISE
    out[pw] = a.bytes[pw] / size[pw]
    deg = np.diff(a.in_ptr)
    red = np.flatnonzero((a.category == _REDUCTION) & (deg > 0))
    if len(red):
        reader = np.repeat(np.arange(a.n), deg)
        on = np.isin(reader, red)
        rd, j = reader[on], a.in_idx[on]
        nbytes = a.bytes[j]
        best = np.zeros(a.n, dtype=nbytes.dtype)
        np.maximum.at(best, rd, nbytes)
        at_max = np.flatnonzero(nbytes == best[rd])
        _, first = np.unique(rd[at_max], return_index=True)  # in input order: the first largest
        pick, u = rd[at_max[first]], j[at_max[first]]
        out[pick] = a.bytes[u] / size[u]
    return out


def moved_bytes(g: Graph) -> np.ndarray:
    """Bytes each op moves run op by op, as float64: its output's and its distinct inputs'
    (summed exactly, as ints, before the conversion)."""
    def moved(g: Graph) -> np.ndarray:
        a = g._arrays
        nbytes = a.bytes  # int64, or Python ints (huge sizes)
        cum = np.concatenate((np.zeros(1, dtype=nbytes.dtype), np.cumsum(nbytes[a.in_idx])))
        return (nbytes + cum[a.in_ptr[1:]] - cum[a.in_ptr[:-1]]).astype(np.float64)
    return g._derived("moved_bytes", moved)


def placeholders(g: Graph) -> np.ndarray:
    """Primal inputs, parameters and tangents: values no op computes."""
    a = g._arrays
    return a.primal | ((g._role_code == _TANGENT) & (np.diff(a.in_ptr) == 0))
