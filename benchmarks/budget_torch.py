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
import copy

import torch

import remat
from remat import models as M
from remat.bench.measure import gradient_bytes, peak_memory
from remat.budgets import reference_peak, smallest_feasible
from remat.plans import _fmt_bytes
from remat.simulator import simulate


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


def loss_of(out):
    return out if out.dim() == 0 else out.float().pow(2).sum()


def measure(model, inputs, solver: str, where: float, time_limit: float) -> dict:
    reference = copy.deepcopy(model)
    loss_of(reference(*inputs)).backward()
    g = remat.plan(copy.deepcopy(model), *inputs).graph
    low, _ = smallest_feasible(g)
    high = reference_peak(g)
    budget = int(low + where * (high - low))
    plans = []
    test_model = copy.deepcopy(model)
    compiled = remat.compile(test_model, compiler="eager", budget=budget, solver=solver,
                             time_limit=time_limit, on_plan=lambda g, p: plans.append(p))

    def step():
        for p in test_model.parameters():
            p.grad = None
        loss_of(compiled(*inputs)).backward()

    step()
    err = max(float((p.grad - q.grad).abs().max())
              for p, q in zip(test_model.parameters(), reference.parameters()))
    (plan,) = plans
    sim = simulate(plan.schedule)
    held = list(test_model.parameters()) + [t for t in inputs if isinstance(t, torch.Tensor)]
    measured = peak_memory(step, held=held)
    predicted = sim.peak_bytes - sim.constant_bytes - gradient_bytes(plan.graph)
    return {"solver": f"{plan.solver} ({plan.stats.get('status')})", "low": low, "high": high,
            "budget": budget, "planned": plan.options["planned_bytes"], "simulated": sim.peak_bytes,
            "measured_total": measured.resident_before + measured.peak_bytes,
            "measured": measured.peak_bytes, "predicted": predicted, "grad_err": err}


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
        r = measure(model, inputs, solver, args.where, args.time_limit)
        ok = "yes" if r["measured_total"] <= r["budget"] else "**no**"
        print(f"| {name} | {r['solver']} | {_fmt_bytes(r['low'])} - {_fmt_bytes(r['high'])} | "
              f"{_fmt_bytes(r['budget'])} ({_fmt_bytes(r['planned'])}) | {_fmt_bytes(r['simulated'])} | "
              f"{_fmt_bytes(r['measured_total'])} | {ok} | {_fmt_bytes(r['measured'])} / "
              f"{_fmt_bytes(r['predicted'])} ({r['predicted'] / r['measured'] - 1:+.1%}) | "
              f"{r['grad_err']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
