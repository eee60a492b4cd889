"""auto's staged search (the baselines when no saved set fits): planning time and the plan found
with its share of the time scale as shipped (``remat.solvers.portfolio.STAGED_SHARE`` of
``remat.solvers.deadline.SCALE``: 6 s; ``STAGED_SECONDS`` before the solvers' time constants
became shares), beside an unbounded search (100 s), on the captured graphs of
``budgets_vs_torch.py``'s models (``remat.zoo.trials.budget_case``, ``default`` size).

    python benchmarks/staged_time.py

Rows: ``benchmarks/results/staged_time.json``.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.solvers import deadline, portfolio, solve  # noqa: E402
from remat.zoo.trials import budget_case  # noqa: E402

CASES = [("gpt2", 0.4), ("cnn", 0.8), ("cnn", 0.6), ("llama", 0.4), ("t5", "min")]


def run(args) -> list[dict]:
    shipped = portfolio.STAGED_SHARE
    rows = []
    for name, budget in CASES:
        case = budget_case(name, "default", torch.float32, "cpu")
        g = remat.plan(case.model, *case.inputs, cache=False).graph
        for label, share in (("shipped", shipped), ("unbounded", 100.0 / deadline.SCALE)):
            portfolio.STAGED_SHARE = share
            t0 = time.perf_counter()
            row = {"model": name, "budget": str(budget), "staged_seconds": share * deadline.SCALE, "search": label}
            try:
                p = solve(g, "auto", budget=budget, time_limit=None)
                row.update(status="ok", solver=p.solver, predicted_s=p.predicted_seconds)
            except remat.InfeasibleBudgetError:
                row.update(status="infeasible", solver=None, predicted_s=None)
            finally:
                portfolio.STAGED_SHARE = shipped
            row["planning_s"] = time.perf_counter() - t0
            rows.append(row)
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, None, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
