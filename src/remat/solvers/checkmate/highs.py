"""Running HiGHS on a :class:`~remat.solvers.checkmate.model.CheckmateModel`: one instance,
time limits that hold (interrupt callbacks), and the outcome in remat's terms."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import highspy
import numpy as np

from .model import CheckmateModel


@dataclass
class HighsOutcome:
    status: str  # "optimal", "infeasible", "time_limit", ... (HiGHS model status, simplified)
    highs_status: str  # the raw HiGHS model status name
    has_solution: bool
    x: np.ndarray | None  # column values
    objective: float | None  # model units
    dual_bound: float | None  # model units (MIP: mip_dual_bound; LP: the optimum)
    gap: float | None
    nodes: int
    seconds: float


def new_highs(model: CheckmateModel, *, relax: bool = False, threads: int | None = None,
              verbose: bool = False, options: dict | None = None):
    """A ``highspy.Highs`` holding ``model`` (integrality dropped when ``relax``)."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    if threads is not None:
        h.setOptionValue("threads", int(threads))
        highspy.Highs.resetGlobalScheduler(True)
    for k, v in (options or {}).items():
        h.setOptionValue(k, v)
    model.to_highs(h, relax=relax)
    return h


@contextmanager
def _deadline(h, deadline: float | None):
    """Interrupt ``h`` at ``deadline`` (a ``time.perf_counter()`` value) from inside the
    simplex, IPM and MIP loops. HiGHS's own ``time_limit`` is not checked within a large
    root LP: ResNet50's ran 74 s past a 50 s limit."""
    if deadline is None:
        yield
        return
    def stop_when_late(event) -> None:
        if time.perf_counter() >= deadline:
            event.interrupt()

    hooks = (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt)
    for hook in hooks:
        hook.subscribe(stop_when_late)
    try:
        yield
    finally:
        for hook in hooks:
            hook.unsubscribe(stop_when_late)


SETUP_SECONDS_PER_NONZERO = 1.5e-6
"""Before its first simplex iteration, where a time limit or an interrupt can first stop it,
HiGHS sets the model up (scaling, the starting basis and its factorization): 2.4-2.8 s for the
2.3M nonzeros of a 600-node synthetic graph's LP here, 0.1-0.6 s for a 300-node one's 419k
(two runs of ``benchmarks/time_limits.py``, which times it). With less time left than this estimate,
:func:`run_highs` does not start HiGHS and reports ``"time_limit"`` with no solution: started,
it could not have stopped on time (in CI, ``checkmate-lp`` ran 3.1 s for a 2 s limit)."""

PRESOLVE_SECONDS_PER_NONZERO = 1e-6
"""HiGHS's presolve, which no callback interrupts, took 2.2 s on a 2.3M-nonzero Checkmate LP
here (a 553-node graph): with a time limit shorter than twice that estimate, :func:`run_highs`
turns presolve off, so that the simplex, which stops on time, starts at once."""


def setup_seconds(nonzeros: int) -> float:
    """The seconds HiGHS may take before a time limit can stop it, on a model of ``nonzeros``."""
    return SETUP_SECONDS_PER_NONZERO * nonzeros


def run_highs(h, *, time_limit: float | None = None, mip_gap: float | None = None,
              mip: bool = True) -> HighsOutcome:
    """Run ``h`` and read back the status, the incumbent and the bound; not run (status
    ``"time_limit"``, no solution) when ``time_limit`` is shorter than HiGHS's setup."""
    nonzeros = h.getNumNz()
    if time_limit is not None and time_limit < setup_seconds(nonzeros):
        return HighsOutcome("time_limit", "not started (less time left than HiGHS's setup)",
                            False, None, None, None, None, 0, 0.0)
    h.setOptionValue("time_limit", float(time_limit) if time_limit is not None else np.inf)
    if time_limit is not None and 2 * PRESOLVE_SECONDS_PER_NONZERO * nonzeros > time_limit:
        h.setOptionValue("presolve", "off")
    if mip_gap is not None:
        h.setOptionValue("mip_rel_gap", float(mip_gap))
    t0 = time.perf_counter()
    with _deadline(h, None if time_limit is None else t0 + float(time_limit)):
        h.run()
    seconds = time.perf_counter() - t0
    ms = h.getModelStatus()
    raw = ms.name if hasattr(ms, "name") else str(ms).split(".")[-1]
    status = _STATUS.get(raw, raw)
    info = h.getInfo()
    has = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has else None
    obj = float(info.objective_function_value) if has else None
    if mip:
        db = float(info.mip_dual_bound)
        dual = db if np.isfinite(db) else None
        gap = float(info.mip_gap) if has and np.isfinite(info.mip_gap) else None
        nodes = int(info.mip_node_count)
    else:
        dual = obj if status == "optimal" else None
        gap, nodes = None, 0
    return HighsOutcome(status, raw, has, x, obj, dual, gap, nodes, seconds)


_STATUS = {
    "kOptimal": "optimal", "kInfeasible": "infeasible", "kTimeLimit": "time_limit",
    "kUnboundedOrInfeasible": "infeasible", "kInterrupt": "interrupted",
    "kHighsInterrupt": "interrupted", "kIterationLimit": "iteration_limit",
    "kSolutionLimit": "solution_limit", "kMemoryLimit": "memory_limit",
}
