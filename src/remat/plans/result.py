"""Budgeted solvers: schedules whose simulated peak memory fits a byte budget.

Every budgeted solver is a function ``solver(g, budget, **options) -> BudgetResult``;
``budget`` is in bytes and bounds the simulator's peak (inputs and parameters included, as
Checkmate's constant overhead). A solver never reports a schedule as feasible unless the
simulator (:func:`remat.plans.simulator.simulate`) replayed it, found it valid, and found its
peak within the budget: :func:`judged` is the one place that decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cost.model import CostModel, default_cost_model
from .schedule import Schedule
from .simulator import SimResult, simulate


@dataclass
class BudgetResult:
    solver: str
    budget: float
    feasible: bool  # a schedule within budget was found (and checked by the simulator)
    schedule: Schedule | None
    cost: float | None  # additive cost of the schedule (sum of op costs, recomputations included)
    peak_bytes: int | None  # simulated peak of the schedule
    solve_seconds: float
    status: str  # "optimal", "feasible", "time_limit", "infeasible", "no_solution", ...
    lower_bound: float | None = None  # proven bound on the optimal cost (MILP), when known
    gap: float | None = None  # (cost - lower_bound) / cost, when both are known
    message: str = ""
    sim: SimResult | None = field(default=None, repr=False)
    details: dict[str, Any] = field(default_factory=dict)
    S: Any = field(default=None, repr=False)  # checkpoint matrix over the stages, when the
    # solver works on Checkmate's staged problem (baselines, MILP, LP rounding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "solver": self.solver, "budget": self.budget, "feasible": self.feasible,
            "status": self.status, "cost": self.cost, "peak_bytes": self.peak_bytes,
            "solve_seconds": self.solve_seconds, "lower_bound": self.lower_bound, "gap": self.gap,
            "message": self.message, "recomputes": self.sim.recomputes if self.sim else None,
            "schedule": self.schedule.to_list() if self.schedule is not None else None,
            **({"details": self.details} if self.details else {}),
        }


def judged(solver: str, budget: float, schedule: Schedule | None, *, solve_seconds: float,
           status: str, cost_model: CostModel | None = None, lower_bound: float | None = None,
           message: str = "", details: dict | None = None) -> BudgetResult:
    """Simulate ``schedule`` and build the result: infeasible unless valid and within budget."""
    if schedule is None:
        return BudgetResult(solver, budget, False, None, None, None, solve_seconds, status,
                            lower_bound, None, message, None, dict(details or {}))
    sim = simulate(schedule, cost_model or default_cost_model())
    ok = sim.valid and sim.peak_bytes <= budget
    if not sim.valid:
        status, message = "invalid", f"solver returned an invalid schedule: {sim.errors[0]}"
    elif not ok:
        status = "over_budget"
        message = (f"schedule peaks at {sim.peak_bytes} bytes, over the budget of {int(budget)}"
                   + (f" ({message})" if message else ""))
    cost = sim.compute_cost
    gap = None
    if lower_bound is not None and cost > 0:
        gap = max(0.0, (cost - lower_bound) / cost)
    return BudgetResult(solver, budget, ok, schedule, cost, sim.peak_bytes, solve_seconds,
                        status, lower_bound, gap, message, sim, dict(details or {}))
