"""The simulator: the one judge of every plan's memory and time.

:func:`simulate` replays a :class:`~remat.plans.schedule.Schedule` on its Graph. It checks that
every value a statement reads is resident, that nothing is computed while still resident
or freed twice, that inputs, parameters and kept values (outputs, gradients) are never
freed and that every required node is computed. It returns the peak memory, the memory
timeline (bytes resident after each statement, as seeds/001's U), and the predicted time
under the cost model (:mod:`remat.cost.model`).

Under a fusing compiler (``CostModel.fused_memory``) a value fused kernels keep in registers
takes no memory (:func:`_allocations`), and a kernel that reads an input for the last time
writes its output into that input's storage when both have the same size (inductor's
``inplace_buffers``): the two are not allocated together.

Memory counts the inputs and parameters (resident throughout, Checkmate's constant
overhead) plus every computed value until it is freed; a view shares its base's storage,
which stays allocated while either is resident (:func:`remat.cost.model.storage`); a value is counted from the moment
its op starts, while its inputs are still resident, so the peak includes each op's inputs
and output together.

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.schedule import schedule_from_saved_set
>>> g = cos_cos_graph()
>>> r = simulate(schedule_from_saved_set(g, ["add_2"]))
>>> r.valid, r.peak_bytes // 4096  # 4 inputs, add_2 saved, cos_1, the tangent, cos and sin
(True, 9)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.model import (CostModel, constant_bytes, default_cost_model, materialized, memory_materialized,
                          storage)
from ..errors import PlanError
from ..graph.graph import Graph
from .schedule import Schedule, kept_to_end, never_recomputed, required_nodes


@dataclass
class SimResult:
    valid: bool
    errors: list[str]
    peak_bytes: int
    peak_statement: int  # index of the statement at which the peak is first reached (-1: at start)
    timeline: list[int]  # bytes resident after each statement
    constant_bytes: int  # inputs and parameters, resident throughout
    end_bytes: int  # resident when the schedule ends (kept values and leaks)
    compute_cost: float  # additive per-op cost (Checkmate): sum over compute statements
    traffic_bytes: int  # fusion-aware memory traffic of the computed values
    predicted_seconds: float  # the cost model's time for the whole schedule
    computes: int
    recomputes: int  # compute statements beyond the first of each node
    meta: dict = field(default_factory=dict)

    def within(self, budget: float) -> bool:
        return self.valid and self.peak_bytes <= budget

    def check(self) -> "SimResult":
        """Raise :class:`PlanError` naming the first problem when the schedule is invalid."""
        if not self.valid:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            raise PlanError(f"invalid schedule: {self.errors[0]}{more}")
        return self


_MAX_ERRORS = 20


def _allocations(schedule: Schedule, g: Graph, owner: list[int]) -> list[bool]:
    """For each statement, whether its compute allocates memory under a fusing compiler
    (``CostModel.fused_memory``): a value is held in memory only when its storage is
    materialized (:func:`remat.cost.model.memory_materialized`: a kernel writes it) or when
    the schedule carries it from one phase into the other (a saved value); a fusible value
    read only by fused kernels of its own phase lives in registers. A recomputation (a forward
    value the backward computes again) is counted written: with recomputations in registers,
    plans that recompute much measured well above their prediction (a diagnostic run on GPT-2,
    Llama and Qwen2, not committed); counted, and compiled in the plan's order
    (:mod:`remat.lower.plan_order`), they measure 0.80-0.98x it (``benchmarks/plan_order.py``). A
    forward-role value the backward computes first (the one-hot of a cross-entropy's labels) is
    fused like any backward value: with it and in-place writes (:func:`simulate`), PyTorch's
    no-recompute partition is predicted as ``benchmarks/plan_order.py`` prints in its
    reference rows (BENCHMARKS.md)."""
    a = g._arrays
    ins = g.input_indices
    index = g._index
    mat = memory_materialized(g).tolist()
    smat = [False] * a.n
    for i, m in enumerate(mat):
        if m:
            smat[owner[i]] = True
    forward = a.forward.tolist()
    primal = a.primal.tolist()
    out = [False] * len(schedule.statements)
    occurrence = [-1] * a.n  # the statement that computed each resident value
    phase = [False] * a.n
    in_forward = [False] * a.n  # computed in the forward phase
    backward = False
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None or st.op != "compute":
            continue
        backward = backward or not forward[i]
        for j in ins[i]:
            if not primal[j] and occurrence[j] >= 0 and phase[j] != backward:
                out[occurrence[j]] = True  # carried across the phases: saved
        occurrence[i], phase[i] = k, backward
        in_forward[i] = in_forward[i] or not backward
        out[k] = out[k] or smat[owner[i]] or (backward and in_forward[i])
    return out


def _dying(schedule: Schedule, index: dict[str, int]) -> list[list[int]]:
    """For each statement, the values the frees right after it (before the next compute)
    release: those a compute there reads last."""
    out: list[list[int]] = [[] for _ in schedule.statements]
    last = -1
    for k, st in enumerate(schedule.statements):
        if st.op == "compute":
            last = k
        elif st.op == "free" and last >= 0 and st.node in index:
            out[last].append(index[st.node])
    return out


def simulate(schedule: Schedule, cost_model: CostModel | None = None, *,
             timeline: bool = True) -> SimResult:
    """Replay ``schedule`` on its graph; see the module docstring for the rules."""
    g: Graph = schedule.graph
    cm = cost_model or default_cost_model(g)
    a = g._arrays
    ins = g.input_indices
    owner, sizes = storage(g)
    primal = a.primal.tolist()
    keep = kept_to_end(g).tolist()
    once = never_recomputed(g).tolist()
    resident = list(primal)
    # a storage is held while any value living in it is resident (a view keeps its base)
    refs = [0] * a.n
    for i, p in enumerate(primal):
        if p:
            refs[owner[i]] += 1
    computed = [False] * a.n
    errors: list[str] = []
    constant = constant_bytes(g)
    mem = constant
    peak, peak_at = mem, -1
    tl: list[int] = []
    op_cost = cm.op_costs(g)
    work = cm.workspace(g)  # transient bytes while an op runs
    fusible = a.fusible.tolist()
    raw = a.bytes.tolist()  # traffic moves a view's own bytes; memory counts storages
    forward = a.forward.tolist()
    flops = [n.flops for n in g.nodes]
    mat = materialized(g).tolist()
    compute_cost = 0.0
    traffic_total = 0
    flops_total = 0.0
    kernels = 0
    backward = False  # the phase: the backward starts with the first non-forward compute
    phase = [False] * a.n  # the phase each resident value was computed in
    written = [False] * a.n  # the resident value has been written to memory
    read_by_fused = [0] * a.n  # 1 + phase in which fused kernels have read the value
    n_computes = 0
    index = g._index

    def err(msg: str) -> None:
        if len(errors) < _MAX_ERRORS:
            errors.append(msg)

    def _donor(i: int, k: int) -> int:
        """An input of ``i`` whose storage ``i`` can write into: it dies at statement ``k``,
        holds its storage alone and has ``i``'s size; -1 if none."""
        for j in dying[k]:
            oj = owner[j]
            if donor_ok[j] and counted[j] and resident[j] and refs[oj] == 1 and sizes[oj] == sizes[i] \
                    and j in ins[i]:
                return j
        return -1

    allocates = _allocations(schedule, g, owner) if cm.fused_memory else None
    counted = [True] * a.n  # the resident value holds a reference to its storage
    # a fused kernel writes its output into an input of the same size it reads last
    # (inductor's inplace_buffers): the output takes that storage over
    dying = _dying(schedule, index) if cm.fused_memory else None
    donor_ok = [not primal[i] and n.role != "tangent" for i, n in enumerate(g.nodes)]

    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None:
            err(f"statement {k}: {st} names no node of the graph")
            tl.append(mem)
            continue
        if st.op == "compute":
            if primal[i]:
                err(f"statement {k}: {st}: inputs and parameters are resident, never computed")
            elif resident[i]:
                err(f"statement {k}: {st}: value already resident (free it before recomputing)")
            elif computed[i] and once[i]:
                err(f"statement {k}: {st}: {g.nodes[i].name!r} may be computed only once "
                    "(a random op would draw fresh randomness; or it is flagged must_save)")
            else:
                missing = [g.nodes[j].name for j in ins[i] if not resident[j]]
                if missing:
                    err(f"statement {k}: {st}: input {missing[0]!r} is not resident")
                resident[i] = True
                computed[i] = True
                o = owner[i]
                counted[i] = allocates is None or allocates[k]
                if counted[i]:
                    donor = _donor(i, k) if dying is not None and o == i and fusible[i] and \
                        not (backward and forward[i]) else -1
                    refs[o] += 1
                    if donor >= 0:  # i's storage is the donor's: nothing new is allocated
                        counted[donor] = False
                        refs[owner[donor]] -= 1
                    elif refs[o] == 1:
                        mem += sizes[o]
                n_computes += 1
                compute_cost += op_cost[i]
                backward = backward or not forward[i]
                phase[i] = backward
                written[i] = mat[i]
                read_by_fused[i] = 0
                traffic_total += raw[i] if mat[i] else 0
                for j in ins[i]:
                    crosses = not primal[j] and phase[j] != backward
                    if crosses and not written[j]:  # a value saved for the backward
                        written[j] = True
                        traffic_total += raw[j]
                    if not fusible[i]:
                        traffic_total += raw[j]  # every non-fusible kernel reads its inputs
                    elif (mat[j] or crosses) and read_by_fused[j] != 1 + backward:
                        read_by_fused[j] = 1 + backward  # fused readers share one read per phase
                        traffic_total += raw[j]
                flops_total += flops[i]
                kernels += mat[i]
                if mem + work[i] > peak:
                    peak, peak_at = mem + work[i], k
        elif st.op == "free":
            if primal[i] or keep[i]:
                err(f"statement {k}: {st}: {g.nodes[i].role} values and outputs are kept to the end")
            elif not resident[i]:
                err(f"statement {k}: {st}: value is not resident")
            else:
                resident[i] = False
                o = owner[i]
                if counted[i]:
                    refs[o] -= 1
                    if refs[o] == 0:
                        mem -= sizes[o]
        else:
            err(f"statement {k}: unknown op {st.op!r}")
        if timeline:
            tl.append(mem)
    missing_req = np.flatnonzero(required_nodes(g) & ~np.array(computed, dtype=bool)).tolist()
    for i in missing_req[:5]:
        err(f"required node {g.nodes[i].name!r} is never computed")
    n_unique = sum(computed)
    return SimResult(
        valid=not errors, errors=errors, peak_bytes=int(peak), peak_statement=peak_at,
        timeline=tl, constant_bytes=constant, end_bytes=int(mem), compute_cost=compute_cost,
        traffic_bytes=int(traffic_total), predicted_seconds=cm.seconds(compute_cost, traffic_total, flops_total, kernels, g),
        computes=n_computes, recomputes=n_computes - n_unique,
    )
