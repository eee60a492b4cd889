"""Checkmate's baselines (seeds/001 Table 1, Section 6.1, Appendix B) as budgeted solvers.

Every baseline picks a *static checkpoint policy* ``S`` over the stages of
:mod:`remat.plans.stages`, completes it with the fewest recomputations
(:func:`~remat.plans.stages.solve_r`), emits the schedule
(:func:`~remat.plans.stages.schedule_from_rs`) and lets the simulator judge it
(:func:`~remat.plans.plan.judged`), as the paper does ("we implement baselines as a static
policy for S and then solve for the lowest-cost recomputation schedule").

Solvers (``BASELINES``), each ``fn(g, budget=None, **options) -> Plan``; with
``budget=None`` the schedule is judged against an infinite budget and its peak reported:

- ``checkpoint-all``: every forward value is kept from its computation to its last use: no
  recomputation. Its peak is the "no-recompute" reference.
- ``chen-sqrtn`` (Chen et al. 2016): on the candidate chain ``C`` (below), ``k = floor(sqrt|C|)``
  and every ``k``-th candidate (the ``(i+1) % k == 0`` ones, as in Checkmate's artifact) is a
  checkpoint.
- ``chen-greedy`` (Chen et al. 2016, greedy with segment budget ``b``): walk the forward nodes in
  topological order adding their bytes to a running total; a *candidate* whose total exceeds
  ``b`` becomes a checkpoint and resets the total. ``b`` is searched over a fixed grid (the
  artifact's ``M * (1 + [-1, 2) step 0.01)`` with ``M`` the activation peak of
  linearized sqrt(n), plus a geometric grid up to the forward bytes); the cheapest simulated
  schedule within the budget is returned (option ``b=`` runs one value).
- ``griewank`` (Griewank & Walther 2000, REVOLVE / binomial checkpointing): on the candidate
  chain, the optimal REVOLVE schedule for ``s`` snapshot slots
  (:mod:`remat.solvers.baselines.revolve`) is written as a checkpoint matrix whose snapshot set
  changes over the backward (multi-level recomputation: the first sweep and every later
  advance take snapshots, which are released when their part of the chain is reversed).
  ``s`` is searched over ``0..l-1`` (option ``slots=`` runs one value). This is full REVOLVE,
  not a simplification. Checkmate's artifact mapped precomputed REVOLVE solutions
  (snapshot intervals on the chain of articulation points) into ``S`` and solved for the
  optimal ``R`` the same way; it ran Griewank only on linear models and later disabled it for
  non-linear graphs. The paper defines no non-linear generalization, so only ``griewank`` is
  registered (its ``candidates=`` option still selects the chain).

Candidate chains (Appendix B): ``-ap`` variants use the articulation points (cut vertices,
found by Tarjan's O(V+E) search) of the undirected forward graph (non-primal forward nodes, plus a virtual source tied to the nodes reading
``input`` primals and a virtual sink tied to the forward outputs, as the artifact adds ``-1``
and ``-2``: on a chain every node is one); ``-linearized`` variants use every forward node in
topological order (the graph treated as a chain). Plain ``chen-sqrtn``/``chen-greedy``/
``griewank`` use articulation points when the graph has any, else the linearized chain.
Values that cannot be saved (``must_recompute``, ``can_save=False``) are never candidates.

The policy ``S`` (stages are numbered as :class:`~remat.plans.stages.Staged`):

- backward values and tangents live from their stage to their last user (computed once);
  values kept to the end (outputs, gradients) are held to the end; ``must_save`` values and
  random ops are never recomputed: held until the last use of any forward value derived
  from them (a later recomputation of a descendant could otherwise reach them);
- a checkpoint ``c`` is held from its stage to its last user (REVOLVE: only while it is a
  snapshot); every other forward value lives until its last *forward* user and is
  recomputed in the backward from the nearest held values by ``solve_r``;
- segments: the chosen checkpoints (REVOLVE: the candidates) split the forward nodes into
  steps, step ``j`` being the nodes after checkpoint ``j-1`` up to checkpoint ``j``. Each
  backward stage is assigned the step it reverses: the lowest step whose values it reads (a
  read of checkpoint ``j`` counts as step ``j+1``, whose input it is), as a running minimum
  over the backward. A value computed or recomputed while its own step is reversed stays
  until its last use within that reversal, so a segment is recomputed once per reversal,
  not once per backward stage; so does the checkpoint a reversal starts from, held or
  recomputed (the step before reads it as its output, which REVOLVE would recompute when it
  re-tapes that step). These are Checkmate's "checkpoint ladders"
  (``gen_s_matrix_fixed_checkpoints`` holds a segment over its mirrored backward stages);
  here backward stages are matched to steps by what they read, not by node mirroring. The
  first reversal uses the last step's values still resident from the forward pass.

On a forward-only graph (no backward stage) every policy gives the same schedule, so the
searches evaluate one point.

Deviations: the grid of ``b`` adds a geometric range to the artifact's so the whole curve is
covered; segment ladders end at each value's last use instead of the segment's last mirrored
stage; on non-linear graphs the step assignment is a heuristic (the
paper leaves it to the optimal ``R``, which ``solve_r`` still provides for the chosen ``S``).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import AbstractSet, Mapping, Sequence

import numpy as np

from ...cost.model import CostModel, effective_bytes
from ...graph.graph import Graph
from ...plans.schedule import Schedule
from ...plans.simulator import SimResult, simulate
from ...plans.plan import Plan, judged
from ...plans.stages import Staged, schedule_from_rs, solve_r, staged

CANDIDATE_MODES = ("auto", "ap", "linearized")


# -- per-graph facts ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ctx:
    st: Staged
    n: int
    fwd: np.ndarray  # bool per stage: a forward value staged before the backward starts
    saveable: np.ndarray  # forward and allowed to be saved (candidate for a checkpoint)
    pinned: np.ndarray  # never recomputed whatever the policy (must_save, random ops)
    pinned_end: np.ndarray  # pinned: held through the last use of every forward descendant
    last_use: np.ndarray  # stage of the last user (own stage when unused)
    last_fwd_use: np.ndarray  # stage of the last forward user (own stage when none)
    nbytes: np.ndarray  # bytes each value adds (views and tuples 0)
    fwd_order: list[int]  # forward stages in topological order
    has_backward: bool


def _context(g: Graph) -> _Ctx:
    return g._derived("baselines_ctx", _build_context)


def _build_context(g: Graph) -> _Ctx:
    st = staged(g)
    a = g._arrays
    order = np.array(st.order, dtype=np.int64)
    n = st.n
    fwd = st.forward_phase
    # a tuple is not a tensor: the forward cannot hand it to the backward
    cannot = (a.cannot_save[order] | st.container) if n else np.zeros(0, dtype=bool)
    random_op = (np.array([g.nodes[i].category == "random" for i in st.order], dtype=bool)
                 if n else np.zeros(0, dtype=bool))
    pinned = fwd & (a.must_save[order] | random_op) if n else np.zeros(0, dtype=bool)
    # a pinned tuple (a random op with several outputs) cannot reach the backward: its items
    # are pinned instead, and the tuple lives until they are taken
    for i in np.flatnonzero(pinned & st.container).tolist():
        pinned[i] = False
        for u in st.users[i]:
            pinned[u] = bool(fwd[u])
    last_use = np.arange(n, dtype=np.int64)
    last_fwd = np.arange(n, dtype=np.int64)
    for i, us in enumerate(st.users):
        if us:
            last_use[i] = max(us)
            f = [u for u in us if fwd[u]]
            if f:
                last_fwd[i] = max(f)
    # a pinned value must outlive every recomputation that could read it: any recomputed
    # value's chain of readers ends at a forward descendant within that descendant's last use
    hold = last_use.copy()
    for i in range(n - 1, -1, -1):
        if fwd[i]:
            for u in st.users[i]:
                if fwd[u] and hold[u] > hold[i]:
                    hold[i] = hold[u]
    pinned_end = np.where(pinned, hold, last_use)
    eff = effective_bytes(g)
    nbytes = np.array([eff[i] for i in st.order], dtype=np.int64)
    fwd_order = np.flatnonzero(fwd).tolist()
    return _Ctx(st, n, fwd, fwd & ~cannot, pinned, pinned_end, last_use, last_fwd, nbytes,
                fwd_order, bool((~fwd).any()))


# -- candidate chains -----------------------------------------------------------------------
def articulation_candidates(g: Graph) -> list[int]:
    """Stage numbers of the articulation points of the undirected forward graph (Appendix
    B.1), in topological order, excluding values that cannot be saved."""
    return list(g._derived("baselines_ap", _articulation_points))


def _articulation_points(g: Graph) -> tuple[int, ...]:
    ctx = _context(g)
    st = ctx.st
    a = g._arrays
    # vertices: forward stages, then the virtual input (n) and output (n + 1), as the
    # artifact's -1 and -2
    src, snk = ctx.n, ctx.n + 1
    adj: dict[int, set[int]] = {t: set() for t in ctx.fwd_order}
    adj[src], adj[snk] = set(), set()

    def edge(u: int, v: int) -> None:
        adj[u].add(v)
        adj[v].add(u)

    input_role = [n.role == "input" for n in g.nodes]
    reads_input, roots = [], []
    for t in ctx.fwd_order:
        fdeps = [d for d in st.deps[t] if ctx.fwd[d]]
        for d in fdeps:
            edge(d, t)
        if any(input_role[j] for j in g.input_indices[st.order[t]]):
            reads_input.append(t)
        if not fdeps:
            roots.append(t)
    sinks = [t for t in ctx.fwd_order if bool(a.is_output[st.order[t]])]
    if not sinks:
        sinks = [t for t in ctx.fwd_order if not any(ctx.fwd[u] for u in st.users[t])]
    for t in reads_input or roots:
        edge(src, t)
    for t in sinks:
        edge(snk, t)
    aps = articulation_points(adj)
    return tuple(t for t in ctx.fwd_order if t in aps and ctx.saveable[t])


def articulation_points(adj: Mapping[int, AbstractSet[int]]) -> set[int]:
    """Cut vertices of an undirected graph given as adjacency sets (Tarjan's low-link,
    iterative, O(V + E)); every connected component is searched."""
    disc: dict[int, int] = {}
    low: dict[int, int] = {}
    out: set[int] = set()
    clock = 0
    for root in adj:
        if root in disc:
            continue
        disc[root] = low[root] = clock
        clock += 1
        root_children = 0
        stack = [(root, -1, iter(adj[root]))]
        while stack:
            v, parent, it = stack[-1]
            for w in it:
                if w == parent:
                    continue
                if w in disc:
                    if disc[w] < low[v]:
                        low[v] = disc[w]
                else:
                    disc[w] = low[w] = clock
                    clock += 1
                    stack.append((w, v, iter(adj[w])))
                    break
            else:
                stack.pop()
                if parent == -1:
                    continue
                if low[v] < low[parent]:
                    low[parent] = low[v]
                if parent == root:
                    root_children += 1
                elif low[v] >= disc[parent]:
                    out.add(parent)
        if root_children > 1:
            out.add(root)
    return out


def linearized_candidates(g: Graph) -> list[int]:
    """Every forward node that may be saved, in topological order (Appendix B.2)."""
    ctx = _context(g)
    return [t for t in ctx.fwd_order if ctx.saveable[t]]


def candidate_chain(g: Graph, mode: str = "auto") -> tuple[str, list[int]]:
    """``(mode used, stage numbers)``: ``auto`` is ``ap`` when the graph has articulation
    points, else ``linearized``."""
    if mode not in CANDIDATE_MODES:
        raise ValueError(f"unknown candidates mode {mode!r}; use one of {CANDIDATE_MODES}")
    if mode in ("auto", "ap"):
        aps = articulation_candidates(g)
        if aps or mode == "ap":
            return "ap", aps
    return "linearized", linearized_candidates(g)


# -- the static policy ----------------------------------------------------------------------
def policy_matrix(ctx: _Ctx, states: Sequence[int],
                  snapshots: Mapping[int, AbstractSet[int]] | None = None) -> np.ndarray:
    """The checkpoint matrix ``S`` of a chain policy (see the module docstring).

    ``states`` are the stage numbers ``c_1 < ... < c_M`` of the chain's checkpoints;
    ``snapshots[j]`` the state numbers (1-based) held while step ``j`` is reversed (REVOLVE),
    or ``None``: every state held until its last use (Chen, checkpoint-all).
    """
    st, n = ctx.st, ctx.n
    fwd = ctx.fwd
    S = np.zeros((n, n), dtype=bool)
    if n == 0:
        return S
    states = sorted(states)
    M = len(states)
    state_no = {c: k + 1 for k, c in enumerate(states)}
    tail = bool(ctx.fwd_order) and (M == 0 or ctx.fwd_order[-1] > states[-1])
    l = M + (1 if tail else 0)
    step = np.zeros(n, dtype=np.int64)
    key = np.zeros(n, dtype=np.int64)
    for v in ctx.fwd_order:
        step[v] = bisect_left(states, v) + 1
        key[v] = step[v] + 1 if v in state_no else step[v]

    # the step each stage reverses: l through the forward, then a running minimum
    rev = np.empty(n, dtype=np.int64)
    cur = l
    for t in range(n):
        if not fwd[t]:
            ks = [int(key[d]) for d in st.deps[t] if fwd[d]]
            if ks:
                cur = min(cur, min(ks))
        rev[t] = cur

    # natural lifetimes
    kept, last_use, last_fwd = st.kept, ctx.last_use, ctx.last_fwd_use
    for i in range(n):
        if kept[i]:
            S[i + 1:, i] = True
        elif ctx.pinned[i]:
            S[i + 1:ctx.pinned_end[i] + 1, i] = True
        elif not fwd[i]:
            S[i + 1:last_use[i] + 1, i] = True
        else:
            S[i + 1:last_fwd[i] + 1, i] = True

    # checkpoints / snapshots
    first = np.zeros(n, dtype=bool)
    first[1:] = rev[1:] != rev[:-1]
    for c in states:
        k = state_no[c]
        lo, hi = c + 1, int(last_use[c]) + 1
        if lo >= hi:
            continue
        if snapshots is None:
            S[lo:hi, c] = True
            continue
        held = np.array([k in snapshots.get(int(j), ()) for j in range(l + 1)], dtype=bool)
        ts = np.arange(lo, hi)
        on = held[rev[ts]] & (~first[ts] | held[rev[ts - 1]])
        S[ts[on], c] |= True

    # ladders: a value recomputed (or computed) while its own step is reversed, or the
    # checkpoint that starts that step, stays until its last use within the reversal
    neg_rev = -rev  # non-decreasing: searchsorted finds the last stage with rev >= x
    deps = st.deps
    saveable = ctx.saveable
    restore = {k: c for c, k in state_no.items()}
    for t in range(n):
        row = _stage_row(S, deps, t)
        j = int(rev[t])
        c = restore.get(j - 1)
        if c is not None and c < t and S[t, c]:
            row.append(c)  # a restored snapshot serves the next reversal too (no re-taping)
        for v in row:
            if not fwd[v] or not saveable[v] or kept[v]:
                continue
            sv = int(step[v])
            if sv == j or (j >= 2 and state_no.get(v) == j - 1):
                end = min(int(last_use[v]), int(np.searchsorted(neg_rev, -sv, side="right")) - 1)
                if end > t:
                    S[t + 1:end + 1, v] = True
    return S


def _stage_row(S: np.ndarray, deps: list[list[int]], t: int) -> list[int]:
    """What stage ``t`` computes under ``S`` (as :func:`solve_r`): node ``t``, the new
    checkpoints of stage ``t + 1`` and, transitively, every input that is not held."""
    held = S[t]
    n = S.shape[0]
    new = [t]
    if t + 1 < n:
        new += np.flatnonzero(S[t + 1, :t + 1] & ~held[:t + 1]).tolist()
    seen = set(new)
    stack = list(new)
    while stack:
        j = stack.pop()
        for i in deps[j]:
            if not held[i] and i not in seen:
                seen.add(i)
                stack.append(i)
    return sorted(seen)


@dataclass
class _Point:
    param: object
    checkpoints: list[int]
    schedule: Schedule
    sim: SimResult
    S: np.ndarray  # the checkpoint matrix the schedule was emitted from

    def summary(self) -> dict:
        return {"param": self.param, "n_checkpoints": len(self.checkpoints),
                "peak_bytes": self.sim.peak_bytes, "cost": self.sim.compute_cost,
                "recomputes": self.sim.recomputes, "valid": self.sim.valid}


def _evaluate(g: Graph, ctx: _Ctx, states: Sequence[int], snapshots, cm: CostModel,
              param: object, checkpoints: Sequence[int] | None = None, meta: dict | None = None) -> _Point:
    S = policy_matrix(ctx, states, snapshots)
    R = solve_r(ctx.st, S)
    sched = schedule_from_rs(ctx.st, R, S, meta)
    sim = simulate(sched, cm, timeline=False)
    return _Point(param, list(states if checkpoints is None else checkpoints), sched, sim, S)


def _pick(points: list[_Point], budget: float) -> tuple[_Point, bool]:
    """The cheapest valid point within the budget (ties: lower peak), else the lowest peak."""
    ok = [p for p in points if p.sim.valid and p.sim.peak_bytes <= budget]
    if ok:
        return min(ok, key=lambda p: (p.sim.compute_cost, p.sim.peak_bytes)), True
    valid = [p for p in points if p.sim.valid] or points
    return min(valid, key=lambda p: (p.sim.peak_bytes, p.sim.compute_cost)), False


def _result(name: str, g: Graph, ctx: _Ctx, budget: float | None, points: list[_Point],
            t0: float, cm: CostModel, details: dict) -> Plan:
    b = math.inf if budget is None else float(budget)
    if not points:
        return judged(name, g, b, None, solve_seconds=time.perf_counter() - t0, status="no_solution",
                      message="no schedule to evaluate", details=details)
    best, ok = _pick(points, b)
    names = ctx.st.names
    details = {**details, "param": best.param,
               "checkpoints": [names[c] for c in best.checkpoints]}
    if len(points) > 1:
        details["curve"] = [p.summary() for p in points]
    msg = "" if ok else f"no {name} schedule fits; the lowest peak is {best.sim.peak_bytes} bytes"
    best.schedule.meta.update({"solver": name, "param": best.param})
    res = judged(name, g, b, best.schedule, solve_seconds=time.perf_counter() - t0,
                 status="feasible" if ok else "infeasible", cost_model=cm, message=msg,
                 details=details, sim=best.sim, S=best.S)
    return res


