"""Plan offline on the training graphs captured on an H100 (``benchmarks/data/h100``).

The one GPU lease this project had measured PyTorch's partitioner on GPT-2 small (batch 8 x
1024, bf16, inductor) and captured the graphs of it and of a Llama with Llama-3.2-1B's widths;
remat's own rows there fell back (``data/h100/README.md``). This script replays what can be
replayed without a GPU:

1. **memory fidelity**: the simulator's peak above the inputs and parameters for the plans
   PyTorch's knob made on the GPU (none, 0.4), op by op (every value allocated, remat's eager
   compiler) and with inductor's fused memory (``CostModel.fused_memory``), over the measured
   CUDA-allocator peak;
2. **remat under budgets**: ``solve(g, "auto", budget=B)`` with the H100 bf16 profile and fused
   memory at each budget: the plan, its predicted fraction of the activation memory and its
   predicted step time over the knob's plan without a budget, and the knob's plans beside it.

    python benchmarks/h100_graphs.py [--models gpt2,llama] [--budgets 1.0,0.8,0.6,0.4,0.3,0.2,min]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from remat.cost.model import CostModel, default_cost_model
from remat.errors import InfeasibleBudgetError
from remat.plans.budget import activation_bytes, resident_bytes
from remat.plans.plan import Plan
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.bench import h100
from remat.bench import harness

DATA = Path(__file__).parent / "data" / "h100"
MiB = float(1 << 20)


def graph(name: str):
    return h100.graph(DATA, name)


def knob_plans(name: str, g) -> dict[str, Plan]:
    return h100.knob_plans(DATA, name, g)


def measured(name: str) -> dict[str, int]:
    return h100.measured(DATA, name)


def fidelity(name: str) -> list[dict]:
    g = graph(name)
    res = resident_bytes(g)
    meas = measured(name)
    print(f"\n{name}: simulated peak above the inputs and parameters for PyTorch's plans, "
          f"over the CUDA allocator's measured peak above the step's start\n")
    print("| knob budget | measured MiB | op by op: MiB (ratio) | fused: MiB (ratio) |\n|---|---|---|---|")
    rows = []
    for b, p in knob_plans(name, g).items():
        cells = []
        row = {"table": "fidelity", "model": name, "budget": b, "measured_bytes": meas.get(b)}
        for fused in (False, True):
            r = simulate(p.schedule(), CostModel(default_cost_model(g).device, fused_memory=fused))
            above = r.peak_bytes - res
            cells.append(f"{above / MiB:.0f}" + (f" ({above / meas[b]:.2f})" if b in meas else ""))
            row["fused_bytes" if fused else "op_by_op_bytes"] = above
        m = f"{meas[b] / MiB:.0f}" if b in meas else "-"
        print(f"| {b} | {m} | {cells[0]} | {cells[1]} |")
        rows.append(row)
    return rows


def budgets(name: str, asked: list) -> list[dict]:
    g = graph(name)
    res, act = resident_bytes(g), activation_bytes(g)
    knobs = {b: p.judge() for b, p in knob_plans(name, g).items()}
    base = knobs["none"].predicted_seconds
    print(f"\n{name} ({len(g)} nodes): activation memory {act / MiB:.0f} MiB (staged reference, fused), "
          f"times over the knob's plan without a budget ({base * 1e3:.1f} ms predicted)\n")
    print("| plan | budget | solver | predicted fraction | predicted time ratio | planning s |\n|---|---|---|---|---|---|")
    rows = []
    for b, p in knobs.items():
        print(f"| knob | {b} | torch-mincut | {(p.peak_bytes - res) / act:.3f} | "
              f"{p.predicted_seconds / base:.3f} | - |")
        rows.append({"table": "budgets", "model": name, "plan": "knob", "budget": b, "solver": "torch-mincut",
                     "status": "ok", "predicted_fraction": (p.peak_bytes - res) / act,
                     "predicted_time_ratio": p.predicted_seconds / base})
    for b in asked:
        t0 = time.perf_counter()
        try:
            p = solve(g, "auto", budget=b, time_limit=60)
            print(f"| remat | {b} | {p.solver} | {(p.peak_bytes - res) / act:.3f} | "
                  f"{p.predicted_seconds / base:.3f} | {time.perf_counter() - t0:.1f} |")
            rows.append({"table": "budgets", "model": name, "plan": "remat", "budget": str(b), "solver": p.solver,
                         "status": "ok", "predicted_fraction": (p.peak_bytes - res) / act,
                         "predicted_time_ratio": p.predicted_seconds / base, "planning_s": time.perf_counter() - t0})
        except InfeasibleBudgetError as e:
            print(f"| remat | {b} | infeasible (smallest {(e.smallest_feasible - res) / act:.3f}) | - | - | "
                  f"{time.perf_counter() - t0:.1f} |")
            rows.append({"table": "budgets", "model": name, "plan": "remat", "budget": str(b), "status": "infeasible",
                         "smallest_fraction": (e.smallest_feasible - res) / act,
                         "planning_s": time.perf_counter() - t0})
    return rows


def arguments(ap) -> None:
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--budgets", default="1.0,0.8,0.6,0.4,0.3,0.2,min")


def run(args):
    asked = [b if b == "min" else float(b) for b in args.budgets.split(",")]
    rows = []
    for name in args.models.split(","):
        rows += fidelity(name)
        rows += budgets(name, asked)
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
