"""Schedules: the order in which a training step computes and frees values.

A :class:`Schedule` is a list of statements over a :class:`~remat.graph.Graph`:
``compute v`` evaluates node ``v`` (computing it a second time is a recomputation) and
``free v`` releases its memory (seeds/001 Section 4.9, Algorithm 1). ``offload v`` copies a
resident value to host memory on the copy stream (its device memory is released by the next
``free v``, once the copy is done) and ``reload v`` copies it back before a use (seeds/004
Section 5.2's Store and Load; JSON ``{"op": "offload", "node": "v"}``). Inputs and parameters
are resident from the start and are never computed or freed; a tangent is computed (it
costs nothing and reads nothing) when the backward starts. Every solver's plan lowers to a
Schedule so that one simulator (:mod:`remat.plans.simulator`) judges all of them.

>>> from remat.graph.examples import cos_cos_graph
>>> s = schedule_from_saved_set(cos_cos_graph(), ["add_2"])
>>> [str(st) for st in s.statements][:4]
['compute add', 'compute add_1', 'free add', 'compute add_2']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import PlanError
from ..graph.graph import Graph, gc_paused
from .saved_set import _required_forward, backward_work

OPS = ("compute", "free", "offload", "reload")
"""Statement kinds: compute and free (recomputation), offload and reload (swapping)."""

COPIES = ("offload", "reload")
"""The statements that run on the copy stream."""


class Statement(NamedTuple):
    """One statement: ``op`` (one of :data:`OPS`) of ``node``."""

    op: str
    node: str

    def __str__(self) -> str:
        return f"{self.op} {self.node}"


@dataclass
class Schedule:
    """An ordered list of statements; ``meta`` holds what the solver wants to report."""

    graph: Graph = field(repr=False)
    statements: list[Statement]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.statements)

    @property
    def computes(self) -> list[str]:
        return [s.node for s in self.statements if s.op == "compute"]

    def compute_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in self.computes:
            counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def recomputed(self) -> list[str]:
        """Nodes computed more than once, in first-computation order."""
        return [n for n, c in self.compute_counts().items() if c > 1]

    @property
    def offloaded(self) -> list[str]:
        """Nodes the schedule offloads to host memory, in first-offload order."""
        return list(dict.fromkeys(s.node for s in self.statements if s.op == "offload"))

    def to_list(self) -> list[dict[str, str]]:
        return [{"op": s.op, "node": s.node} for s in self.statements]

    @classmethod
    def from_list(cls, g: Graph, items: Iterable[Mapping[str, str]] | Iterable[Sequence[str]],
                  meta: Mapping[str, Any] | None = None) -> "Schedule":
        """Statements from ``[{"op": "compute", "node": "x"}, ...]`` or ``[("compute", "x"), ...]``."""
        stmts = []
        for k, it in enumerate(items):
            op, node = (it["op"], it["node"]) if isinstance(it, Mapping) else tuple(it)
            if op not in OPS:
                raise PlanError(f"statement {k}: unknown op {op!r}; use one of {OPS}")
            if node not in g:
                raise PlanError(f"statement {k}: {op} {node!r} names no node of graph {g.name!r}")
            stmts.append(Statement(op, node))
        return cls(g, stmts, dict(meta or {}))

    def __str__(self) -> str:
        return "\n".join(map(str, self.statements))


def statement_table(g: Graph) -> list[Statement]:
    """Every node's two statements, made once per graph: ``compute`` of node ``i`` at ``2 * i``,
    ``free`` at ``2 * i + 1`` (a large schedule shares them instead of making 10^5 tuples)."""
    return g._derived("statement_table", lambda g: [
        Statement(op, name) for name in g._arrays.names for op in ("compute", "free")])


def _statement_array(g: Graph) -> np.ndarray:
    """:func:`statement_table` as an object array, to pick a schedule's statements by code."""
    def array(g: Graph) -> np.ndarray:
        table = statement_table(g)
        out = np.empty(len(table), dtype=object)
        for k, st in enumerate(table):
            out[k] = st
        return out
    return g._derived("statement_array", array)


def statements_of(g: Graph, codes: np.ndarray) -> list[Statement]:
    """The statements with these codes (:func:`statement_codes`), shared with the graph's
    table. The last list made here is remembered with its codes (:func:`codes_of`)."""
    stmts = _statement_array(g)[codes].tolist()
    g._memo["last_statements"] = (list(stmts), codes)  # a copy: the caller's list may change
    return stmts


def codes_of(g: Graph, stmts: Sequence[Statement]) -> np.ndarray | None:
    """The codes of ``stmts`` when they equal the last list :func:`statements_of` made (a
    schedule judged right after it was built: comparing the lists costs a pointer check per
    statement, looking the codes up a hash each); None otherwise."""
    last = g._memo.get("last_statements")
    if last is not None and len(last[0]) == len(stmts) and last[0] == stmts:
        return last[1]
    return None


def statement_codes(g: Graph) -> dict[Statement, int]:
    """``{statement: code}`` for the statements of :func:`statement_table` (``2 * i`` computes
    node ``i``, ``2 * i + 1`` frees it); plain ``(op, name)`` tuples find their code too."""
    return g._derived("statement_codes", lambda g: {st: k for k, st in enumerate(statement_table(g))})


def kept_to_end(g: Graph) -> np.ndarray:
    """Values that live until the step ends: forward outputs (the loss), values the backward
    returns (gradients) and primal inputs and parameters. A schedule never frees them."""
    a = g._arrays
    return a.primal | a.is_output | a.backward_output


def dropped_outputs(g: Graph) -> np.ndarray:
    """Forward outputs the caller drops as the forward returns (``g.meta["outputs"] ==
    "dropped"``, remat.compile's ``outputs="dropped"``): a schedule keeps them to the forward's
    end, then frees them, or after the backward's last read of those the backward reads."""
    a = g._arrays
    if (g.meta or {}).get("outputs") != "dropped":
        return np.zeros(a.n, dtype=bool)
    return a.is_output & a.forward & ~a.primal & ~a.backward_output


def never_recomputed(g: Graph) -> np.ndarray:
    """Nodes a schedule may compute only once: random ops (a second run would draw fresh
    randomness) and nodes flagged ``must_save``."""
    def once(g: Graph) -> np.ndarray:
        a = g._arrays
        random = np.array([n.category == "random" for n in g.nodes], dtype=bool)
        return (random | a.must_save) & ~a.primal
    return g._derived("never_recomputed", once).copy()


def required_nodes(g: Graph) -> np.ndarray:
    """Nodes every schedule must compute at least once: the forward values the outputs need
    and every backward node (tangents included); primals are resident, not computed."""
    def required(g: Graph) -> np.ndarray:
        a = g._arrays
        return (np.array(_required_forward(g), dtype=bool) | ~a.forward) & ~a.primal
    return g._derived("required_nodes", required).copy()


def schedule_from_saved_set(g: Graph, saved: Iterable[str]) -> Schedule:
    """Lower a saved-set plan to a Schedule, as PyTorch runs it.

    Forward: the required forward nodes (:func:`~remat.plans.saved_set.required_forward`:
    what the outputs and the side effects need) in graph order, each value freed after its
    last forward use unless it is saved or kept to the end. Backward: tangents first, then the
    backward nodes in graph order from the first one that reads a tangent, each preceded by
    the values it needs that are not computed yet (unsaved forward values recomputed on
    demand), in graph order, as PyTorch's partitioner orders the backward to mimic the
    autograd engine; every value is freed after its last backward use.
    """
    with gc_paused():
        return _schedule_from_saved_set(g, saved)


def _schedule_from_saved_set(g: Graph, saved: Iterable[str]) -> Schedule:
    saved = list(dict.fromkeys(saved))
    work = backward_work(g, saved)
    if work.missing_inputs:
        raise PlanError(f"saved set of {g.name!r} misses primal inputs the backward needs: "
                        f"{list(work.missing_inputs)[:5]}")
    a = g._arrays
    n = a.n
    ins = g.input_indices
    index = g._index
    keep = kept_to_end(g)
    is_saved = np.zeros(n, dtype=bool)
    is_saved[[index[s] for s in saved]] = True

    # the forward computes what its outputs and side effects need (required_nodes) and every
    # saved value, with its ancestors
    in_fwd = required_nodes(g) & a.forward
    stack = np.flatnonzero(is_saved & ~in_fwd & ~a.primal).tolist()
    while stack:
        i = stack.pop()
        if in_fwd[i] or a.primal[i]:
            continue
        in_fwd[i] = True
        stack.extend(ins[i])
    bwd_work = np.zeros(n, dtype=bool)
    bwd_work[[index[c] for c in work.computed]] = True
    bwd = _backward_order(g, is_saved, in_fwd, bwd_work, keep)

    # the backward reads each saved value, then frees it after its last backward use; so too
    # each output the caller drops as the forward returns
    dropped = dropped_outputs(g)
    codes = np.concatenate((
        _phase(a, np.flatnonzero(in_fwd), keep | is_saved),
        _phase(a, bwd, keep & ~dropped, np.flatnonzero((is_saved | dropped) & ~a.primal))))
    return Schedule(g, statements_of(g, codes), {"lowered_from": "saved_set", "saved": saved})


def _backward_order(g: Graph, is_saved: np.ndarray, in_fwd: np.ndarray, bwd_work: np.ndarray,
                    keep: np.ndarray) -> np.ndarray:
    """The backward's nodes in the order PyTorch's ``reordering_to_mimic_autograd_engine`` runs
    them: tangents first; then, from the first user of a tangent on, each node the backward
    runs (a root) in graph order, preceded by the values it needs that are not computed yet
    (unsaved forward values recomputed on demand, backward nodes that do not read a tangent) in
    graph order; then the roots before that first user.

    A root pulls in the values it needs unless an earlier root did, so each value comes with
    the first root, in that order, that reaches it through values the backward computes: one
    sweep against the topological order finds that root's position (``key``) for every value,
    and the backward is the values sorted by (key, graph order).

    What it runs: its own nodes and the forward values it computes (a forward backward_output
    that is not saved included) that something it runs reads. backward_work computes an unsaved
    output again, but this backward reads it, kept to the end: what only that output needed is
    not run (a tanh head's matmul was scheduled once more at the backward's end, read by
    nothing)."""
    a = g._arrays
    n = a.n
    tangent = g._derived("tangents", lambda g: np.array([x.role == "tangent" for x in g.nodes], dtype=bool))
    tangents = np.flatnonzero(tangent)
    users = a.user_idx
    firsts = [users[a.user_ptr[t]:a.user_ptr[t + 1]] for t in tangents.tolist()]
    first = int(min((int(u.min()) for u in firsts if len(u)), default=n))
    held = is_saved | (keep & in_fwd)  # saved, or an output kept anyway
    # what the backward computes when a reader needs it: its own nodes, and the forward values
    # backward_work computes that are not held
    needed = ~a.primal & ~tangent & (~a.forward | (bwd_work & ~held))
    seed = ~a.forward | (bwd_work & a.backward_output & needed)  # what it runs whoever reads it
    root = ~a.forward | bwd_work
    inf = 2 * n + 1
    key = [inf] * n
    ptr, uidx = a.user_ptr.tolist(), users.tolist()
    needed_l, seed_l, root_l = needed.tolist(), seed.tolist(), root.tolist()
    for j in np.flatnonzero(needed | seed)[::-1].tolist():
        best = inf
        if needed_l[j]:
            for u in uidx[ptr[j]:ptr[j + 1]]:
                if key[u] < best:
                    best = key[u]
        if best < inf or seed_l[j]:  # run: by a reader, or whoever reads it
            if root_l[j]:
                own = j if j >= first else j + n  # roots from the first tangent user on come first
                if own < best:
                    best = own
            key[j] = best
    keys = np.array(key, dtype=np.int64)
    runs = np.flatnonzero((keys < inf) & ~tangent)  # in graph order; sorted by key, stably
    return np.concatenate((tangents, runs[np.argsort(keys[runs], kind="stable")]))


def _phase(a, order: np.ndarray, keep: np.ndarray, carried: np.ndarray | None = None) -> np.ndarray:
    """The statement codes (:func:`statement_codes`) of one phase: ``compute`` for each node
    of ``order``, with ``free`` after each value's last use within this phase; values in
    ``keep`` are not freed. ``carried`` values (computed in an earlier phase) are freed after
    their last use here (after the phase's own frees there), or at its start if unused."""
    order = np.asarray(order, dtype=np.int64)
    carried = np.zeros(0, dtype=np.int64) if carried is None else np.asarray(carried, dtype=np.int64)
    pos = np.arange(len(order), dtype=np.int64)
    deg = a.in_ptr[order + 1] - a.in_ptr[order]
    at = np.arange(int(deg.sum()), dtype=np.int64) - np.repeat(np.cumsum(deg) - deg - a.in_ptr[order], deg)
    last_use = np.full(a.n, -1, dtype=np.int64)
    np.maximum.at(last_use, a.in_idx[at], np.repeat(pos, deg))
    freed = ~keep[order]
    values, when = order[freed], pos[freed]
    carried = carried[~keep[carried]]
    slot = np.concatenate((pos, np.maximum(last_use[values], when), last_use[carried]))
    kind = np.concatenate((np.zeros(len(order), np.int64), np.ones(len(values), np.int64),
                           np.full(len(carried), 2, np.int64)))
    rank = np.concatenate((np.zeros(len(order), np.int64), when, np.arange(len(carried), dtype=np.int64)))
    codes = np.concatenate((2 * order, 2 * values + 1, 2 * carried + 1))
    return codes[np.lexsort((rank, kind, slot))]
