"""A user trial on a model no test names: a MobileNetV2-like CNN (inverted residuals with
depthwise convolutions, BatchNorm, ReLU6), batch 16 x 3 x 64 x 64, under CPU inductor:
``torch.compile`` with PyTorch's memory-budget knob beside ``remat.compile`` with budgets.
Rows: each step's measured peak above its start (profiler) and remat's prediction. The model
is ``remat.zoo.trials.MobileNetLike``.

    python benchmarks/mobilenet_trial.py

Rows: ``benchmarks/results/mobilenet_trial.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import contextlib  # noqa: E402
import copy  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402
from remat.zoo.trials import MobileNetLike  # noqa: E402


def arguments(ap) -> None:
    ap.set_defaults(threads=1)


def run(args) -> list[dict]:
    torch.manual_seed(0)
    base = MobileNetLike()
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))
    rows = []

    def one(label, make, ctx=contextlib.nullcontext()):
        torch._dynamo.reset()
        model, plans = copy.deepcopy(base), []
        fn = make(model, plans)

        def step():
            model.zero_grad(set_to_none=False)
            fn(x, y).backward()

        try:
            with ctx:  # the knob applies when the first step compiles
                step()
        except remat.InfeasibleBudgetError as e:
            rows.append({"method": label, "status": "refused", "smallest_feasible_bytes": e.smallest_feasible})
            return
        peak = harness.measure_peak(step, "cpu")
        pred = sum(p.peak_bytes - resident_bytes(p.graph) for p in plans) if plans else None
        rows.append({"method": label, "status": "ok", "measured_bytes": peak, "predicted_bytes": pred})

    one("torch.compile", lambda m, p: torch.compile(m))
    for b in (0.8, 0.5, 0.2):
        one(f"knob {b}", lambda m, p: torch.compile(m), functorch_config.patch(activation_memory_budget=b))
    for b in (None, 0.8, 0.6, "min"):
        kw = {} if b is None else {"budget": b}
        one(f"remat {b or 'no budget'}", lambda m, p, kw=kw: remat.compile(
            m, cache=False, on_plan=lambda g, plan: p.append(plan), **kw))
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
