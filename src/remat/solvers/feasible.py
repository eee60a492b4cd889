"""The smallest budget remat can meet cheaply: what an infeasible budget's error states.

Recomputing everything from the inputs, and each baseline at its tightest, are schedules that
need no search; the least simulated peak among them (and among any plans already made) is a
budget known to be feasible. It is computed once per graph; under a time limit the baselines
that search (Chen's greedy, Griewank's slots) stop once it runs out and are skipped after it
(the fixed policies, :data:`FIXED`, run first and always: a few hundredths of a second each),
and the result is not kept.
"""

from __future__ import annotations

from typing import Iterable

from ..cost.model import CostModel
from ..graph.graph import Graph
from ..plans.budget import reference_name, reference_peak
from ..plans.plan import Plan
from ..plans.simulator import simulate
from ..plans.stages import Spans, schedule_from_rs, solve_r, staged
from .baselines import BASELINES
from .deadline import Deadline


RECOMPUTE_ALL_SECONDS_PER_STAGE2 = 3e-6
"""Recompute-all's schedule has one statement per (stage, ancestor): 0.6 s for 510 stages here;
it is skipped when less time is left than this times the stages squared."""

FIXED = ("checkpoint-all", "chen-sqrtn", "chen-sqrtn-ap", "chen-sqrtn-linearized")
"""Baselines that evaluate one policy, without a search (0.02 s each on ResNet50's graph)."""


def staged_schedules_run_as_planned(cm: CostModel) -> bool:
    """Whether schedules that compute a value several times in the backward (the baselines,
    Checkmate) run in the order they were planned. Not under a fusing compiler
    (``cm.fused_memory``): inductor's scheduler fuses the copies of a recomputed value
    horizontally and runs them early in the backward, where they are all alive at once
    (``benchmarks/budget_torch.py --compiler inductor``: Checkmate's plan of a CNN measured
    1.56x its predicted peak above the step's start, 4.90 MiB against a budget of 4.20 MiB;
    through the eager compiler the same solvers' plans measured their prediction to 0.1%), so
    ``auto`` keeps to saved sets there, which recompute each value once, as PyTorch's own
    partitioner does."""
    return not cm.fused_memory


def smallest_feasible(g: Graph, tried: Iterable[Plan] = (), *,
                      time_limit: float | None = None, staged: bool = True) -> tuple[int, str]:
    """``(bytes, how)``: the least simulated peak of recompute-all, the baselines at their
    tightest, and the plans in ``tried`` that have a valid schedule. The baselines share
    ``time_limit`` seconds (each evaluates at least one schedule, a fraction of a second on
    Checkmate's largest graphs); when the limit stops their search ``how`` says so. With
    ``staged=False`` (what ``auto`` offers under inductor: saved sets), only the reference and
    the plans in ``tried``."""
    known = []
    for p in tried:
        for peak, name in [(p.peak_bytes, p.solver)] + [
                (t.peak_bytes, t.solver) for t in p.tried]:
            if peak is not None and p.status != "invalid":
                known.append((int(peak), name))
    best = g._memo.get("smallest_feasible") if staged else (reference_peak(g), reference_name(g))
    if best is None:
        if known and time_limit is not None and time_limit <= 0:
            best = (min(known)[0], f"{min(known)[1]}, the least peak among the plans tried")
            return best  # out of time: what the solvers already found
        best, complete = _cheapest_schedules(g, Deadline(time_limit))
        if complete:
            g._memo["smallest_feasible"] = best
        else:
            best = (best[0], f"{best[1]}; the time limit stopped the search for a smaller one")
    for peak, name in known:
        if peak < best[0]:
            best = (peak, name)
    return best


def _cheapest_schedules(g: Graph, clock: Deadline) -> tuple[tuple[int, str], bool]:
    best = (reference_peak(g), reference_name(g))  # the reference schedule is always feasible

    def run(name: str) -> None:
        nonlocal best
        try:  # a baseline that runs out of time stops at its best point so far
            r = BASELINES[name](g, 0, time_limit=clock.left())
        except Exception:  # noqa: BLE001 - a baseline that cannot run on this graph is skipped
            return
        if r.peak_bytes is not None and r.peak_bytes < best[0]:
            best = (int(r.peak_bytes), name)

    for name in FIXED:  # a few hundredths of a second each: always
        if name != "checkpoint-all" and name in BASELINES:
            run(name)
    st = staged(g)  # recompute-all: its schedule is quadratic in the stages (0.6 s on 510)
    if clock.limit is None or clock.left() >= RECOMPUTE_ALL_SECONDS_PER_STAGE2 * st.n ** 2:
        S = Spans.empty(st.n)  # nothing held: each stage recomputes what it needs (no n x n matrix)
        best = min(best, (simulate(schedule_from_rs(st, solve_r(st, S), S)).peak_bytes, "recompute-all"))
    for name in BASELINES:
        if name not in FIXED and not clock.expired():
            run(name)
    return best, not clock.expired()
