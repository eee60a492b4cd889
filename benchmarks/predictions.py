"""Is the simulator right? Each plan's predicted peak beside its measured one.

For each model and budget: ``remat.compile(model, budget=B)`` (``none``: no budget) under the
chosen compiler, one step to plan and compile, then the step's measured peak above its start
(profiler allocation records on a CPU, the CUDA allocator on a GPU) beside the plan's
prediction (the simulator's peak less what is resident before the step), both also as
fractions of the activation memory. No step times: ``budgets_vs_torch.py`` and
``plan_order.py`` time steps. Models (``remat.zoo.trials.model_case``) are
``budgets_vs_torch.py``'s ``quick`` ones, and ``gptneox``: the GPT-NeoX trial's model called as a
user calls it (it returns its logits and caches beside the loss, and the step holds them
through the backward), and ``bloom``, ``opt``, ``vit`` and ``vgg`` (the user trials,
``benchmarks/user_trial.py``; not in the default list). Rows:
``benchmarks/results/predictions.json``.

    python benchmarks/predictions.py [--models gpt2,t5,llama,qwen2,cnn,resnet18,gptneox]
        [--budgets none,0.6,min] [--compiler inductor] [--device cpu] [--threads N] [--solver auto]

``--threads`` sets torch's CPU threads (default: torch's own, 2 here): inductor's C++ code
differs with it (a scatter-add is ATen's on more than one thread), and
``budgets_vs_torch.py`` measures on one.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import copy  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.lower.options import OUTPUTS  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.zoo.trials import model_case  # noqa: E402

COLUMNS = ("model", "budget", "status", "measured_bytes", "predicted_bytes", "difference", "ratio",
           "measured_fraction", "predicted_fraction")


def _budget(text: str):
    return {} if text == "none" else {"budget": text if text == "min" else float(text)}


def row(name: str, budget: str, args) -> dict:
    base, make = model_case(name, args.device)
    model = copy.deepcopy(base)
    plans: list = []
    torch._dynamo.reset()
    fn = remat.compile(model, solver=args.solver, compiler=args.compiler, cache=False, dynamic=False, outputs=args.outputs,
                       on_plan=lambda g, p: plans.append(p), **_budget(budget))
    step = make(fn, model)
    try:
        step()
    except remat.InfeasibleBudgetError as e:
        return {"model": name, "budget": budget, "status": "infeasible", "smallest_feasible_bytes": e.smallest_feasible}
    measured = harness.measure_peak(step, args.device, keep=harness.held(model))
    predicted = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    act = sum(activation_bytes(p.graph) for p in plans)
    return {"model": name, "budget": budget, "status": "ok", "measured_bytes": measured, "predicted_bytes": predicted,
            "difference": measured - predicted, "ratio": measured / predicted, "measured_fraction": measured / act,
            "predicted_fraction": predicted / act, "activation_bytes": act}


def arguments(ap) -> None:
    ap.add_argument("--models", default="gpt2,t5,llama,qwen2,cnn,resnet18,gptneox")
    ap.add_argument("--budgets", default="none,0.6,min")
    ap.add_argument("--compiler", default="inductor")
    ap.add_argument("--solver", default="auto", help="remat's solver (reorder, swap, ...: any that takes the budgets)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--outputs", default="kept", choices=OUTPUTS,
                    help="remat.compile's outputs= (bloom and opt's steps drop theirs)")


def run(args):
    rows = [row(name, budget, args) for name in args.models.split(",") for budget in args.budgets.split(",")]
    return harness.Result(rows, columns=COLUMNS)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
