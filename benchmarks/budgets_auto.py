"""``auto`` under budgets on captured zoo graphs: which plan, what peak, what time, how long.

For each model, the joint graph is captured (``remat.plan``), the fusion-aware frontier is
computed, and ``remat.solve(g, "auto", budget=B)`` runs for each budget. "act" is the simulated
peak above the resident bytes over the activation memory (what a fractional budget is of);
"time" is the predicted step time over the plan without a budget. Prints a Markdown table.

    python benchmarks/budgets_auto.py [--models gpt2:small,unet:tiny,resnet18:tiny,gpt2:tiny]
"""

from __future__ import annotations

import sys
import time

import remat
from remat.errors import InfeasibleBudgetError
from remat.plans.budget import activation_bytes, resident_bytes
from remat.solvers.mincut.frontier import frontier
from remat.zoo import registry
from remat.bench import harness

BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, "min")


def arguments(ap) -> None:
    ap.add_argument("--models", default="gpt2:small,unet:tiny,resnet18:tiny,gpt2:tiny")


def run(args):
    print("| graph | frontier | " + " | ".join(map(str, BUDGETS)) + " |")
    print("|---" * (len(BUDGETS) + 2) + "|")
    rows = []
    for spec in args.models.split(","):
        name, size = spec.split(":")
        case = registry.build(name, size)
        g = remat.plan(lambda *xs: case.loss(case.model(*xs)), *case.inputs, cache=False).graph
        t0 = time.perf_counter()
        points = frontier(g)
        t_frontier = time.perf_counter() - t0
        resident, act = resident_bytes(g), activation_bytes(g)
        base = remat.solve(g, "auto")
        cells = []
        for b in BUDGETS:
            t0 = time.perf_counter()
            row = {"model": name, "size": size, "nodes": len(g), "frontier_points": len(points),
                   "frontier_s": t_frontier, "budget": str(b)}
            try:
                p = remat.solve(g, "auto", budget=b)
            except InfeasibleBudgetError as e:
                cells.append(f"infeasible, least {(e.smallest_feasible - resident) / act:.2f} "
                             f"({time.perf_counter() - t0:.1f} s)")
                rows.append({**row, "status": "infeasible",
                             "least_fraction": (e.smallest_feasible - resident) / act,
                             "solve_s": time.perf_counter() - t0})
                continue
            cells.append(f"{p.solver} {(p.peak_bytes - resident) / act:.2f}, "
                         f"{p.predicted_seconds / base.predicted_seconds:.3f}x "
                         f"({time.perf_counter() - t0:.1f} s)")
            rows.append({**row, "status": "ok", "solver": p.solver, "fraction": (p.peak_bytes - resident) / act,
                         "time_ratio": p.predicted_seconds / base.predicted_seconds,
                         "solve_s": time.perf_counter() - t0})
        print(f"| {name} {size} ({len(g)} nodes) | {len(points)} points, {t_frontier:.2f} s | "
              + " | ".join(cells) + " |", flush=True)
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
