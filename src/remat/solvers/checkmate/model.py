"""Checkmate's MILP (seeds/001 Section 4.7, problem 9) over the staged problem, built in bulk.

The model is assembled as numpy arrays (column bounds, costs, integrality and a CSR row
matrix) and handed to HiGHS in one call each, which keeps construction to a second or two
even for ResNet50 (353 stages, ~125k R/S binaries). The same builder serves the MILP
(:func:`remat.solvers.checkmate.checkmate`), its LP relaxation
(:func:`remat.solvers.checkmate.lp_rounding.checkmate_lp`) and the peak-minimizing variant used to find
the smallest feasible budget (:func:`remat.solvers.checkmate.min_budget`).

Variables (stage numbers and node numbers as in :mod:`remat.plans.stages`):

- ``R[t, i]``, ``i <= t``: binary, node ``i`` is computed in stage ``t``; ``R[t, t] = 1`` (8a),
  nothing above the diagonal exists (8c);
- ``S[t, i]``, ``i < t``: binary, value ``i`` is resident at the start of stage ``t`` (8b);
- ``FREE[t, i, k]`` for an edge ``i -> k`` with ``k < t`` and ``i`` not kept: binary, ``i``
  is freed in stage ``t`` right after ``k`` is computed (eq. 5 through 7a-7c). The
  Section 4.8 simplification drops ``FREE[t, k, k]``; ``FREE[t, i, t]`` is dropped too, since
  a free after the last node of a stage changes no constrained ``U``;
- ``U[t, k]``, ``k <= t``: continuous, memory in use right after computing ``k`` in stage
  ``t``, less the constant overhead (inputs and parameters, which the simulator counts the
  same way), so ``0 <= U <= budget - constant``.

Constraints: (1b) ``R[t, j] <= R[t, i] + S[t, i]`` for every edge ``i -> j``, ``j <= t``;
(1c) ``S[t, i] <= R[t-1, i] + S[t-1, i]``; the recurrence (2)-(3) with node 0 first::

    U[t, 0] = sum_i M_i S[t, i] + M_0 R[t, 0]
    U[t, k] = U[t, k-1] - sum_{i in DEPS[k-1], i not kept} M_i FREE[t, i, k-1] + M_k R[t, k]

and 7b/7c with ``num_hazards(t, i, k) = (1 - R[t, k]) + S[t+1, i] + sum_{j in USERS[i],
k < j <= t} R[t, j]`` (no ``S[t+1, i]`` term in the last stage, after which nothing is
checkpointed) and ``kappa`` its largest value: ``free_form="paper"``, the paper's 7a-7c.

``free_form="tight"`` (the default) replaces the aggregated 7c by one constraint per hazard
(``FREE <= R[t, k]``, ``FREE <= 1 - S[t+1, i]``, ``FREE <= 1 - R[t, j]``) and drops 7b. For
binaries the hazard rows say exactly what 7c says (FREE = 1 only without hazards), and their
LP relaxation is tighter. 7b (``FREE = 1`` when there is no hazard) only ever lowers ``U``:
raising a FREE to its upper limit keeps a solution feasible, so dropping 7b removes no (R, S)
schedule and leaves the optimum unchanged (Algorithm 1's emission frees eagerly anyway).
Measured on this 2-core machine: the LP relaxation of MobileNet solves 4x faster, and the
MILP proves optimality 5.6x faster on VGG19 at its smallest budget, 1.4-1.7x on U-Net and FCN.

Views: ``M`` of a view is 0 (:func:`remat.cost.model.effective_bytes`); a tuple's is the sum
of its items' (the op allocates them when it runs), which counts an item twice while both are
resident (a bound above, so the MILP's plans fit when the simulator judges them); the
simulator holds a storage while any value living in it is resident, so the model keeps the
base "resident" while a view is: ``S[t, view] <= S[t, base]``, and the base's FREE counts its
views' checkpoints and users as hazards too, so the per-value sum matches the simulator's
per-storage memory (the exhaustive tests include graphs with views).

Values computed only once (random ops, whose recomputation would draw fresh randomness, and
``must_save`` values: ``Staged.once``) have ``R[t, i] = 0`` for ``t > i``; the dependency rows
then force ``S`` to hold them through every stage that computes a reader, as the simulator
requires.

Values kept to the end (outputs, gradients: ``Staged.kept``) are never freed: ``S[t, i] = 1``
for every ``t > i`` and they have no FREE variables. Fixings implied by optimality (like
Section 4.8, they remove only solutions that a cheaper or equal one dominates):
``R[t, i] = 0`` for a kept ``i < t`` (it is resident already), and ``R[t, i] = S[t, i] = 0``
when no descendant of ``i`` (``i`` included) is numbered ``t`` or later, so nothing that stage
``t`` or a later stage computes can need it.

Scaling: bytes are divided by ``mem_scale`` (a hundredth of the largest value) and costs by
``cost_scale`` (the largest positive cost), so coefficients stay within about 1e-6..1e2.
Feasibility is never decided here: the caller emits the schedule and the simulator judges it
in exact bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import highspy
import numpy as np

from ...cost.model import CostModel, constant_bytes, default_cost_model, effective_bytes, storage
from ...plans.simulator.tuples import items_of
from ...graph.graph import Graph
from ...plans.stages import Staged, staged

FREE_FORMS = ("paper", "tight")
OBJECTIVES = ("cost", "peak")


@dataclass
class CheckmateModel:
    """A built model: column data, CSR rows, and the maps back to R and S."""

    st: Staged
    n: int
    budget: float | None  # bytes (the whole budget, constant overhead included)
    constant: int  # bytes of inputs and parameters (resident throughout)
    M: np.ndarray  # effective bytes of each stage node (int64)
    C: np.ndarray  # additive cost of each stage node (float)
    W: np.ndarray  # transient workspace bytes of each stage node while it runs (int64)
    mem_scale: float
    cost_scale: float
    objective: str
    r_idx: np.ndarray  # n x n column of R[t, i] (-1 where absent)
    s_idx: np.ndarray  # n x n column of S[t, i] (-1 where absent)
    u_idx: np.ndarray  # n x n column of U[t, k] (-1 where absent)
    free_cols: np.ndarray  # (m, 3): t, i, k of each FREE column, in column order
    free_start: int
    u_start: int
    peak_col: int  # column of the peak variable (objective "peak"), else -1
    work_rows: np.ndarray  # rows U[t, k] + W_k R[t, k] <= limit (objective "cost")
    col_cost: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integer: np.ndarray  # bool per column
    row_lower: np.ndarray
    row_upper: np.ndarray
    row_start: np.ndarray  # CSR
    row_index: np.ndarray
    row_value: np.ndarray
    stats: dict = field(default_factory=dict)

    @property
    def num_col(self) -> int:
        return len(self.col_cost)

    @property
    def num_row(self) -> int:
        return len(self.row_lower)

    def mem_limit(self, budget: float) -> float:
        """The scaled upper bound of U for a budget in bytes."""
        return (float(budget) - self.constant) / self.mem_scale

    def set_budget_bounds(self, h, budget: float) -> None:
        """Change the U upper bounds of a model already passed to Highs ``h``."""
        cols = np.arange(self.u_start, self.u_start + self._num_u, dtype=np.int32)
        ub = np.full(len(cols), self.mem_limit(budget))
        h.changeColsBounds(len(cols), cols, np.zeros(len(cols)), ub)
        limit = self.mem_limit(budget)
        for r in self.work_rows.tolist():  # highspy 1.12 changes row bounds one at a time
            h.changeRowBounds(int(r), -np.inf, limit)

    @property
    def _num_u(self) -> int:
        return int((self.u_idx >= 0).sum())

    def split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Dense ``R`` and ``S`` (float ``n x n``) from a column vector."""
        x = np.asarray(x, dtype=float)
        R = np.zeros((self.n, self.n))
        S = np.zeros((self.n, self.n))
        m = self.r_idx >= 0
        R[m] = x[self.r_idx[m]]
        m = self.s_idx >= 0
        S[m] = x[self.s_idx[m]]
        return R, S

    def solution_from(self, R: np.ndarray, S: np.ndarray) -> np.ndarray:
        """The column vector of a schedule ``(R, S)``: FREE by eq. (5), U by (2)-(3).

        ``S`` should respect the model's fixings (kept values held, useless checkpoints
        dropped); :meth:`normalize_s` does that. The vector satisfies every row when ``R`` is
        correct for ``S`` and the schedule fits (the peak column, if any, is set to max U)."""
        n = self.n
        R = np.asarray(R, dtype=bool)
        S = np.tril(np.asarray(S, dtype=bool), -1)
        x = np.zeros(self.num_col)
        m = self.r_idx >= 0
        x[self.r_idx[m]] = R[m]
        m = self.s_idx >= 0
        x[self.s_idx[m]] = S[m]
        ft, fi, fk = self.free_cols.T if len(self.free_cols) else (np.zeros(0, int),) * 3
        free = R[ft, fk].copy()
        users, nexts = free_hazards(self.st)
        for c in np.flatnonzero(free):
            t, i, k = int(ft[c]), int(fi[c]), int(fk[c])
            if (t + 1 < n and any(S[t + 1, x] for x in nexts[i] if x <= t)) or \
                    any(k < j <= t and R[t, j] for j in users[i]):
                free[c] = False
        x[self.free_start:self.free_start + len(free)] = free
        Ms = self.M / self.mem_scale
        freed = np.zeros((n, n))  # memory freed in stage t after computing k
        np.add.at(freed, (ft[free], fk[free]), Ms[fi[free]])
        U = np.zeros((n, n))
        for t in range(n):
            u = float((Ms[:t] * S[t, :t]).sum())
            for k in range(t + 1):
                if k:
                    u -= freed[t, k - 1]
                u += Ms[k] * R[t, k]
                U[t, k] = u
        m = self.u_idx >= 0
        x[self.u_idx[m]] = U[m]
        if self.peak_col >= 0:
            peak = (self.peak_bytes(x) - self.constant) / self.mem_scale
            x[self.peak_col] = max(peak, self.col_lower[self.peak_col])
        return x

    def peak_bytes(self, x: np.ndarray) -> float:
        """The peak memory the model accounts to column vector ``x`` in bytes (constant
        overhead included): the largest ``U[t, k]``, plus ``k``'s workspace where it runs."""
        m = self.u_idx >= 0
        U = np.zeros((self.n, self.n))
        U[m] = x[self.u_idx[m]]
        R = np.zeros((self.n, self.n))
        mr = self.r_idx >= 0
        R[mr] = x[self.r_idx[mr]]
        during = U + R * (self.W / self.mem_scale)[None, :]
        return float(during[m].max(initial=0.0)) * self.mem_scale + self.constant

    def normalize_s(self, S: np.ndarray) -> np.ndarray:
        """``S`` with the model's fixings applied (kept values held, useless entries dropped)."""
        S = np.tril(np.asarray(S, dtype=bool), -1).copy()
        for i, al in enumerate(stage_aliases(self.st)):
            for a in sorted(al, reverse=True):
                S[:, i] |= S[:, a]  # holding a view holds its base's storage
        m = self.s_idx >= 0
        lo = np.zeros((self.n, self.n), dtype=bool)
        hi = np.zeros((self.n, self.n), dtype=bool)
        lo[m] = self.col_lower[self.s_idx[m]] > 0.5
        hi[m] = self.col_upper[self.s_idx[m]] > 0.5
        return (S | lo) & hi

    def violation(self, x: np.ndarray) -> float:
        """Largest violation of a row or column bound by ``x`` (0 when feasible)."""
        act = np.add.reduceat(self.row_value * x[self.row_index], self.row_start[:-1]) \
            if len(self.row_value) else np.zeros(self.num_row)
        empty = self.row_start[:-1] == self.row_start[1:]
        act[empty] = 0.0
        v = max(float(np.max(self.row_lower - act, initial=0.0)),
                float(np.max(act - self.row_upper, initial=0.0)),
                float(np.max(self.col_lower - x, initial=0.0)),
                float(np.max(x - self.col_upper, initial=0.0)))
        return v

    def objective_bytes_or_cost(self, value: float) -> float:
        """A model objective value in the caller's units (cost, or peak bytes)."""
        if self.objective == "cost":
            return value * self.cost_scale
        return value * self.mem_scale + self.constant

    def to_highs(self, h, *, relax: bool = False) -> None:
        """Pass the model to ``h`` (a ``highspy.Highs``) in bulk."""
        nc = self.num_col
        h.addCols(nc, self.col_cost, self.col_lower, self.col_upper, 0,
                  np.zeros(nc, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
        if not relax:
            cols = np.flatnonzero(self.integer).astype(np.int32)
            kind = int(highspy.HighsVarType.kInteger)
            h.changeColsIntegrality(len(cols), cols, np.full(len(cols), kind, dtype=np.uint8))
        h.addRows(self.num_row, self.row_lower, self.row_upper, len(self.row_value),
                  self.row_start[:-1].astype(np.int32), self.row_index.astype(np.int32),
                  self.row_value)


def stage_arrays(g: Graph, cost_model: CostModel | None = None
                 ) -> tuple[Staged, np.ndarray, np.ndarray]:
    """The staged problem with ``M`` (effective bytes) and ``C`` (op costs) per stage node."""
    st = staged(g)
    cm = cost_model or default_cost_model()
    eb = list(effective_bytes(g))
    # a tuple (a library call's outputs) allocates its items when it runs and holds them
    # while it is resident (the simulator's rule): it counts their bytes too, which counts
    # an item twice while both are resident (a bound above, never below: the MILP's plans
    # then fit when the simulator judges them)
    items = [sum(int(eb[j]) for j in its) for its in items_of(g)]  # the simulator's tuples
    costs = cm.op_costs(g)
    M = np.array([int(eb[gi]) + items[gi] for gi in st.order], dtype=np.int64)
    C = np.array([float(costs[gi]) for gi in st.order], dtype=float)
    return st, M, C


def stage_workspace(g: Graph, cost_model: CostModel | None = None) -> np.ndarray:
    """Transient bytes each stage node holds while it runs (the cost model's workspace: a
    CPU convolution's buffers), which the simulator adds to the memory in use at that
    moment."""
    st = staged(g)
    work = (cost_model or default_cost_model()).workspace(g)
    return np.array([int(work[gi]) for gi in st.order], dtype=np.int64)


def stage_aliases(st: Staged) -> list[list[int]]:
    """For each stage node, the stage nodes that live in its storage (its views, and views of
    those); empty for most. Views of a primal live in storage counted as constant overhead."""
    owner, _ = storage(st.graph)
    out: list[list[int]] = [[] for _ in range(st.n)]
    for a, gi in enumerate(st.order):
        o = owner[gi]
        if o != gi and o in st.pos:
            out[st.pos[o]].append(a)
    return out


def free_hazards(st: Staged) -> tuple[list[np.ndarray], list[list[int]]]:
    """Per stage node ``i``: the sorted nodes whose computation later in a stage keeps ``i``
    resident (its users, and its aliases' users: a shared storage stays while any alias is
    read), and the nodes whose checkpoint for the next stage keeps it (``i`` and its aliases)."""
    aliases = stage_aliases(st)
    users, nexts = [], []
    for i in range(st.n):
        us = set(st.users[i])
        for a in aliases[i]:
            us.update(st.users[a])
        users.append(np.array(sorted(us), dtype=np.int64))
        nexts.append([i, *aliases[i]])
    return users, nexts


MAX_COLUMNS = 1_500_000
"""Models estimated larger than this are not built (:func:`too_large`): ResNet50's 286k
columns take 0.3 s and a few hundred MB; the 1000-node random layered graph's 4.1M took 6 GB
to build, and its LP does not solve in any useful time on this class of machine."""


def estimated_columns(st: Staged) -> int:
    """The number of columns :func:`build_model` would create for ``st`` (before fixings):
    R and U (``n(n+1)/2`` each), S (``n(n-1)/2``) and one FREE per non-kept edge and later
    stage. Cheap: no model is built."""
    n = st.n
    kept = np.asarray(st.kept, dtype=bool)
    free = sum(n - 1 - k for k in range(n) for i in st.deps[k] if not kept[i])
    return n * (n + 1) + n * (n - 1) // 2 + int(free)


def too_large(st: Staged, max_columns: int | None) -> str | None:
    """Why the model of ``st`` is not built (over ``max_columns``, default
    :data:`MAX_COLUMNS`), or None."""
    limit = MAX_COLUMNS if max_columns is None else max_columns
    cols = estimated_columns(st)
    if cols <= limit:
        return None
    return (f"the MILP of this graph would have {cols:,} columns ({st.n} stages), over the limit "
            f"of {limit:,} (max_columns=): building and solving it would take many GB and far "
            "longer than any time limit; use a baseline solver (chen-greedy, griewank) or "
            "solver='auto', which runs them")


def last_descendant(st: Staged) -> np.ndarray:
    """For each stage node, the largest stage number among its descendants (itself included)."""
    last = np.arange(st.n)
    for i in range(st.n - 1, -1, -1):
        for j in st.users[i]:
            if last[j] > last[i]:
                last[i] = last[j]
    return last


class _Rows:
    """Accumulates rows as COO blocks; ``csr()`` sorts them into CSR once."""

    def __init__(self) -> None:
        self.n = 0
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.lo: list[np.ndarray] = []
        self.hi: list[np.ndarray] = []

    def block(self, count: int, lo, hi) -> np.ndarray:
        """Reserve ``count`` rows with bounds; returns their row numbers."""
        rows = np.arange(self.n, self.n + count, dtype=np.int64)
        self.n += count
        self.lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (count,)).copy())
        self.hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (count,)).copy())
        return rows

    def add(self, rows, cols, vals) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(vals, dtype=float), rows.shape)
        if (cols < 0).any():
            raise AssertionError("internal error: a constraint names a missing variable")
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(vals.astype(float))

    def csr(self):
        r = np.concatenate(self.r) if self.r else np.zeros(0, np.int64)
        c = np.concatenate(self.c) if self.c else np.zeros(0, np.int64)
        v = np.concatenate(self.v) if self.v else np.zeros(0)
        order = np.lexsort((c, r))
        r, c, v = r[order], c[order], v[order]
        start = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(r, minlength=self.n), out=start[1:])
        lo = np.concatenate(self.lo) if self.lo else np.zeros(0)
        hi = np.concatenate(self.hi) if self.hi else np.zeros(0)
        return lo, hi, start, c, v


def build_model(g: Graph, budget: float | None, cost_model: CostModel | None = None, *,
                objective: str = "cost", free_form: str = "tight") -> CheckmateModel:
    """Problem 9 for ``g`` at ``budget`` bytes (``objective="cost"``), or the same constraints
    minimizing the peak with no budget (``objective="peak"``, ``budget`` may be None)."""
    if free_form not in FREE_FORMS:
        raise ValueError(f"unknown free_form {free_form!r}; use one of {FREE_FORMS}")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; use one of {OBJECTIVES}")
    st, M, C = stage_arrays(g, cost_model)
    W = stage_workspace(g, cost_model)
    n = st.n
    const = constant_bytes(g)
    kept = np.asarray(st.kept, dtype=bool)
    mem_scale = max(float(M.max()) if n else 1.0, 1.0) / 100.0
    pos_c = C[C > 0]
    cost_scale = float(pos_c.max()) if len(pos_c) else 1.0
    Ms = M / mem_scale
    last = last_descendant(st)
    hz_users, hz_next = free_hazards(st)
    aliases = stage_aliases(st)
    # a storage is needed while any of its aliases is: hold bounds cover the aliases too
    hold = np.where(kept, n - 1, last)
    kept_alias = np.zeros(n, dtype=bool)
    for i in range(n):
        for a in aliases[i]:
            hold[i] = max(hold[i], hold[a])
            kept_alias[i] |= bool(kept[a])

    # ---- columns -------------------------------------------------------------------------
    ncol = 0
    lows, ups, costs, ints = [], [], [], []

    def cols(count: int, lo, hi, cost, integer: bool) -> np.ndarray:
        nonlocal ncol
        idx = np.arange(ncol, ncol + count, dtype=np.int64)
        ncol += count
        lows.append(np.broadcast_to(np.asarray(lo, float), (count,)).copy())
        ups.append(np.broadcast_to(np.asarray(hi, float), (count,)).copy())
        costs.append(np.broadcast_to(np.asarray(cost, float), (count,)).copy())
        ints.append(np.full(count, integer))
        return idx

    rt, ri = np.tril_indices(n)  # R[t, i], i <= t
    r_lo = (rt == ri).astype(float)  # 8a: R[t, t] = 1
    useless = (rt > ri) & ((last[ri] < rt) | kept[ri])  # resident already, or nothing needs it
    # random ops and must_save values are computed in their own stage only: (1b) and (1c)
    # then hold them while any later stage computes a reader
    once = (rt > ri) & np.asarray(st.once, dtype=bool)[ri]
    r_hi = np.where(useless | once, 0.0, 1.0)
    obj_r = C[ri] / cost_scale if objective == "cost" else 0.0
    r_cols = cols(len(rt), r_lo, r_hi, obj_r, True)
    r_idx = np.full((n, n), -1, dtype=np.int64)
    r_idx[rt, ri] = r_cols

    s_t, s_i = np.tril_indices(n, -1)  # S[t, i], i < t
    s_lo = kept[s_i].astype(float)  # kept values stay resident
    s_hi = np.where(kept[s_i] | (hold[s_i] >= s_t), 1.0, 0.0)
    # a tuple is not a tensor: the forward graph cannot hand it to the backward graph; nor can
    # it hand over a value that may not be saved (must_recompute, can_save=False)
    fw = np.asarray(st.forward_phase, dtype=bool)
    cannot = st.container | (g._arrays.cannot_save[np.asarray(st.order, dtype=np.int64)] & ~kept)
    s_hi[cannot[s_i] & fw[s_i] & ~fw[s_t]] = 0.0
    s_cols = cols(len(s_t), s_lo, s_hi, 0.0, True)
    s_idx = np.full((n, n), -1, dtype=np.int64)
    s_idx[s_t, s_i] = s_cols

    # FREE[t, i, k]: edge i -> k, i not kept, k < t
    e_i = np.array([i for j in range(n) for i in st.deps[j]], dtype=np.int64)
    e_k = np.array([j for j in range(n) for _ in st.deps[j]], dtype=np.int64)
    fe = ~kept[e_i] if len(e_i) else np.zeros(0, bool)
    fe_i, fe_k = e_i[fe], e_k[fe]
    cnt = (n - 1 - fe_k).clip(min=0)  # stages t = k+1 .. n-1
    grp = np.repeat(np.arange(len(fe_i)), cnt)
    f_t = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + fe_k[grp] + 1
    f_i, f_k = fe_i[grp], fe_k[grp]
    # a free that can never happen (i not resident-able in stage t) is fixed to 0, and so is
    # a free in the last stage of a storage that a kept alias holds to the end
    f_hi = np.where((hold[f_i] >= f_t) & ~(kept_alias[f_i] & (f_t == n - 1)), 1.0, 0.0)
    free_start = ncol
    f_cols = cols(len(f_t), 0.0, f_hi, 0.0, True)

    ut, uk = np.tril_indices(n)  # U[t, k], k <= t
    u_start = ncol
    if objective == "cost":
        if budget is None:
            raise ValueError("objective 'cost' needs a budget")
        u_hi = (float(budget) - const) / mem_scale
    else:
        u_hi = np.inf
    u_cols = cols(len(ut), 0.0, u_hi, 0.0, False)
    u_idx = np.full((n, n), -1, dtype=np.int64)
    u_idx[ut, uk] = u_cols
    peak_col = -1
    if objective == "peak":
        peak_col = int(cols(1, 0.0, np.inf, 1.0, False)[0])

    # ---- rows ----------------------------------------------------------------------------
    rows = _Rows()
    # (1b) R[t, j] - R[t, i] - S[t, i] <= 0 for edge i -> j, t >= j
    ecnt = n - e_k
    egrp = np.repeat(np.arange(len(e_i)), ecnt)
    b_t = np.arange(int(ecnt.sum())) - np.repeat(np.cumsum(ecnt) - ecnt, ecnt) + e_k[egrp]
    b_i, b_j = e_i[egrp], e_k[egrp]
    rr = rows.block(len(b_t), -np.inf, 0.0)
    rows.add(rr, r_idx[b_t, b_j], 1.0)
    rows.add(rr, r_idx[b_t, b_i], -1.0)
    rows.add(rr, s_idx[b_t, b_i], -1.0)
    # (1c) S[t, i] - R[t-1, i] - S[t-1, i] <= 0 for i < t-1 (i = t-1 holds: R[t-1, t-1] = 1)
    c_t, c_i = np.tril_indices(n, -2)
    rr = rows.block(len(c_t), -np.inf, 0.0)
    rows.add(rr, s_idx[c_t, c_i], 1.0)
    rows.add(rr, r_idx[c_t - 1, c_i], -1.0)
    rows.add(rr, s_idx[c_t - 1, c_i], -1.0)
    # a view held into a stage holds its base's storage: S[t, a] <= S[t, i] (t > a > i)
    al_i = np.array([i for i in range(n) for a in aliases[i]], dtype=np.int64)
    al_a = np.array([a for i in range(n) for a in aliases[i]], dtype=np.int64)
    if len(al_a):
        acnt = n - 1 - al_a
        agrp = np.repeat(np.arange(len(al_a)), acnt)
        a_t = np.arange(int(acnt.sum())) - np.repeat(np.cumsum(acnt) - acnt, acnt) + al_a[agrp] + 1
        rr = rows.block(len(a_t), -np.inf, 0.0)
        rows.add(rr, s_idx[a_t, al_a[agrp]], 1.0)
        rows.add(rr, s_idx[a_t, al_i[agrp]], -1.0)
    # (2) U[t, 0] - sum_i M_i S[t, i] - M_0 R[t, 0] = 0
    rr0 = rows.block(n, 0.0, 0.0)
    rows.add(rr0, u_idx[np.arange(n), 0], 1.0)
    rows.add(rr0[s_t], s_cols, -Ms[s_i])
    rows.add(rr0, r_idx[np.arange(n), 0], -Ms[0] if n else 0.0)
    # (3) U[t, k] - U[t, k-1] + sum M_i FREE[t, i, k-1] - M_k R[t, k] = 0, 1 <= k <= t
    k_t, k_k = np.tril_indices(n, -1)
    k_k = k_k + 1  # pairs (t, k) with 1 <= k <= t
    rr = rows.block(len(k_t), 0.0, 0.0)
    row_of = np.full((n, n), -1, dtype=np.int64)
    row_of[k_t, k_k] = rr
    rows.add(rr, u_idx[k_t, k_k], 1.0)
    rows.add(rr, u_idx[k_t, k_k - 1], -1.0)
    rows.add(rr, r_idx[k_t, k_k], -Ms[k_k])
    if len(f_t):
        rows.add(row_of[f_t, f_k + 1], f_cols, Ms[f_i])
    if objective == "peak":
        rr = rows.block(len(ut), -np.inf, 0.0)
        rows.add(rr, u_cols, 1.0)
        rows.add(rr, np.full(len(rr), peak_col), -1.0)
    # an op's workspace is held while it runs: U[t, k] + W_k R[t, k] within the limit
    w_t, w_k = ut[W[uk] > 0], uk[W[uk] > 0]
    work_rows = np.zeros(0, dtype=np.int64)
    if len(w_t):
        Ws = W[w_k] / mem_scale
        if objective == "peak":
            rr = rows.block(len(w_t), -np.inf, 0.0)
            rows.add(rr, np.full(len(rr), peak_col), -1.0)
        else:
            rr = work_rows = rows.block(len(w_t), -np.inf, u_hi)
        rows.add(rr, u_idx[w_t, w_k], 1.0)
        rows.add(rr, r_idx[w_t, w_k], Ws)

    # (7b)/(7c): hazards of FREE[t, i, k] =
    #   (1 - R[t,k]) + S[t+1,i] + sum_{j in USERS[i], k<j<=t} R[t,j]
    # where a storage shared by views counts their checkpoints and users too (free_hazards)
    n_f = len(f_t)
    if n_f:
        # for each FREE column, the later users j with k < j <= t
        lo_pos = np.empty(n_f, dtype=np.int64)
        hi_pos = np.empty(n_f, dtype=np.int64)
        order_i = np.argsort(f_i, kind="stable")
        bounds = np.searchsorted(f_i[order_i], np.arange(n + 1))
        for i in range(n):
            sl = order_i[bounds[i]:bounds[i + 1]]
            if not len(sl):
                continue
            us = hz_users[i]
            lo_pos[sl] = np.searchsorted(us, f_k[sl], side="right")
            hi_pos[sl] = np.searchsorted(us, f_t[sl], side="right")
        n_later = hi_pos - lo_pos
        ucat = np.concatenate(hz_users) if n else np.zeros(0, np.int64)
        uoff = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(u) for u in hz_users], out=uoff[1:])
        jg = np.repeat(np.arange(n_f), n_later)
        jpos = np.arange(int(n_later.sum())) - np.repeat(np.cumsum(n_later) - n_later, n_later)
        j_node = ucat[uoff[f_i[jg]] + lo_pos[jg] + jpos]
        j_t = f_t[jg]
        # checkpoint hazards S[t+1, x] for x in {i} + aliases(i) with x <= t < n - 1
        has_next = f_t + 1 < n
        sc = [np.flatnonzero(has_next)]
        sx = [f_i[sc[0]]]
        for i in range(n):
            if aliases[i]:
                ci = order_i[bounds[i]:bounds[i + 1]]
                ci = ci[has_next[ci]]
                for a in aliases[i]:
                    sel = ci[f_t[ci] >= a]
                    sc.append(sel)
                    sx.append(np.full(len(sel), a, dtype=np.int64))
        hc, hx = np.concatenate(sc), np.concatenate(sx)
        s_haz = s_idx[f_t[hc] + 1, hx]
        kappa = 1 + np.bincount(hc, minlength=n_f) + n_later
        if free_form == "paper":
            # 7b: -FREE + R[t,k] - sum S[t+1,x] - sum R[t,j] <= 0
            rr = rows.block(n_f, -np.inf, 0.0)
            rows.add(rr, f_cols, -1.0)
            rows.add(rr, r_idx[f_t, f_k], 1.0)
            rows.add(rr[hc], s_haz, -1.0)
            rows.add(rr[jg], r_idx[j_t, j_node], -1.0)
            # 7c: kappa FREE - R[t,k] + sum S[t+1,x] + sum R[t,j] <= kappa - 1
            rr = rows.block(n_f, -np.inf, (kappa - 1).astype(float))
            rows.add(rr, f_cols, kappa.astype(float))
            rows.add(rr, r_idx[f_t, f_k], -1.0)
            rows.add(rr[hc], s_haz, 1.0)
            rows.add(rr[jg], r_idx[j_t, j_node], 1.0)
        else:
            rr = rows.block(n_f, -np.inf, 0.0)  # FREE <= R[t, k]
            rows.add(rr, f_cols, 1.0)
            rows.add(rr, r_idx[f_t, f_k], -1.0)
            rr = rows.block(len(hc), -np.inf, 1.0)  # FREE + S[t+1, x] <= 1
            rows.add(rr, f_cols[hc], 1.0)
            rows.add(rr, s_haz, 1.0)
            rr = rows.block(len(jg), -np.inf, 1.0)  # FREE + R[t, j] <= 1
            rows.add(rr, f_cols[jg], 1.0)
            rows.add(rr, r_idx[j_t, j_node], 1.0)

    lo, hi, start, idx, val = rows.csr()
    integer = np.concatenate(ints)
    model = CheckmateModel(
        st=st, n=n, budget=budget, constant=const, M=M, C=C, W=W, mem_scale=mem_scale,
        cost_scale=cost_scale, objective=objective, r_idx=r_idx, s_idx=s_idx, u_idx=u_idx,
        free_cols=np.stack([f_t, f_i, f_k], axis=1) if n_f else np.zeros((0, 3), np.int64),
        free_start=free_start, u_start=u_start, peak_col=peak_col, work_rows=work_rows,
        col_cost=np.concatenate(costs), col_lower=np.concatenate(lows),
        col_upper=np.concatenate(ups), integer=integer, row_lower=lo, row_upper=hi,
        row_start=start, row_index=idx, row_value=val,
    )
    model.stats = {
        "stages": n, "edges": len(e_i), "R": len(rt), "S": len(s_t), "FREE": n_f,
        "U": len(ut), "columns": model.num_col, "binaries": int(integer.sum()),
        "rows": model.num_row, "workspace_rows": len(w_t), "nonzeros": len(val),
        "free_form": free_form,
        "fixed_binaries": int(((model.col_lower == model.col_upper) & integer).sum()),
    }
    return model


# ---- running HiGHS --------------------------------------------------------------------------


