"""Budgeted training on PyTorch: measured peak memory against the budget and the prediction.

For each model, ``remat.compile(model, budget=B, solver=S, compiler="eager")`` with B at
``--where`` between the smallest feasible budget remat finds cheaply and the
no-recomputation peak. One training step is measured with the profiler's allocation
records (CPU; the CUDA allocator with ``--device cuda``) and compared with the simulator's
prediction for the plan. Prints a Markdown table: budget, planned budget (less
``TORCH_HEADROOM``), simulated peak, measured peak (resident before the step + the step's
peak), measured / predicted peak above the step start, and the largest gradient error
against eager.

    python benchmarks/budget_torch.py [--where 0.5] [--models mlp,cnn,cnn3,gpt2]
        [--compiler eager|inductor] [--dtype float32|float64]
"""

from __future__ import annotations


import sys
import torch

from remat.zoo import registry
from remat.zoo.cnn import ConvBN
from remat.zoo.mlp import MLP
from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny
from remat.zoo.trials import WithLoss
from remat.bench.budgeted import budgeted_step
from remat.errors import InfeasibleBudgetError
from remat.plans.budget import format_bytes as _fmt_bytes
from remat.bench import harness


def cases(dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    return {
        "mlp": ("MLP (512x256, hidden 512)", MLP(d_in=256, hidden=512).to(dtype),
                (torch.randn(512, 256, dtype=dtype),), "checkmate"),
        "cnn": ("CNN + BatchNorm, 1 block (16x3x32x32)", ConvBN().to(dtype),
                (torch.randn(16, 3, 32, 32, dtype=dtype),), "checkmate"),
        "cnn2": ("CNN + BatchNorm, 2 blocks (16x3x32x32)", ConvBN(blocks=2).to(dtype),
                 (torch.randn(16, 3, 32, 32, dtype=dtype),), "auto"),
        "cnn3": ("CNN + BatchNorm, 3 blocks (16x3x32x32)", ConvBN(blocks=3).to(dtype),
                 (torch.randn(16, 3, 32, 32, dtype=dtype),), "auto"),
        "gpt2": ("GPT-2 tiny (4x64)", GPT2Loss(gpt2_tiny()).to(dtype),
                 (torch.randint(0, 256, (4, 64)),), "chen-greedy-linearized"),
    }


def arguments(ap) -> None:
    ap.add_argument("--where", type=float, default=0.5)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="mlp,cnn,cnn3,gpt2",
                    help="of mlp,cnn,cnn2,cnn3,gpt2, or any zoo model (tiny): resnet18, unet, ...")
    ap.add_argument("--compiler", default="eager", choices=("eager", "inductor"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))


def run(args):
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, where={args.where}, "
          f"compiler {args.compiler}, {args.dtype}")
    print("| model | solver | feasible range | budget (planned) | simulated peak | measured peak | "
          "within budget | measured / predicted above start | grads max err | recomputed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = cases(getattr(torch, args.dtype))
    rows = []
    for key in args.models.split(","):
        if key in table:
            name, model, inputs, solver = table[key]
        else:  # a zoo model at its tiny size, e.g. resnet18, unet
            case = registry.build(key, "tiny", dtype=getattr(torch, args.dtype))
            name, model, inputs, solver = f"{key} tiny (zoo)", WithLoss(case.model, case.loss), case.inputs, "auto"
        model = model.to(args.device)
        inputs = tuple(t.to(args.device) if isinstance(t, torch.Tensor) else t for t in inputs)
        try:
            r = budgeted_step(model, inputs, solver, args.where, time_limit=args.time_limit,
                              strict=False, device=args.device, compiler=args.compiler)
        except InfeasibleBudgetError as e:  # the solver named cannot reach what auto reaches
            print(f"| {name} | {solver} | - | infeasible: {str(e)[:160]} | - | - | - | - | - | - |", flush=True)
            rows.append({"model": name, "solver": solver, "status": "infeasible", "note": str(e)[:300]})
            continue
        ok = "yes" if r.measured_total <= r.budget else "**no**"
        print(f"| {name} | {r.plan.solver} ({r.plan.status}) | {_fmt_bytes(r.low)} - "
              f"{_fmt_bytes(r.high)} | {_fmt_bytes(r.budget)} "
              f"({_fmt_bytes(r.plan.options['planned_bytes'])}) | {_fmt_bytes(r.sim.peak_bytes)} | "
              f"{_fmt_bytes(r.measured_total)} | {ok} | {_fmt_bytes(r.measured)} / "
              f"{_fmt_bytes(r.predicted)} ({r.predicted / r.measured - 1:+.1%}) | "
              f"{r.grad_error:.1e} | {r.plan.recomputes} |", flush=True)
        rows.append({"model": name, "solver": r.plan.solver, "plan_status": str(r.plan.status), "status": "ok",
                     "low_bytes": r.low, "high_bytes": r.high, "budget_bytes": r.budget,
                     "planned_bytes": r.plan.options["planned_bytes"], "simulated_peak_bytes": r.sim.peak_bytes,
                     "measured_total_bytes": r.measured_total, "within_budget": r.measured_total <= r.budget,
                     "measured_bytes": r.measured, "predicted_bytes": r.predicted, "grad_err": r.grad_error,
                     "recomputes": r.plan.recomputes})
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
