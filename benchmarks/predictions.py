"""Is the simulator right? Each plan's predicted peak beside its measured one.

For each model and budget: ``remat.compile(model, budget=B)`` (``none``: no budget) under the
chosen compiler, one step to plan and compile, then the step's measured peak above its start
(profiler allocation records on a CPU, the CUDA allocator on a GPU) beside the plan's
prediction (the simulator's peak less what is resident before the step), both also as
fractions of the activation memory. No step times: ``budgets_vs_torch.py`` and
``plan_order.py`` time steps. Models are ``budgets_vs_torch.py``'s ``quick`` ones, and
``gptneox``: ``benchmarks/gptneox_trial.py``'s model called as a user calls it (it returns
its logits and caches beside the loss, and the step holds them through the backward), and
``bloom``, ``opt``, ``vit`` and ``vgg`` (``benchmarks/bloom_trial.py``, ``benchmarks/opt_trial.py``,
``benchmarks/vit_trial.py``, ``benchmarks/vgg_trial.py``; not in the default list).

    PYTHONPATH=src python benchmarks/predictions.py [--models gpt2,t5,llama,qwen2,cnn,resnet18,gptneox]
        [--budgets none,0.6,min] [--compiler inductor] [--device cpu] [--threads N] [--solver auto]

``--threads`` sets torch's CPU threads (default: torch's own, 2 here): inductor's C++ code
differs with it (a scatter-add is ATen's on more than one thread), and
``budgets_vs_torch.py`` measures on one.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import argparse  # noqa: E402
import copy  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import budgets_vs_torch as bvt  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import peak_memory  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.lower.options import OUTPUTS  # noqa: E402


def _budget(text: str):
    return {} if text == "none" else {"budget": text if text == "min" else float(text)}


def model_case(name: str, device: str):
    """(model, step maker) of one model: ``make(fn, model)`` returns the step to measure."""
    ids = torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1)).to(device)
    if name == "gptneox":
        import gptneox_trial as trial

        return trial.build().to(device), lambda fn, model: trial.make(fn, model, ids, hold=True)
    if name in ("bloom", "opt"):
        trial = __import__(f"{name}_trial")

        return trial.build().to(device), lambda fn, model: trial.make(fn, model, ids)
    if name in ("vit", "vgg"):
        trial = __import__(f"{name}_trial")

        g = torch.Generator().manual_seed(1)
        inputs = (torch.randn(16, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (16,), generator=g).to(device))
        return trial.build().to(device), lambda fn, model: trial.make(fn, model, inputs)
    case = bvt.build(name, "quick", torch.float32, device)

    def make(fn, model):
        return bvt.make_step(fn, model, bvt._copy_inputs(case.inputs), "keep")
    return case.model, make


def row(name: str, budget: str, args) -> str:
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
        return f"| {name} | {budget} | infeasible (least {e.smallest_feasible:,} B) | | | | | |"
    held = list(model.parameters()) + list(model.buffers())
    measured = int(peak_memory(step, args.device, warmup=1, timeline=False, held=held).peak_bytes)
    predicted = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    act = sum(activation_bytes(p.graph) for p in plans)
    return (f"| {name} | {budget} | {measured:,} | {predicted:,} | {measured - predicted:+,} | "
            f"{measured / predicted:.4f} | {measured / act:.3f} | {predicted / act:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2,t5,llama,qwen2,cnn,resnet18,gptneox")
    ap.add_argument("--budgets", default="none,0.6,min")
    ap.add_argument("--compiler", default="inductor")
    ap.add_argument("--solver", default="auto", help="remat's solver (reorder, swap, ...: any that takes the budgets)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--outputs", default="kept", choices=OUTPUTS,
                    help="remat.compile's outputs= (bloom and opt's steps drop theirs)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| model | budget | measured (B) | predicted (B) | measured - predicted | ratio "
          "| measured fraction | predicted fraction |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for budget in args.budgets.split(","):
            print(row(name, budget, args), flush=True)


if __name__ == "__main__":
    main()
