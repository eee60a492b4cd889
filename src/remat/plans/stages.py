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
"""

from __future__ import annotations

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


def lifetime_matrix(st: Staged, mask: np.ndarray | None = None) -> np.ndarray:
    """``S`` holding each value (those in ``mask``; all by default) from its own stage
    through its last reader's, and no longer: with every value held, no recomputation."""
    n = st.n
    S = np.zeros((n, n), dtype=bool)
    for i in (range(n) if mask is None else np.flatnonzero(mask).tolist()):
        last = max(st.users[i], default=i)
        S[i + 1:last + 1, i] = True
    return S


def held_matrix(st: Staged, S: np.ndarray) -> np.ndarray:
    """``S`` as a boolean strictly lower triangular matrix, with values kept to the end
    (outputs, gradients) held in every stage after their own."""
    S = np.tril(np.asarray(S, dtype=bool), -1)
    return S | np.tril(np.broadcast_to(st.kept[None, :], S.shape), -1)


def effective_s(st: Staged, R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The checkpoints a schedule really holds: :func:`held_matrix`, plus each value that may
    be computed only once (random ops) held from its stage to the last stage that reads it
    (and dropped after, so it is never re-established)."""
    S = held_matrix(st, S)
    R = np.asarray(R, dtype=bool)
    for i in np.flatnonzero(st.once & ~st.kept).tolist():
        users = st.users[i]
        stages = np.flatnonzero(R[:, users].any(axis=1)) if users else np.zeros(0, dtype=np.int64)
        last = int(stages.max()) if len(stages) else i
        S[i + 1:last + 1, i] = True
        S[last + 1:, i] = False
    return S


def solve_r(st: Staged, S: np.ndarray) -> np.ndarray:
    """The fewest computations that make checkpoint matrix ``S`` correct.

    ``S`` is an ``n x n`` 0/1 matrix; entries on or above the diagonal are ignored (a value
    cannot be resident before its stage). Returns boolean ``R``: stage ``t`` computes node
    ``t``, every checkpoint of stage ``t + 1`` that stage ``t`` does not hold (1c), and,
    against the topological order, every input of a computed node that is not held (1b).
    """
    n = st.n
    S = held_matrix(st, S)
    R = np.zeros((n, n), dtype=bool)
    deps = st.deps
    once = st.once
    for t in range(n):
        row = R[t]
        row[t] = True
        # a value computed only once stays held while anything reads it (effective_s)
        held = S[t] | (once & (np.arange(n) < t))
        if t + 1 < n:
            row[: t + 1] |= S[t + 1, : t + 1] & ~held[: t + 1]
        for j in range(t, -1, -1):
            if row[j]:
                for i in deps[j]:
                    if not held[i]:
                        row[i] = True
    return R


def schedule_from_rs(st: Staged, R: np.ndarray, S: np.ndarray, meta: dict | None = None) -> Schedule:
    """Algorithm 1: a row-major scan of ``R`` with frees where nothing later needs a value.

    Within stage ``t`` a value is freed right after its last use by a node computed in the
    stage, or after it is computed if nothing in the stage reads it, unless it is
    checkpointed for stage ``t + 1`` or kept to the end. A checkpoint that stage ``t``
    neither reads nor keeps is freed at the start of the stage. A node already resident is
    not computed again.
    """
    n = st.n
    R = np.asarray(R, dtype=bool)
    S = effective_s(st, R, S)
    names = st.names
    stmts: list[Statement] = []
    resident = np.zeros(n, dtype=bool)
    for t in range(n):
        nxt = S[t + 1] if t + 1 < n else np.zeros(n, dtype=bool)
        keep = nxt | st.kept
        comp = np.flatnonzero(R[t, : t + 1]).tolist()
        last_use: dict[int, int] = {}
        for k in comp:
            for i in st.deps[k]:
                last_use[i] = k
        # resident values that this stage neither reads nor keeps go first
        for i in np.flatnonzero(resident & ~keep).tolist():
            if i not in last_use and not R[t, i]:
                stmts.append(Statement("free", names[i]))
                resident[i] = False
        for k in comp:
            if not resident[k]:
                stmts.append(Statement("compute", names[k]))
                resident[k] = True
            for i in st.deps[k] + [k]:
                # free after the last reader in this stage (a new value nobody reads: at once)
                if resident[i] and not keep[i] and last_use.get(i, -1) <= k:
                    stmts.append(Statement("free", names[i]))
                    resident[i] = False
    return Schedule(st.graph, stmts, dict(meta or {}))


def cost_of(st: Staged, R: np.ndarray, costs: list[float]) -> float:
    """Checkmate's objective: the additive cost of every computation in ``R``."""
    c = np.array([costs[gi] for gi in st.order], dtype=float)
    return float((np.asarray(R, dtype=bool) * c[None, :]).sum())
