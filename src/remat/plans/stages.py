"""Checkmate's staged view of a schedule (seeds/001 Sections 4.2-4.9).

The nodes that a step computes (every node but the primal inputs and parameters, which
are resident throughout) are numbered ``0..n-1`` in topological order (tangents just
before their first reader). Stage ``t`` computes
node ``t`` (frontier-advancing, eq. 8a) after recomputing whatever it needs. Two boolean
``n x n`` matrices describe a schedule:

- ``R[t, i]``: node ``i`` is computed in stage ``t`` (lower triangular, ``R[t, t] = 1``);
- ``S[t, i]``: value ``i`` is resident (checkpointed) at the start of stage ``t`` (``i < t``).

A schedule is correct when every computed node's inputs are computed earlier in the stage
or checkpointed (1b), and a checkpoint exists only if it was resident or computed in the
previous stage (1c). :func:`solve_r` completes a checkpoint matrix with the fewest
recomputations (the second phase of Algorithm 2, used by LP rounding and by every
baseline), and :func:`schedule_from_rs` emits the statements (Algorithm 1), freeing each
value right after its last use in the stage unless it is checkpointed for the next one.

Both matrices have a sparse form, for graphs where ``n x n`` does not fit (100k stages: 10 GB
each): :class:`Rows` (``R`` as the sorted list of nodes each stage computes) and :class:`Spans`
(``S`` as each value's ``[start, end)`` runs of stages in which it is held). Every function
here takes either form and gives the same schedule from both; :func:`solve_r` answers in the
form it was asked in, so dense callers (the MILP, small graphs) see what they always saw.
Work and memory in the sparse form are linear in the stages, the runs and the computations.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..graph.graph import Graph
from .schedule import Schedule, Statement, kept_to_end, never_recomputed


@dataclass(frozen=True)
class Staged:
    """The index maps between a Graph and its staged problem."""

    graph: Graph
    order: list[int]  # graph index of stage node t
    pos: dict[int, int]  # graph index -> stage number
    deps: list[list[int]]  # stage numbers of each node's non-primal inputs
    users: list[list[int]]  # stage numbers of each node's users
    kept: np.ndarray  # bool per stage node: kept to the end (outputs, gradients)
    once: np.ndarray  # bool per stage node: computed only once (random ops, must_save)
    container: np.ndarray  # bool per stage node: a tuple of tensors (its getitems hold them)
    forward_phase: np.ndarray  # bool per stage node: a forward value staged before the
    # backward starts (a forward-role node that only the backward reads, such as a batch
    # norm backward's ``x - mean``, sits in the backward and belongs to it)

    @property
    def n(self) -> int:
        return len(self.order)

    @property
    def names(self) -> list[str]:
        return [self.graph.nodes[i].name for i in self.order]

    def edges(self) -> list[tuple[int, int]]:
        return [(i, j) for j in range(self.n) for i in self.deps[j]]


def staged(g: Graph) -> Staged:
    """The staged problem of ``g`` (memoized per graph)."""
    return g._derived("staged", _build)


def _build(g: Graph) -> Staged:
    a = g._arrays
    # topological order, with each tangent placed just before its first reader (a joint
    # graph lists tangents with the primals, but they arrive when the backward starts) and
    # each forward value nothing reads (a side effect such as a running-stat update, which
    # PyTorch runs in the forward) right after its inputs
    tangent = np.array([n.role == "tangent" for n in g.nodes], dtype=bool)
    n_users = np.diff(a.user_ptr)
    sink = a.forward & ~a.primal & (n_users == 0)
    ins = g.input_indices
    ready: dict[int, list[int]] = {}
    for i in np.flatnonzero(sink).tolist():
        after = max((j for j in ins[i] if not a.primal[j]), default=-1)
        ready.setdefault(after, []).append(i)
    placed = np.zeros(a.n, dtype=bool)
    order: list[int] = list(ready.pop(-1, []))

    def place(i: int) -> None:
        for j in ins[i]:
            if tangent[j] and not placed[j]:
                placed[j] = True
                order.append(j)
        order.append(i)
        for k in ready.pop(i, ()):
            place(k)

    for i in np.flatnonzero(~a.primal & ~tangent & ~sink).tolist():
        place(i)
    order += [j for j in np.flatnonzero(tangent & ~placed).tolist()]
    pos = {gi: t for t, gi in enumerate(order)}
    deps = [[pos[j] for j in ins[gi] if j in pos] for gi in order]
    deps = [sorted(set(d)) for d in deps]
    users: list[list[int]] = [[] for _ in order]
    for j, d in enumerate(deps):
        for i in d:
            users[i].append(j)
    kept = kept_to_end(g)[order]
    once = never_recomputed(g)[order]
    fwd = a.forward[order] if order else np.zeros(0, dtype=bool)
    later = np.flatnonzero(~fwd)
    forward_phase = fwd.copy()
    if len(later):
        forward_phase[later[0]:] = False
    container = np.array([bool(g.nodes[i].meta and g.nodes[i].meta.get("container"))
                          for i in order], dtype=bool)
    return Staged(g, order, pos, deps, users, kept, once, container, forward_phase)


# -- the sparse forms ----------------------------------------------------------------------
@dataclass(frozen=True)
class Rows:
    """``R`` sparsely: ``rows[t]`` is the sorted list of the nodes stage ``t`` computes.

    >>> Rows.diagonal(3).rows, Rows.diagonal(2).dense().tolist()
    ([[0], [1], [2]], [[True, False], [False, True]])
    """

    n: int
    rows: list[list[int]]

    @classmethod
    def diagonal(cls, n: int) -> "Rows":
        """Each stage computes its own node and nothing else (no recomputation)."""
        return cls(n, [[t] for t in range(n)])

    @classmethod
    def from_dense(cls, R: np.ndarray) -> "Rows":
        R = np.asarray(R, dtype=bool)
        return cls(R.shape[0], [np.flatnonzero(r).tolist() for r in R])

    def dense(self) -> np.ndarray:
        R = np.zeros((self.n, self.n), dtype=bool)
        for t, row in enumerate(self.rows):
            R[t, row] = True
        return R

    @property
    def count(self) -> int:
        """Computations in all (the dense ``R.sum()``)."""
        return sum(len(r) for r in self.rows)

    def last_stage(self) -> np.ndarray:
        """Per node, the last stage that computes it (-1 where none does)."""
        last = np.full(self.n, -1, dtype=np.int64)
        for t, row in enumerate(self.rows):
            if row:
                last[row] = t
        return last


@dataclass(frozen=True)
class Spans:
    """``S`` sparsely: value ``col[k]`` is held in stages ``start[k] <= t < end[k]``.

    Made by :meth:`of`, which merges overlapping and touching runs of a value, so that each
    value's runs are disjoint, apart and in order (sorted by value, then stage).

    >>> s = Spans.of(4, [0, 0, 1], [1, 2, 3], [3, 4, 4])
    >>> s.col.tolist(), s.start.tolist(), s.end.tolist()
    ([0, 1], [1, 3], [4, 4])
    >>> s.dense()[:, 0].tolist()
    [False, True, True, True]
    """

    n: int
    col: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, n: int, col, start, end) -> "Spans":
        col = np.asarray(col, dtype=np.int64).ravel()
        start = np.clip(np.asarray(start, dtype=np.int64).ravel(), 0, n)
        end = np.clip(np.asarray(end, dtype=np.int64).ravel(), 0, n)
        keep = start < end
        col, start, end = col[keep], start[keep], end[keep]
        if len(col) == 0:
            z = np.zeros(0, dtype=np.int64)
            return cls(n, z, z.copy(), z.copy())
        o = np.lexsort((start, col))
        col, start, end = col[o], start[o], end[o]
        # the running end within a value (values sorted: a larger value's key dominates)
        key = np.maximum.accumulate(col * (n + 1) + end)
        reach = key - col * (n + 1)
        new = np.ones(len(col), dtype=bool)
        new[1:] = (col[1:] != col[:-1]) | (start[1:] > reach[:-1])
        first = np.flatnonzero(new)
        last = np.append(first[1:], len(col)) - 1
        return cls(n, col[first], start[first], reach[last])

    @classmethod
    def empty(cls, n: int) -> "Spans":
        return cls.of(n, [], [], [])

    @classmethod
    def from_dense(cls, S: np.ndarray) -> "Spans":
        S = np.asarray(S, dtype=bool)
        n = S.shape[0]
        pad = np.zeros((n + 2, n), dtype=np.int8)
        pad[1:n + 1] = S
        d = np.diff(pad, axis=0).T  # per value: +1 at the stage a run starts, -1 one past its end
        col, start = np.nonzero(d == 1)
        _, end = np.nonzero(d == -1)
        return cls.of(n, col, start, end)

    def dense(self) -> np.ndarray:
        S = np.zeros((self.n, self.n), dtype=bool)
        for c, a, b in zip(self.col.tolist(), self.start.tolist(), self.end.tolist()):
            S[a:b, c] = True
        return S

    def __or__(self, other: "Spans") -> "Spans":
        return Spans.of(self.n, np.concatenate([self.col, other.col]),
                        np.concatenate([self.start, other.start]), np.concatenate([self.end, other.end]))

    def events(self) -> tuple[list[list[int]], list[list[int]]]:
        """``(enter, leave)``: per stage ``t`` (``0..n``), the values whose run starts at ``t``
        and those whose run ends just before it."""
        enter: list[list[int]] = [[] for _ in range(self.n + 1)]
        leave: list[list[int]] = [[] for _ in range(self.n + 1)]
        for c, a, b in zip(self.col.tolist(), self.start.tolist(), self.end.tolist()):
            enter[a].append(c)
            leave[b].append(c)
        return enter, leave


def _rows(st: Staged, R) -> Rows:
    if R is None:
        return Rows.diagonal(st.n)
    return R if isinstance(R, Rows) else Rows.from_dense(R)


def _spans(S) -> Spans:
    return S if isinstance(S, Spans) else Spans.from_dense(S)


def lifetime_spans(st: Staged, mask: np.ndarray | None = None) -> Spans:
    """:func:`lifetime_matrix` as :class:`Spans`: each value (those in ``mask``; all by
    default) held from its own stage through its last reader's."""
    idx = np.arange(st.n, dtype=np.int64) if mask is None else np.flatnonzero(mask)
    last = np.array([max(st.users[i], default=i) for i in idx.tolist()], dtype=np.int64)
    return Spans.of(st.n, idx, idx + 1, last + 1)


def lifetime_matrix(st: Staged, mask: np.ndarray | None = None) -> np.ndarray:
    """``S`` holding each value (those in ``mask``; all by default) from its own stage
    through its last reader's, and no longer: with every value held, no recomputation."""
    return lifetime_spans(st, mask).dense()


def held_spans(st: Staged, S) -> Spans:
    """:func:`held_matrix` as :class:`Spans` (``S`` in either form)."""
    s = _spans(S)
    start = np.maximum(s.start, s.col + 1)  # strictly lower triangular
    kept = np.flatnonzero(st.kept)
    return Spans.of(st.n, np.concatenate([s.col, kept]), np.concatenate([start, kept + 1]),
                    np.concatenate([s.end, np.full(len(kept), st.n, dtype=np.int64)]))


def held_matrix(st: Staged, S: np.ndarray) -> np.ndarray:
    """``S`` as a boolean strictly lower triangular matrix, with values kept to the end
    (outputs, gradients) held in every stage after their own."""
    S = np.tril(np.asarray(S, dtype=bool), -1)
    return S | np.tril(np.broadcast_to(st.kept[None, :], S.shape), -1)


def effective_spans(st: Staged, R, S) -> Spans:
    """:func:`effective_s` as :class:`Spans` (``R`` and ``S`` in either form)."""
    held = held_spans(st, S)
    once = np.flatnonzero(st.once & ~st.kept)
    if len(once) == 0:
        return held
    last_in = _rows(st, R).last_stage()
    last = np.empty(len(once), dtype=np.int64)
    for k, i in enumerate(once.tolist()):
        users = st.users[i]
        last[k] = max(i, int(last_in[users].max())) if users else i
    # the value computed only once: held from its stage through ``last``, and not after
    cut = np.full(st.n, st.n, dtype=np.int64)
    cut[once] = last + 1
    both = held | Spans.of(st.n, once, once + 1, last + 1)
    return Spans.of(st.n, both.col, both.start, np.minimum(both.end, cut[both.col]))


def effective_s(st: Staged, R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The checkpoints a schedule really holds: :func:`held_matrix`, plus each value that may
    be computed only once (random ops) held from its stage to the last stage that reads it
    (and dropped after, so it is never re-established)."""
    return effective_spans(st, R, S).dense()


def solve_r(st: Staged, S):
    """The fewest computations that make checkpoint matrix ``S`` correct.

    ``S`` is an ``n x n`` 0/1 matrix (or :class:`Spans`); entries on or above the diagonal are
    ignored (a value cannot be resident before its stage). Returns ``R`` (boolean, or
    :class:`Rows` for :class:`Spans`): stage ``t`` computes node ``t``, every checkpoint of
    stage ``t + 1`` that stage ``t`` does not hold (1c), and, against the topological order,
    every input of a computed node that is not held (1b).
    """
    rows = _solve_rows(st, held_spans(st, S))
    return rows if isinstance(S, Spans) else rows.dense()


def _solve_rows(st: Staged, held: Spans) -> Rows:
    n = st.n
    enter, leave = held.events()
    deps = st.deps
    once = st.once.tolist()
    S_t = [False] * n  # the held row of stage t
    rows: list[list[int]] = []
    for t in range(n):
        for c in leave[t]:
            S_t[c] = False
        for c in enter[t]:
            S_t[c] = True

        def held_now(i: int) -> bool:
            # a value computed only once stays held while anything reads it (effective_s)
            return S_t[i] or (once[i] and i < t)

        marked = {t}
        # checkpoints of stage t + 1 that stage t does not hold (runs are apart: a run that
        # starts at t + 1 was not held at t)
        for c in (enter[t + 1] if t + 1 < n else ()):
            if c <= t and not (once[c] and c < t):
                marked.add(c)
        heap = [-j for j in marked]
        heapq.heapify(heap)
        while heap:  # inputs of what is computed, latest first (inputs come earlier)
            j = -heapq.heappop(heap)
            for i in deps[j]:
                if i not in marked and not held_now(i):
                    marked.add(i)
                    heapq.heappush(heap, -i)
        rows.append(sorted(marked))
    return Rows(n, rows)


def schedule_from_rs(st: Staged, R, S, meta: dict | None = None) -> Schedule:
    """Algorithm 1: a row-major scan of ``R`` with frees where nothing later needs a value.

    Within stage ``t`` a value is freed right after its last use by a node computed in the
    stage, or after it is computed if nothing in the stage reads it, unless it is
    checkpointed for stage ``t + 1`` or kept to the end. A checkpoint that stage ``t``
    neither reads nor keeps is freed at the start of the stage. A node already resident is
    not computed again. ``R`` and ``S`` in either form (``R`` None: each stage computes its
    own node only).
    """
    n = st.n
    rows = _rows(st, R)
    eff = effective_spans(st, rows, S)
    enter, leave = eff.events()
    names = st.names
    deps = st.deps
    kept = st.kept.tolist()
    nxt = [False] * n  # the effective checkpoints of stage t + 1
    resident = [False] * n
    loose: set[int] = set()  # resident, neither checkpointed for the next stage nor kept
    stmts: list[Statement] = []

    def free(i: int) -> None:
        stmts.append(Statement("free", names[i]))
        resident[i] = False
        loose.discard(i)

    for t in range(n):
        for c in leave[t + 1]:
            nxt[c] = False
            if resident[c] and not kept[c]:
                loose.add(c)
        for c in (enter[t + 1] if t + 1 < n else ()):
            nxt[c] = True
            loose.discard(c)
        row = rows.rows[t]
        comp = [k for k in row if k <= t]
        last_use: dict[int, int] = {}
        for k in comp:
            for i in deps[k]:
                last_use[i] = k
        # resident values that this stage neither reads nor keeps go first
        if loose:
            in_row = set(row)
            for i in sorted(loose):
                if i not in last_use and i not in in_row:
                    free(i)
        for k in comp:
            if not resident[k]:
                stmts.append(Statement("compute", names[k]))
                resident[k] = True
                if not (nxt[k] or kept[k]):
                    loose.add(k)
            for i in deps[k] + [k]:
                # free after the last reader in this stage (a new value nobody reads: at once)
                if resident[i] and not (nxt[i] or kept[i]) and last_use.get(i, -1) <= k:
                    free(i)
    return Schedule(st.graph, stmts, dict(meta or {}))


def cost_of(st: Staged, R, costs: list[float]) -> float:
    """Checkmate's objective: the additive cost of every computation in ``R`` (either form)."""
    c = np.array([costs[gi] for gi in st.order], dtype=float)
    if isinstance(R, Rows):
        return float(sum(c[r].sum() for r in R.rows if r))
    return float((np.asarray(R, dtype=bool) * c[None, :]).sum())
