"""Cheap bounds and the schedule without recomputation (seeds/001), shared by the MILP and LP
rounding: :func:`memory_lower_bound` rejects hopeless budgets before a solver runs, and
:func:`checkpoint_all` is the top of the useful budget range."""

from __future__ import annotations

import time

import numpy as np

from ...cost.model import CostModel
from ...graph.graph import Graph
from ...plans.plan import Plan, judged
from ...plans.schedule import Schedule
from ...plans.simulator import simulate
from ...plans.stages import Spans, schedule_from_rs, solve_r, staged
from ...cost.model import constant_bytes
from .model import stage_arrays, stage_workspace, too_large


def memory_lower_bound(g: Graph) -> tuple[int, str]:
    """A bound no schedule goes below, and why: computing node ``t`` needs the constant
    overhead, ``t``'s inputs, output and workspace, and every kept value (output, gradient)
    computed before ``t``. Returns ``(bytes, reason)``."""
    st, M, _ = stage_arrays(g)
    W = stage_workspace(g)
    const = constant_bytes(g)
    best, why = const, "the constant overhead (inputs and parameters)"
    kept = st.kept
    kept_bytes = 0  # the values kept to the end computed before t (a running sum: linear)
    for t in range(st.n):
        b = const + kept_bytes + int(sum(int(M[i]) for i in {t, *st.deps[t]} if not (kept[i] and i < t))) \
            + int(W[t])
        if b > best:
            best, why = b, (f"computing {st.names[t]!r} needs its inputs, its output"
                            + (", its workspace" if W[t] else "") + ", the values kept to "
                            "the end so far and the constant overhead")
        if kept[t]:
            kept_bytes += int(M[t])
    return best, why


def checkpoint_all_spans(g: Graph) -> Spans:
    """:func:`checkpoint_all_matrix` as :class:`~remat.plans.stages.Spans` (linear in the
    stages, where the matrix is quadratic)."""
    st = staged(g)
    n = st.n
    idx = np.arange(n, dtype=np.int64)
    last = np.array([n - 1 if st.kept[i] else max(st.users[i], default=i) for i in range(n)],
                    dtype=np.int64)
    return Spans.of(n, idx, idx + 1, last + 1)


def checkpoint_all_matrix(g: Graph) -> np.ndarray:
    """Checkpoint matrix of :func:`checkpoint_all`: value ``i`` is held from stage ``i + 1``
    through its last user's stage (kept values to the end)."""
    return checkpoint_all_spans(g).dense()


def checkpoint_all(g: Graph) -> Schedule:
    """The schedule that computes every node once: each value stays resident from its stage
    until its last user's stage (kept values to the end). At its peak no schedule in
    Checkmate's search space needs to recompute (Checkmate's *checkpoint all*, with values
    freed after their last use); the MILP may find a lower peak without recomputation."""
    st = staged(g)
    S = checkpoint_all_spans(g)
    return schedule_from_rs(st, solve_r(st, S), S, {"solver": "checkpoint-all"})


def checkpoint_all_peak(g: Graph) -> int:
    """Simulated peak bytes of :func:`checkpoint_all`."""
    return simulate(checkpoint_all(g)).peak_bytes


def early_result(solver: str, g: Graph, budget: float, cm: CostModel, details: dict,
                 t0: float, max_columns: int | None = None) -> Plan | None:
    """The result that needs no solve, else None: infeasible when ``budget`` is below the
    constant overhead or :func:`memory_lower_bound`; ``"too_large"`` when the model would
    exceed ``max_columns`` (:func:`~remat.solvers.checkmate.model.too_large`). Fills ``details``
    with both bounds."""
    const = constant_bytes(g)
    lb_bytes, why = memory_lower_bound(g)
    details.update(memory_lower_bound=lb_bytes, constant_bytes=const)
    status, msg = "infeasible", None
    if budget < const:
        msg = (f"infeasible budget: {int(budget)} bytes is below the constant overhead of "
               f"{const} bytes (inputs and parameters, resident throughout)")
    elif budget < lb_bytes:
        msg = f"infeasible budget: {int(budget)} bytes is below {lb_bytes} bytes: {why}"
    else:
        status, msg = "too_large", too_large(staged(g), max_columns)
    if msg is None:
        return None
    return judged(solver, g, budget, None, solve_seconds=time.perf_counter() - t0, status=status,
                  cost_model=cm, details=details, message=msg)
