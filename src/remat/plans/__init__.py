"""Plans and the one judge of them (no torch).

A :class:`Plan` is what a solver decided for one graph; its :class:`Schedule` is the ordered
``compute``/``free`` statements that run it; :func:`simulate` replays any schedule (validity,
peak memory, predicted time); :mod:`.budget` parses and resolves memory budgets;
:mod:`.stages` is Checkmate's staged view (R/S matrices) of a schedule.
"""

from .outcome import Attempt, OutOfReach, TimeBound
from .plan import Decision, Plan, PlanStatus, SavedValue, SolverReport, Verdict
from .schedule import Schedule, Statement, schedule_from_saved_set
from .simulator import SimResult, simulate

__all__ = ["Attempt", "OutOfReach", "TimeBound", "Decision", "Plan", "PlanStatus", "SavedValue", "SolverReport", "Verdict", "Schedule", "Statement", "schedule_from_saved_set", "SimResult", "simulate"]
