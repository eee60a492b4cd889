"""Peak descent: a local search over saved sets, each judged by the simulator on its peak.

The frontier (:mod:`remat.solvers.mincut.frontier`) prices the bytes a saved set holds from
the forward into the backward, not the bytes alive at the plan's peak, and offers only the
vertices of a convex hull. Its least-memory vertex recomputes everything it may, and the
copies it recomputes are alive together at the backward's peak; what lowers the peak is often
a set in between. ResNet-18 tiny's least-memory vertex measured 0.77 of the activation memory,
PyTorch's knob at 0.2 reaches 0.68, and the descent 0.66 (``benchmarks/predictions.py
--threads 1``, BENCHMARKS.md).

:func:`descend` starts from a saved set and takes one move at a time, the first that lowers
the simulated peak:

- **drop** a saved forward value alive at the peak (the backward recomputes it), largest
  first; never one that may be computed only once (random ops, ``must_save`` values and
  collectives: :func:`remat.plans.schedule.never_recomputed`), nor a schedule the simulator
  rejects;
- **save** a value recomputed in the backward and alive at the peak (its inputs may then
  die earlier), smallest first; never a ``must_recompute`` value (a user's checkpoint
  policy) nor one that cannot be saved.

Within ``budget`` (bytes) it goes on only with moves that cost no predicted time. It stops when
no move lowers the peak (that way), or after its trials or at the time limit: one simulation per move tried (``auto``'s whole ``min`` planning, the descent included,
took 0.12-0.98 s on the ``quick`` models: ``benchmarks/budgets_vs_torch.py``, BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from ..cost.model import CostModel, default_cost_model
from ..errors import PlanError
from ..graph.graph import Graph
from ..plans.saved_set import backward_work
from ..plans.schedule import Schedule, never_recomputed, schedule_from_saved_set
from ..plans.simulator import SimResult, simulate
from .deadline import SCALE, Deadline

DESCENT_SHARE = 0.05
"""At most this share of :data:`~remat.solvers.deadline.SCALE` (3 s of 60 s), within the time
limit, goes to the descent (:meth:`remat.solvers.deadline.Deadline.share`): the safety stop
under load; :data:`DESCENT_WORK` is the deterministic one."""

DESCENT_WORK = 100_000
"""The descent's deterministic stop: at most this many moves tried times the graph's nodes
(each move is one schedule and simulation, about linear in the nodes), at least
:data:`MIN_DESCENT_TRIALS` moves (:func:`descent_trials`): 243 moves on GPT-2 quick (410
nodes). The descents from the aggressive min cut of the ``quick`` models of
``remat.zoo.trials.budget_case`` (eager and inductor graphs, 410-853 nodes) ended by
themselves after 16-47 moves (0.03-0.4 s)."""

MIN_DESCENT_TRIALS = 100
"""The least moves the descent tries, however large the graph."""


def descent_trials(g: Graph) -> int:
    """The moves a descent on ``g`` tries at most (:data:`DESCENT_WORK`)."""
    return max(MIN_DESCENT_TRIALS, int(DESCENT_WORK // max(1, len(g))))


def descend(g: Graph, saved: Iterable[str], cost_model: CostModel | None = None, *,
            budget: float | None = None, time_limit: float | None = DESCENT_SHARE * SCALE,
            trials: int | None = None, polish: bool = True) -> tuple[list[str], SimResult]:
    """The saved set a descent from ``saved`` reaches and its simulation (see the module
    docstring): within ``budget`` bytes if it gets there, else the least peak it found.
    ``polish``: within the budget, it goes on with the moves that lower the peak at no
    predicted time (ResNet-18 quick's descent had stopped at 0.878 for a budget of 0.9, where
    the one for 0.7 went on to 0.778 at the same predicted step, a plan better on both).
    ``trials``: the moves tried at most (a stop that does not depend on the clock; None: no
    such stop). Raises :class:`~remat.errors.PlanError` if ``saved`` itself gives no valid
    schedule."""
    cm = cost_model or default_cost_model(g)
    clock = Deadline(time_limit)
    a = g._arrays
    fixed = never_recomputed(g)
    forward = a.forward & ~a.primal
    may_drop = forward & ~fixed
    may_save = forward & ~a.cannot_save
    current = _closed(g, saved)
    judged = _simulate(g, current, cm)
    if judged is None:
        raise PlanError(f"the saved set to descend from gives no valid schedule of {g.name!r}")
    schedule, sim = judged
    tried = 0
    while not clock.expired() and (trials is None or tried < trials):
        within = budget is not None and sim.peak_bytes <= budget
        if within and not polish:
            break
        moved = False
        for name, drop in _moves(g, current, _alive_at_peak(schedule, sim), may_drop, may_save):
            trial = _closed(g, current - {name} if drop else current | {name})
            judged = _simulate(g, trial, cm)
            tried += 1
            # within the budget, only a move that costs no predicted time: a lower peak for free
            if judged is not None and judged[1].peak_bytes < sim.peak_bytes and \
                    (not within or judged[1].predicted_seconds <= sim.predicted_seconds):
                current, (schedule, sim), moved = trial, judged, True
                break
            if clock.expired() or (trials is not None and tried >= trials):
                break
        if not moved:
            break
    return sorted(current, key=g.index), sim


def _closed(g: Graph, saved: Iterable[str]) -> set[str]:
    """``saved`` with the primal inputs its backward reads (resident anyway: saving them
    costs nothing), less the values its backward does not read (the plan would not save them:
    :meth:`remat.plans.plan.Plan.from_saved_set`)."""
    saved = set(saved)
    work = backward_work(g, saved)
    return (saved | set(work.missing_inputs)) - set(work.unread)


def _simulate(g: Graph, saved: set[str], cm: CostModel) -> tuple[Schedule, SimResult] | None:
    """The schedule of ``saved`` and its simulation, or None when it is not valid."""
    try:
        schedule = schedule_from_saved_set(g, sorted(saved, key=g.index))
        sim = simulate(schedule, cm, timeline=False)
    except PlanError:
        return None
    return (schedule, sim) if sim.valid else None


def _moves(g: Graph, saved: set[str], live: list[int], may_drop: np.ndarray, may_save: np.ndarray):
    """(name, drop?) for the values ``live`` at the peak: saved ones to drop, largest first,
    then recomputed ones to save, smallest first."""
    nodes = g.nodes
    drops = [i for i in live if may_drop[i] and nodes[i].name in saved]
    keeps = [i for i in live if may_save[i] and nodes[i].name not in saved]
    for i in sorted(drops, key=lambda i: (-nodes[i].bytes, i)):
        yield nodes[i].name, True
    for i in sorted(keeps, key=lambda i: (nodes[i].bytes, i)):
        yield nodes[i].name, False


def _alive_at_peak(schedule: Schedule, sim: SimResult) -> list[int]:
    """Nodes the schedule has computed and not freed when its peak statement runs."""
    index = schedule.graph._index
    alive: dict[int, None] = {}
    for st in schedule.statements[:sim.peak_statement + 1]:
        i = index[st.node]
        if st.op == "compute":
            alive[i] = None
        else:
            alive.pop(i, None)
    return list(alive)
