"""``solver="auto"``: plan within a budget with every solver that can, and keep the cheapest.

Checkmate's MILP for its time limit, the classic baselines and the min cuts each propose a
schedule; the simulator judges them; the cheapest within the budget wins. When none fits,
:class:`~remat.errors.InfeasibleBudgetError` states the smallest budget remat found feasible.
"""

from __future__ import annotations

import importlib
from typing import Callable

import numpy as np

from ..errors import InfeasibleBudgetError, RematError
from ..graph.graph import Graph
from ..plans.budget import parse_budget, resolve_budget, simulate_constant
from ..plans.plan import _fmt_bytes as _fmt
from ..plans.result import BudgetResult
from ..plans.schedule import schedule_from_saved_set
from ..plans.simulator import simulate


BUDGET_SOLVERS: dict[str, tuple[str, str]] = {
    "checkmate": ("remat.solvers.checkmate", "checkmate"),
    "checkmate-lp": ("remat.solvers.checkmate.lp_rounding", "checkmate_lp"),
}
"""Budgeted solver name -> (module, function); the baselines register from their module."""


AUTO_BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "chen-sqrtn-linearized",
                  "chen-greedy-linearized", "griewank")
"""What ``solver="auto"`` tries beside the MILP (in case it finds nothing in its time limit):
the chain policies on the articulation points (``chen-*``, when the graph has any) and on the
whole forward order (``-linearized``: on GPT-2 small only these fit 0.6 of the peak)."""


def budget_solvers() -> dict[str, Callable[..., BudgetResult]]:
    """Every budgeted solver by name: Checkmate's MILP and LP rounding, the baselines, and
    the min cut in both modes."""
    out = {}
    for name, (mod, fn) in BUDGET_SOLVERS.items():
        out[name] = getattr(importlib.import_module(mod), fn)
    from .baselines import BASELINES

    out.update(BASELINES)
    out.update(MINCUT_BUDGETED)
    return out


def smallest_feasible(g: Graph, tried: list[BudgetResult] = ()) -> tuple[int, str]:
    """The least simulated peak among the schedules remat can build cheaply (recompute
    everything from the inputs; the baselines at their tightest) and those already tried."""
    from .baselines import BASELINES
    from ..plans.stages import schedule_from_rs, solve_r, staged

    st = staged(g)
    S = np.zeros((st.n, st.n), dtype=bool)
    best = (simulate(schedule_from_rs(st, solve_r(st, S), S)).peak_bytes, "recompute-all")
    for name, fn in BASELINES.items():
        try:
            r = fn(g, 0)
        except Exception:  # noqa: BLE001 - a baseline that cannot run on this graph is skipped
            continue
        peak = r.details.get("min_peak", r.peak_bytes)
        if peak is not None and peak < best[0]:
            best = (int(peak), name)
    for r in tried:
        if r.feasible and r.peak_bytes is not None and r.peak_bytes < best[0]:
            best = (r.peak_bytes, r.solver)
    return best


def plan_within(g: Graph, budget: str | float | int, solver: str = "auto", *,
                time_limit: float | None = 60.0, headroom: float = 0.0,
                **options) -> BudgetResult:
    """The cheapest schedule ``solver`` finds within ``budget`` (see the module docstring).

    ``solver="auto"`` runs Checkmate's MILP for ``time_limit`` seconds and keeps the cheapest
    of it, the baselines in :data:`AUTO_BASELINES` and the min cuts (:data:`MINCUT_BUDGETED`)
    that fit. ``headroom``: the share of a byte budget
    left free for what the cost model does not see (the solvers plan within
    ``(1 - headroom) * budget``; a fractional budget, being relative to the simulator's own
    peak, gets none). Raises :class:`InfeasibleBudgetError` when nothing fits.
    """
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), not {headroom}")
    if parse_budget(budget)[0] == "fraction":
        headroom = 0.0  # a fraction is of the simulator's own peak: 1.0 always fits
    asked = resolve_budget(g, budget)
    limit = int(asked * (1.0 - headroom))
    solvers = budget_solvers()
    if solver != "auto" and solver not in solvers:
        raise ValueError(f"unknown budgeted solver {solver!r}; choose 'auto' or one of {sorted(solvers)}")
    names = ["checkmate", *AUTO_BASELINES, *MINCUT_BUDGETED] if solver == "auto" else [solver]
    tried: list[BudgetResult] = []
    for name in names:
        kwargs = dict(options)
        if name in BUDGET_SOLVERS and time_limit is not None:
            kwargs["time_limit"] = time_limit
        tried.append(solvers[name](g, limit, **kwargs))
    ok = [r for r in tried if r.feasible]
    if ok:
        return min(ok, key=lambda r: (r.cost, r.peak_bytes))
    peak, how = smallest_feasible(g, tried)
    peak = int(np.ceil(peak / (1.0 - headroom)))  # the budget that leaves the headroom free
    first = tried[0]
    reasons = f"{first.solver}: {first.status}" + (f", {first.message}" if first.message else "")
    if len(tried) > 1:
        reasons += f"; {len(tried) - 1} baselines also over budget"
    room = f" (planned within {_fmt(limit)}, {headroom:.0%} left free)" if headroom else ""
    raise InfeasibleBudgetError(
        f"no schedule of {g.name!r} fits the budget of {_fmt(asked)}{room} ({reasons}). The "
        f"smallest feasible budget found is {_fmt(peak)} ({peak} bytes, by {how}); inputs and "
        f"parameters alone take {_fmt(simulate_constant(g))}.", smallest_feasible=peak)


def _mincut_budgeted(mode: str) -> Callable[..., BudgetResult]:
    def solver(g: Graph, budget: float, **_options) -> BudgetResult:
        import time

        from ..plans.result import judged
        from .mincut.mincut import mincut

        t0 = time.perf_counter()
        name = f"mincut-{mode}"
        try:
            plan = mincut(g, mode)
        except RematError as e:  # a graph the min cut cannot plan
            return judged(name, budget, None, solve_seconds=time.perf_counter() - t0,
                          status="unsupported", message=str(e))
        sched = schedule_from_saved_set(g, [v.name for v in plan.saved])
        sched.meta.update(solver=name)
        return judged(name, budget, sched, solve_seconds=time.perf_counter() - t0,
                      status="feasible")

    solver.__name__ = f"mincut_{mode}"
    solver.__doc__ = (f"seeds/000's min cut ({mode} mode) as a budgeted solver: its saved set "
                      "lowered to a schedule and judged against the budget (no search over "
                      "the budget: it fits or it does not).")
    return solver


MINCUT_BUDGETED = {f"mincut-{m}": _mincut_budgeted(m) for m in ("conservative", "aggressive")}
"""seeds/000's min cut in both modes as budgeted solvers. On large graphs whose MILP cannot
finish, a min cut that fits is often cheaper than the chain policies; ``solver="auto"``
tries both."""
