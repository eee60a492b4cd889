"""How the simulator ranks remat's plan without a budget beside PyTorch's own partition.

For each model, one step of ``remat.compile(model)`` (``auto``, remat's default) and one of
``remat.compile(model, solver="torch-mincut")`` (PyTorch's partition, judged by remat's
simulator) under CPU inductor; prints each plan's predicted peak above the step's start, its
predicted time and how many values it saves. Nothing is measured: ``predictions.py`` and the
trials measure. Models: ``predictions.py``'s cases.

    PYTHONPATH=src python benchmarks/partition_ranking.py [--models vit,gpt2,t5,llama,cnn,resnet18,vgg]
        [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from predictions import model_case  # noqa: E402

import remat  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402


def judged(name: str, solver: str) -> str:
    model, make = model_case(name, "cpu")
    plans: list = []
    torch._dynamo.reset()
    fn = remat.compile(model, cache=False, solver=solver, on_plan=lambda g, p: plans.append(p))
    make(fn, model)()
    p = plans[0]
    return f"{p.peak_bytes - resident_bytes(p.graph):,}, {p.predicted_seconds * 1e3:.2f} ms, {len(p.saved_names)} saved"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="vit,gpt2,t5,llama,cnn,resnet18,vgg")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | remat without a budget: predicted peak, time | PyTorch's partition |")
    print("|---|---|---|")
    for name in args.models.split(","):
        print(f"| {name} | {judged(name, 'auto')} | {judged(name, 'torch-mincut')} |", flush=True)


if __name__ == "__main__":
    main()
