"""How the simulator ranks remat's plan without a budget beside PyTorch's own partition.

For each model, one step of ``remat.compile(model)`` (``auto``, remat's default) and one of
``remat.compile(model, solver="torch-mincut")`` (PyTorch's partition, judged by remat's
simulator) under CPU inductor; prints each plan's predicted peak above the step's start, its
predicted time and how many values it saves. Nothing is measured: ``predictions.py`` and the
trials measure. Models: ``remat.zoo.trials.model_case`` (``predictions.py``'s cases). Rows:
``benchmarks/results/partition_ranking.json``.

    python benchmarks/partition_ranking.py [--models vit,gpt2,t5,llama,cnn,resnet18,vgg]
        [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402
from remat.zoo.trials import model_case  # noqa: E402


def judged(name: str, solver: str) -> dict:
    model, make = model_case(name, "cpu")
    plans: list = []
    torch._dynamo.reset()
    fn = remat.compile(model, cache=False, solver=solver, on_plan=lambda g, p: plans.append(p))
    make(fn, model)()
    p = plans[0]
    return {"model": name, "solver": solver, "predicted_peak_bytes": p.peak_bytes - resident_bytes(p.graph),
            "predicted_ms": p.predicted_seconds * 1e3, "saved": len(p.saved_names)}


def arguments(ap) -> None:
    ap.add_argument("--models", default="vit,gpt2,t5,llama,cnn,resnet18,vgg")
    ap.set_defaults(threads=2)


def run(args) -> list[dict]:
    return [judged(name, solver) for name in args.models.split(",") for solver in ("auto", "torch-mincut")]


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
