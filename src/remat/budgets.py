"""Memory budgets: parse them, resolve fractions, and plan within them (no torch).

A budget bounds the simulated peak memory of the whole training step, inputs and
parameters included: ``"6GiB"``, ``"512MB"``, ``6e9`` (bytes), or a fraction such as
``0.6`` of the peak with no recomputation (every value the backward reads is saved, as
PyTorch's ``default_partition`` does; :func:`reference_peak`). Because it bounds peak memory and every solver's
schedule is checked by the simulator, a larger budget never yields a higher peak than the
budget, and a budget no schedule fits raises :class:`InfeasibleBudgetError` stating the
smallest budget that remat found feasible.
"""

from __future__ import annotations

import importlib
import re
from typing import Callable

import numpy as np

from .errors import RematError
from .graph import Graph
from .plans import _fmt_bytes as _fmt
from .schedule import schedule_from_saved_set
from .simulator import simulate
from .solvers.budget import BudgetResult

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

BUDGET_SOLVERS: dict[str, tuple[str, str]] = {
    "checkmate": ("remat.solvers.checkmate", "checkmate"),
    "checkmate-lp": ("remat.solvers.lp_rounding", "checkmate_lp"),
}
"""Budgeted solver name -> (module, function); the baselines register from their module."""


TORCH_HEADROOM = 0.01
"""Share of a byte budget that ``remat.compile`` keeps free on a real training step for
allocations the cost model does not see (oneDNN's per-thread scratch in a CPU convolution's
backward measured 0.55% of the ConvBN test step; allocator rounding): it plans within
``(1 - TORCH_HEADROOM) * budget``."""

AUTO_BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "chen-sqrtn-linearized",
                  "chen-greedy-linearized", "griewank")
"""What ``solver="auto"`` tries beside the MILP (in case it finds nothing in its time limit):
the chain policies on the articulation points (``chen-*``, when the graph has any) and on the
whole forward order (``-linearized``: on GPT-2 small only these fit 0.6 of the peak)."""


class InfeasibleBudgetError(RematError):
    """No schedule remat found fits the budget; the message states the smallest that did."""

    def __init__(self, message: str, smallest_feasible: int | None = None):
        super().__init__(message)
        self.smallest_feasible = smallest_feasible


def budget_solvers() -> dict[str, Callable[..., BudgetResult]]:
    """Every budgeted solver by name: Checkmate's MILP and LP rounding, the baselines, and
    the min cut in both modes."""
    out = {}
    for name, (mod, fn) in BUDGET_SOLVERS.items():
        out[name] = getattr(importlib.import_module(mod), fn)
    from .solvers.baselines import BASELINES

    out.update(BASELINES)
    out.update(MINCUT_BUDGETED)
    return out


def parse_budget(budget: str | float | int) -> tuple[str, float]:
    """``("bytes", n)`` or ``("fraction", f)`` from ``"6GiB"``, ``6e9``, ``0.6`` or ``"60%"``."""
    if isinstance(budget, bool):
        raise ValueError(f"budget {budget!r}: give bytes (e.g. '6GiB', 6e9) or a fraction (0.6)")
    if isinstance(budget, (int, float)):
        if budget <= 0:
            raise ValueError(f"budget {budget!r} must be positive")
        return ("fraction", float(budget)) if budget <= 1 else ("bytes", float(budget))
    text = str(budget).strip().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(%|[kmgt]i?b|b)?", text, flags=re.I)
    if not m:
        raise ValueError(f"budget {budget!r} is not understood: use bytes with a unit "
                         "('6GiB', '512MB', '1e9') or a fraction of the no-recomputation peak (0.6, '60%')")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if value <= 0:
        raise ValueError(f"budget {budget!r} must be positive")
    if unit == "%":
        return "fraction", value / 100
    if unit == "" and value <= 1:
        return "fraction", value
    return "bytes", value * _UNITS[unit]


def no_recompute_saved(g: Graph) -> list[str]:
    """Every forward value the backward reads (and forward values it returns)."""
    a = g._arrays
    ins = g.input_indices
    saved = {j for i in np.flatnonzero(~a.forward).tolist() for j in ins[i] if a.forward[j]}
    saved |= set(np.flatnonzero(a.backward_output).tolist())
    return [g.nodes[i].name for i in sorted(saved)]


def reference_peak(g: Graph) -> int:
    """Peak of the step with no recomputation, the scale of a fractional budget: every
    value is computed once, in the staged order the budgeted solvers schedule in, and kept
    until its last reader (seeds/001's checkpoint-all)."""
    def peak(g: Graph) -> int:
        from .solvers.stages import lifetime_matrix, schedule_from_rs, staged

        st = staged(g)
        return simulate(schedule_from_rs(st, np.eye(st.n, dtype=bool), lifetime_matrix(st))).peak_bytes

    return g._derived("reference_peak", peak)


def resolve_budget(g: Graph, budget: str | float | int) -> int:
    kind, value = parse_budget(budget)
    return int(value * reference_peak(g)) if kind == "fraction" else int(value)


def smallest_feasible(g: Graph, tried: list[BudgetResult] = ()) -> tuple[int, str]:
    """The least simulated peak among the schedules remat can build cheaply (recompute
    everything from the inputs; the baselines at their tightest) and those already tried."""
    from .solvers.baselines import BASELINES
    from .solvers.stages import schedule_from_rs, solve_r, staged

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

        from .solvers.budget import judged
        from .solvers.mincut import mincut

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


def simulate_constant(g: Graph) -> int:
    a = g._arrays
    return int(a.bytes[a.primal].sum())
