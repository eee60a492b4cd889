"""The replay's result by array operations, for schedules of computes and frees judged without a
fusing compiler (no registers, no in-place writes, no kernel groups, no copies): a min cut's
plan of a 50,000-node graph is judged in a few tens of milliseconds instead of a second.

Every rule of the replay reads here as an operation on all statements at once:

- *validity*: each value's computes and frees alternate, starting with a compute; no input or
  parameter is computed or freed, nor a kept value freed; a value computed only once is; every
  input a compute reads is resident (its last event before the read is a compute); every
  required node is computed. A schedule that breaks any of these goes to the replay, which
  names the problem in its words;
- *memory*: the references to each storage, counted in statement order per storage, allocate
  it at the first and free it at the last; the peak is the greatest resident total plus the
  workspace of the op running;
- *traffic*: per copy of a value (a compute of it), the first read across the phases writes it
  (a saved value), and the first read of it by fused kernels in each phase loads it; a
  non-fusible kernel reads all its inputs;
- *time*: computes run back to back, each taking its share of the fused prediction, summed in
  statement order as the replay sums them, so every float comes out bit for bit the same.

Graphs with channels-last input copies (``meta["layout_copy"]``) go to the replay too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...cost.model import CostModel, constant_bytes, materialized, storage_arrays
from ...graph.graph import Graph
from ..schedule import (Schedule, codes_of, dropped_outputs, gc_paused, kept_to_end, never_recomputed, required_nodes,
                        statement_codes)
from .layout import layout_sizes
from .tuples import item_table, root_tangent_array, tuple_workspace
from .result import SimResult


def vectorised(schedule: Schedule, cm: CostModel, *, timeline: bool = True) -> SimResult | None:
    """:func:`~remat.plans.simulator.simulate`'s result for a valid schedule of computes and
    frees under a cost model without ``fused_memory``; None for any other schedule (the
    replay judges it)."""
    g: Graph = schedule.graph
    if cm.fused_memory or layout_sizes(g):
        return None
    stmts = schedule.statements
    n_st = len(stmts)
    code = codes_of(g, stmts)  # a schedule just built from a saved set
    if code is None:
        try:
            code = np.fromiter(map(statement_codes(g).__getitem__, stmts), dtype=np.int64, count=n_st)
        except (KeyError, TypeError):  # an offload, a reload, or a name the graph lacks
            return None
    a = g._arrays
    node = code >> 1
    is_free = (code & 1).astype(bool)
    events = _events(g, node, is_free, n_st)
    if events is None:
        return None
    comp_k = np.flatnonzero(~is_free)  # the compute statements, in order
    comp_i = node[comp_k]
    reads = _reads(a, comp_k, comp_i, events, n_st)
    if reads is None:
        return None
    computed = np.zeros(a.n, dtype=bool)
    computed[comp_i] = True
    if (required_nodes(g) & ~computed).any():
        return None
    tl, mem_end, peak, peak_at, constant = _memory(g, cm, node, is_free, comp_k, comp_i, n_st)
    compute_cost, arith_total, traffic_total, kernels, t_end = _totals(g, cm, is_free, comp_i, reads)
    times = Times(is_free, t_end) if timeline else []
    tl = tl.tolist() if timeline else []
    n_computes = len(comp_i)
    return SimResult(
        valid=True, errors=[], peak_bytes=int(peak), peak_statement=int(peak_at),
        timeline=tl, constant_bytes=constant, end_bytes=int(mem_end),
        compute_cost=compute_cost, traffic_bytes=int(traffic_total),
        predicted_seconds=(compute_cost if _additive(g, cm) else
                           cm.seconds(compute_cost, traffic_total, arith_total, kernels)) + 0.0,
        computes=n_computes, recomputes=n_computes - int(computed.sum()),
        copy_seconds=0.0, wait_seconds=0.0, times=times,
    )


def _events(g: Graph, node: np.ndarray, is_free: np.ndarray, n_st: int):
    """Each value's computes and frees, sorted by (value, statement), with the key
    ``value * n_st + statement``; None when they break a rule."""
    a = g._arrays
    if a.primal[node].any():  # an input or a parameter computed or freed
        return None
    keep = kept_to_end(g) & ~dropped_outputs(g)
    if keep[node[is_free]].any():  # a kept value freed
        return None
    order = np.argsort(node, kind="stable")
    ev_node, ev_free = node[order], is_free[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = ev_node[1:] != ev_node[:-1]
    # a value's first event is a compute, and computes and frees alternate
    if ev_free[first].any() or (ev_free[1:] == ev_free[:-1])[~first[1:]].any():
        return None
    once = never_recomputed(g)
    if once.any() and (np.bincount(node[~is_free], minlength=a.n)[once] > 1).any():
        return None
    return ev_node * n_st + order, ev_node, ev_free, order


def _reads(a, comp_k: np.ndarray, comp_i: np.ndarray, events, n_st: int):
    """Every (compute, input) pair in statement order, with the copy of the input it reads
    (the compute statement that made it; ``-1 - input`` for an input or a parameter); None
    when an input is not resident."""
    ev_key, ev_node, ev_free, order = events
    deg = (a.in_ptr[1:] - a.in_ptr[:-1])[comp_i]
    total = int(deg.sum())
    q = np.repeat(np.arange(len(comp_i), dtype=np.int64), deg)  # the reading compute
    offs = np.cumsum(deg) - deg
    pos = np.arange(total, dtype=np.int64) - np.repeat(offs - a.in_ptr[comp_i], deg)
    j = a.in_idx[pos]  # the input read
    primal = a.primal[j]
    last = np.searchsorted(ev_key, j * n_st + comp_k[q]) - 1  # j's last event before the read
    ok = primal | ((last >= 0) & (ev_node[np.maximum(last, 0)] == j) & ~ev_free[np.maximum(last, 0)])
    if not ok.all():
        return None
    copy = np.where(primal, -1 - j, order[np.maximum(last, 0)])  # the statement that computed it
    return q, j, primal, copy


def _memory(g: Graph, cm: CostModel, node, is_free, comp_k, comp_i, n_st: int):
    """Bytes resident after each statement, at the end, the peak and where it is first reached."""
    a = g._arrays
    owner, sizes = _storage_arrays(g)
    o = owner[node]
    delta = np.where(is_free, -1, 1)
    roots = root_tangent_array(g)
    if roots.any():  # a loss's gradient: held by autograd to the step's end (.tuples)
        delta[is_free & roots[node]] = 0
    at_k = np.arange(n_st, dtype=np.int64)
    extra = _tuple_events(g, node, is_free)
    if extra is not None:  # a tuple holds its items from its compute to its free (.tuples)
        at_k = np.concatenate((at_k, extra[0]))
        o = np.concatenate((o, extra[1]))
        delta = np.concatenate((delta, extra[2]))
    refs0 = np.bincount(owner[a.primal], minlength=a.n)  # inputs and parameters hold theirs
    order = np.lexsort((at_k, o))  # per storage, in statement order
    so, sd = o[order], delta[order]
    run = np.cumsum(sd)
    start = np.ones(len(so), dtype=bool)
    start[1:] = so[1:] != so[:-1]
    base = np.maximum.accumulate(np.where(start, np.arange(len(so)), 0))  # each run's first event
    refs = run - (run[base] - sd[base]) + refs0[so]  # the storage's references after the event
    change = np.zeros(n_st, dtype=np.int64)
    np.add.at(change, at_k[order],
              np.where((sd > 0) & (refs == 1), sizes[so], np.where((sd < 0) & (refs == 0), -sizes[so], 0)))
    constant = g._derived(("vectorised", "constant"), constant_bytes)
    tl = constant + np.cumsum(change)
    peak, peak_at = constant, -1
    if len(comp_k):
        work = _workspace(g, cm)
        at = tl[comp_k] + work[comp_i]
        best = int(np.argmax(at))
        if at[best] > peak:
            peak, peak_at = int(at[best]), int(comp_k[best])
    return tl, int(tl[-1]) if n_st else constant, peak, peak_at, constant


def _totals(g: Graph, cm: CostModel, is_free, comp_i, reads):
    """The compute cost, arithmetic seconds, traffic and kernels, summed in statement order as the replay
    sums them, and the compute stream's clock after each compute."""
    a = g._arrays
    q, j, primal, copy = reads
    n_c = len(comp_i)
    if not n_c:
        return 0.0, 0.0, 0, 0, np.zeros(0)
    backward = np.logical_or.accumulate(~a.forward[comp_i])  # the phase of each compute
    phase = np.zeros(len(is_free), dtype=bool)
    phase[~is_free] = backward  # by statement
    mat = materialized(g)
    raw = a.bytes.astype(np.int64)
    reader_bw = backward[q]
    crosses = ~primal & (phase[np.maximum(copy, 0)] != reader_bw)
    raw_j, mat_j = raw[j], mat[j]
    fused_reader = a.fusible[comp_i][q]
    extra = np.where(fused_reader, 0, raw_j)  # every non-fusible kernel reads its inputs
    # a value saved for the backward: written by its first read across the phases
    _first(extra, raw_j, crosses & ~mat_j, copy)
    # fused readers share one read per phase of what is in memory
    _first(extra, raw_j, fused_reader & (mat_j | crosses), copy * 2 + reader_bw)
    cum = np.zeros(len(extra) + 1, dtype=np.int64)
    np.cumsum(extra, out=cum[1:])
    ends = np.cumsum(np.bincount(q, minlength=n_c))
    mat_c = mat[comp_i].astype(np.int64)
    traffic = raw[comp_i] * mat_c + cum[ends] - cum[np.concatenate(([0], ends[:-1]))]
    op_cost = cm.op_cost_array(g)[comp_i]
    arith = np.cumsum(cm.arithmetic_array(g)[comp_i])
    if _additive(g, cm):
        dt = op_cost
    else:
        dev = cm.device
        dt = np.diff(arith, prepend=0.0) + traffic / dev.bandwidth + mat_c * dev.launch_seconds
    return (float(np.cumsum(op_cost)[-1]), float(arith[-1]), int(traffic.sum()), int(mat_c.sum()),
            np.cumsum(dt))


def _first(extra: np.ndarray, raw_j: np.ndarray, mask: np.ndarray, key: np.ndarray) -> None:
    """Add ``raw_j`` to ``extra`` at the first read under ``mask`` of each ``key``."""
    idx = np.flatnonzero(mask)
    if len(idx):
        _, first = np.unique(key[idx], return_index=True)
        extra[idx[first]] += raw_j[idx[first]]


class Times(Sequence):
    """``(stream, start, end)`` per statement, as the replay lists them, made when first read:
    a compute runs from the previous compute's end to its own; a free takes no time. Judging
    a plan reads none of them; making 10^5 tuples took as long as the rest of the simulation."""

    __slots__ = ("_is_free", "_t_end", "_items")

    def __init__(self, is_free: np.ndarray, t_end: np.ndarray) -> None:
        self._is_free, self._t_end, self._items = is_free, t_end, None

    def _list(self) -> list:
        if self._items is None:
            clock = np.concatenate(([0.0], self._t_end))
            done = np.cumsum(~self._is_free)  # computes up to each statement
            start, end = clock[done - ~self._is_free].tolist(), clock[done].tolist()
            kinds = list(map(("compute", "").__getitem__, self._is_free.tolist()))
            with gc_paused():  # 10^5 tuples: the cyclic collector would scan the heap many times
                self._items = list(zip(kinds, start, end))
            self._is_free = self._t_end = None
        return self._items

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else len(self._is_free)

    def __getitem__(self, k):
        return self._list()[k]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and self._list() == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._list())


def _additive(g: Graph, cm: CostModel) -> bool:
    """:meth:`CostModel.uses_additive_time` (profiled costs once per graph)."""
    return cm.per_op or g._derived(("vectorised", "profiled"), cm.uses_profiled_costs)


def _storage_arrays(g: Graph):
    """:func:`storage_arrays`, the sizes as int64."""
    def arrays(g: Graph):
        owner, sizes = storage_arrays(g)
        return owner, sizes.astype(np.int64, copy=False)
    return g._derived(("vectorised", "storage_arrays"), arrays)


def _workspace(g: Graph, cm: CostModel) -> np.ndarray:
    return g._derived(("vectorised", "workspace", cm.device, cm.fused_memory),
                      lambda g: np.asarray(tuple_workspace(g, cm), dtype=np.int64))


def _tuple_events(g: Graph, node: np.ndarray, is_free: np.ndarray):
    """(statement, storage, +1/-1) of the references tuples hold on their items: taken at the
    tuple's compute, released at its free (the eager compiler's interpreter holds the tuple,
    and so every item, until its last getitem); None in a graph without tuples."""
    def table(g: Graph):
        items, tuples = item_table(g)
        if not len(items):
            return None
        counts = np.bincount(tuples, minlength=len(g))
        ptr = np.concatenate(([0], np.cumsum(counts)))
        flat = items[np.argsort(tuples, kind="stable")]  # per tuple, its items ascending
        return counts, ptr, _storage_arrays(g)[0][flat]
    t = g._derived(("vectorised", "tuple_items"), table)
    if t is None:
        return None
    counts, ptr, item_owner = t
    n_items = counts[node]
    if not n_items.any():
        return None
    ks = np.flatnonzero(n_items)
    rep = n_items[ks]
    k_ext = np.repeat(ks, rep)
    starts = np.repeat(ptr[node[ks]], rep)
    within = np.arange(int(rep.sum()), dtype=np.int64) - np.repeat(np.cumsum(rep) - rep, rep)
    o_ext = item_owner[starts + within]
    d_ext = np.where(is_free[k_ext], -1, 1)
    return k_ext, o_ext, d_ext
