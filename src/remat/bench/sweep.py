"""Overhead against the memory budget for every budgeted solver, seeds/001 Figure 5 (no torch).

:func:`sweep` plans a graph at each budget with each solver (through
:func:`remat.solvers.solve`, as everything else does) and records the overhead: the plan's
additive cost over the cost without recomputation. ``remat sweep`` and
``benchmarks/sweep_checkmate_graphs.py`` print it with :func:`markdown`;
:func:`remat.bench.plots.sweep_plot` draws it.
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
from rich.progress import Progress

from ..cost.model import default_cost_model
from ..errors import InfeasibleBudgetError
from ..graph.graph import Graph
from ..plans.budget import Budget, reference_peak
from ..solvers import DEFAULT_TIME_LIMIT, check_options, solve
from ..solvers.feasible import smallest_feasible

DEFAULT_SOLVERS = ("checkmate", "checkmate-lp", "checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank")


def budgets_for(g: Graph, budgets: Sequence | None = None, points: int = 8) -> list[int]:
    """Byte budgets: ``budgets`` resolved (bytes or fractions), else ``points`` budgets from
    the smallest feasible found cheaply to the peak without recomputation."""
    if budgets:
        return [Budget.parse(b).bytes_for(g) for b in budgets]
    low, _ = smallest_feasible(g)
    return [int(x) for x in np.linspace(low, reference_peak(g), points)]


def sweep(graph: Graph, budgets: Sequence[int], solvers: Sequence[str] = DEFAULT_SOLVERS,
          time_limit: float | None = DEFAULT_TIME_LIMIT, progress: bool = True) -> list[dict]:
    """One record per (budget, solver): feasible, cost, overhead, peak, status, solve time."""
    for s in solvers:
        check_options(s, {}, budget=1.0)
    base = sum(default_cost_model().op_costs(graph))
    rows = []
    with Progress(disable=not progress or not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task(f"sweeping {graph.name}", total=len(budgets) * len(solvers))
        for b in budgets:
            for s in solvers:
                try:
                    r = solve(graph, s, budget=int(b), time_limit=time_limit)
                except InfeasibleBudgetError as e:
                    r = e.plan
                rows.append({"budget": int(b), "solver": s, "feasible": r.feasible, "status": r.status,
                             "cost": r.compute_cost if r.feasible else None,
                             "overhead": (r.compute_cost / base) if r.feasible and base > 0 else None,
                             "peak_bytes": r.peak_bytes if r.feasible else None,
                             "gap": r.gap, "solve_seconds": r.solve_seconds})
                bar.advance(task)
    return rows


def markdown(graph: Graph, rows: list[dict], reference: int) -> str:
    """The sweep as a markdown table: overhead per solver (— where infeasible) by budget."""
    solvers = list(dict.fromkeys(r["solver"] for r in rows))
    budgets = list(dict.fromkeys(r["budget"] for r in rows))
    head = "| budget (MiB) | x no-recompute peak | " + " | ".join(solvers) + " |"
    lines = [f"Overhead (cost / cost without recomputation) vs budget, {graph.name}:", "", head,
             "|" + "---|" * (len(solvers) + 2)]
    by = {(r["budget"], r["solver"]): r for r in rows}
    for b in budgets:
        cells = []
        for s in solvers:
            r = by[(b, s)]
            cells.append(f"{r['overhead']:.3f}" if r["feasible"] else "—")
        lines.append(f"| {b / 2**20:.1f} | {b / reference:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
