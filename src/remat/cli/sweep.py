"""The budgeted commands: ``remat plan GRAPH --budget B --solver S`` and ``remat sweep GRAPH``.

``sweep`` runs every budgeted solver over a range of budgets and prints the overhead
(cost / cost with no recomputation) against the budget, seeds/001 Figure 5; ``--plot``
draws it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT_SWEEP_SOLVERS = ("checkmate", "checkmate-lp", "checkpoint-all", "chen-sqrtn", "chen-greedy",
                         "griewank")


def sweep(graph, budgets: list[int], solvers: list[str], time_limit: float | None,
          progress: bool = True) -> list[dict]:
    """One record per (budget, solver): feasible, cost, overhead, peak, status, solve time."""
    from rich.progress import Progress

    from ..solvers.auto import budget_solvers
    from ..cost.model import default_cost_model

    table = budget_solvers()
    unknown = [s for s in solvers if s not in table]
    if unknown:
        raise SystemExit(f"remat sweep: unknown solvers {unknown}; choose from {sorted(table)}")
    base = sum(default_cost_model().op_costs(graph))
    rows = []
    with Progress(disable=not progress or not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task(f"sweeping {graph.name}", total=len(budgets) * len(solvers))
        for b in budgets:
            for s in solvers:
                kwargs = {"time_limit": time_limit} if s in ("checkmate", "checkmate-lp") else {}
                r = table[s](graph, b, **kwargs)
                rows.append({"budget": int(b), "solver": s, "feasible": r.feasible, "status": r.status,
                             "cost": r.cost if r.feasible else None,
                             "overhead": (r.cost / base) if r.feasible and base > 0 else None,
                             "peak_bytes": r.peak_bytes if r.feasible else None,
                             "gap": r.gap, "solve_seconds": r.solve_seconds})
                bar.advance(task)
    return rows


def sweep_markdown(graph, rows: list[dict], reference: int) -> str:
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


def plot_sweep(graph, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for s in dict.fromkeys(r["solver"] for r in rows):
        pts = [(r["budget"] / 2**30, r["overhead"]) for r in rows if r["solver"] == s and r["feasible"]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=s, linewidth=1.5 if s.startswith("checkmate") else 1)
    ax.set_xlabel("memory budget (GiB)")
    ax.set_ylabel("overhead (x cost without recomputation)")
    ax.set_title(f"{graph.name}: overhead vs budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_sweep(args) -> int:
    import numpy as np

    from ..plans.budget import reference_peak, resolve_budget
    from ..solvers.auto import smallest_feasible
    from ..graph.io import load_graph

    graph = load_graph(args.graph)
    reference = reference_peak(graph)
    if args.budgets:
        budgets = [resolve_budget(graph, b) for b in args.budgets.split(",")]
    else:
        low, _ = smallest_feasible(graph)
        budgets = [int(x) for x in np.linspace(low, reference, args.points)]
    solvers = args.solvers.split(",") if args.solvers else list(DEFAULT_SWEEP_SOLVERS)
    rows = sweep(graph, budgets, solvers, args.time_limit, progress=not args.json)
    if args.json:
        print(json.dumps({"graph": graph.name, "reference_peak": reference, "rows": rows}, indent=1))
    else:
        print(sweep_markdown(graph, rows, reference))
    if args.plot:
        path = Path(args.plot)
        plot_sweep(graph, rows, path)
        print(f"plot written to {path}", file=sys.stderr)
    return 0


def add_parsers(sub, plan_parser) -> None:
    """Add ``--budget``/``--time-limit`` to ``remat plan`` and the ``sweep`` command."""
    plan_parser.add_argument("--budget", default=None,
                             help="peak-memory budget: bytes with a unit ('6GiB', '512MB', 1e9) or a "
                                  "fraction of the no-recomputation peak (0.6)")
    plan_parser.add_argument("--time-limit", type=float, default=None, help="solver time limit (s)")
    s = sub.add_parser("sweep", help="overhead vs memory budget for every budgeted solver (seeds/001 Fig. 5)")
    s.add_argument("graph", help="graph file: remat.graph JSON or Checkmate node-link JSON")
    s.add_argument("--budgets", default=None,
                   help="comma-separated budgets (bytes with units or fractions); default: --points "
                        "budgets from the smallest feasible found to the no-recomputation peak")
    s.add_argument("--points", type=int, default=8)
    s.add_argument("--solvers", default=None, help=f"comma-separated (default {','.join(DEFAULT_SWEEP_SOLVERS)})")
    s.add_argument("--time-limit", type=float, default=60.0, help="per-solve limit for the MILP/LP (s)")
    s.add_argument("--plot", default=None, help="write the overhead-vs-budget plot to this PNG")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sweep)
