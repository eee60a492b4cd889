"""Budgeted training on PyTorch: measured peak memory against the budget and the prediction.

For each model, ``remat.compile(model, budget=B, solver=S, compiler="eager")`` with B at
``--where`` between the smallest feasible budget remat finds cheaply and the
no-recomputation peak. One training step is measured with the profiler's allocation
records (CPU; the CUDA allocator with ``--device cuda``) and compared with the simulator's
prediction for the plan. Prints a Markdown table: budget, planned budget (less
``TORCH_HEADROOM``), simulated peak, measured peak (resident before the step + the step's
peak), measured / predicted peak above the step start, and the largest gradient error
against eager.

    PYTHONPATH=src python benchmarks/budget_torch.py [--where 0.5] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch

from remat import models as M
from remat.bench.budgeted import budgeted_step
from remat.plans import _fmt_bytes


def cases(device: str) -> dict:
    torch.manual_seed(0)
    d = torch.device(device)
    return {
        "MLP (512x256, hidden 512)": (M.MLP(d_in=256, hidden=512), (torch.randn(512, 256),), "checkmate"),
        "CNN + BatchNorm, 1 block (16x3x32x32)": (M.ConvBN(), (torch.randn(16, 3, 32, 32),), "checkmate"),
        "CNN + BatchNorm, 3 blocks (16x3x32x32)": (M.ConvBN(blocks=3), (torch.randn(16, 3, 32, 32),),
                                                   "auto"),
        "GPT-2 tiny (4x64)": (M.GPT2Loss(M.gpt2_tiny()), (torch.randint(0, 256, (4, 64)),),
                              "chen-greedy-linearized"),
    } if d.type == "cpu" else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--where", type=float, default=0.5)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, where={args.where}")
    print("| model | solver | feasible range | budget (planned) | simulated peak | measured peak | "
          "within budget | measured / predicted above start | grads max err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (model, inputs, solver) in cases(args.device).items():
        r = budgeted_step(model, inputs, solver, args.where, time_limit=args.time_limit,
                          strict=False, device=args.device)
        ok = "yes" if r.measured_total <= r.budget else "**no**"
        print(f"| {name} | {r.plan.solver} ({r.plan.stats.get('status')}) | {_fmt_bytes(r.low)} - "
              f"{_fmt_bytes(r.high)} | {_fmt_bytes(r.budget)} "
              f"({_fmt_bytes(r.plan.options['planned_bytes'])}) | {_fmt_bytes(r.sim.peak_bytes)} | "
              f"{_fmt_bytes(r.measured_total)} | {ok} | {_fmt_bytes(r.measured)} / "
              f"{_fmt_bytes(r.predicted)} ({r.predicted / r.measured - 1:+.1%}) | "
              f"{r.grad_error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
