"""auto's staged search (the baselines when no saved set fits): planning time and the plan found
with ``STAGED_SECONDS`` as shipped, beside an unbounded search, on the captured graphs of
``budgets_vs_torch.py``'s models.

    PYTHONPATH=src python benchmarks/staged_time.py
"""

from __future__ import annotations

import os
import sys
import time

os.environ["REMAT_CACHE_DIR"] = "off"
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import remat  # noqa: E402
from budgets_vs_torch import build  # noqa: E402
from remat.solvers import solve  # noqa: E402

AUTO = sys.modules["remat.solvers.auto"]  # the module (remat.solvers.auto is also the function)
CASES = [("gpt2", 0.4), ("cnn", 0.8), ("cnn", 0.6), ("llama", 0.4), ("t5", "min")]


def main() -> None:
    shipped = AUTO.STAGED_SECONDS
    print(f"| model | budget | STAGED_SECONDS={shipped:g}: plan, predicted s, planning s | unbounded (100 s): plan, predicted s, planning s |")
    print("|---|---|---|---|")
    for name, budget in CASES:
        case = build(name, "default", torch.float32, "cpu")
        g = remat.plan(case.model, *case.inputs, cache=False).graph
        cells = []
        for staged in (shipped, 100.0):
            AUTO.STAGED_SECONDS = staged
            t0 = time.perf_counter()
            try:
                p = solve(g, "auto", budget=budget, time_limit=None)
                cells.append(f"{p.solver}, {p.predicted_seconds:.3f}, {time.perf_counter() - t0:.1f}")
            except remat.InfeasibleBudgetError:
                cells.append(f"infeasible, -, {time.perf_counter() - t0:.1f}")
        AUTO.STAGED_SECONDS = shipped
        print(f"| {name} | {budget} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
