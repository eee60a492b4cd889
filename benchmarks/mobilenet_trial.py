"""A user trial on a model no test names: a MobileNetV2-like CNN (inverted residuals with
depthwise convolutions, BatchNorm, ReLU6), batch 16 x 3 x 64 x 64, under CPU inductor:
``torch.compile`` with PyTorch's memory-budget knob beside ``remat.compile`` with budgets.
Prints each step's measured peak above its start (profiler) and remat's prediction.

    PYTHONPATH=src python benchmarks/mobilenet_trial.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import contextlib  # noqa: E402
import copy  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from torch import nn  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import peak_memory  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402


class InvertedResidual(nn.Module):
    def __init__(self, c: int, expand: int = 4) -> None:
        super().__init__()
        h = c * expand
        self.f = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.f(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU6())
        self.body = nn.Sequential(*[InvertedResidual(16) for _ in range(4)])
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.body(self.stem(x)).mean((2, 3))), y)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = Net()
    x, y = torch.randn(16, 3, 64, 64), torch.randint(0, 10, (16,))

    def run(label, make, ctx=contextlib.nullcontext()):
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
            print(f"| {label} | refused (least {e.smallest_feasible:,} B with parameters) | |")
            return
        peak = peak_memory(step, "cpu", warmup=1, timeline=False).peak_bytes
        pred = f"{sum(p.peak_bytes - resident_bytes(p.graph) for p in plans):,}" if plans else ""
        print(f"| {label} | {peak:,} | {pred} |", flush=True)

    print("| method | measured (B) | predicted (B) |")
    print("|---|---|---|")
    run("torch.compile", lambda m, p: torch.compile(m))
    for b in (0.8, 0.5, 0.2):
        run(f"knob {b}", lambda m, p: torch.compile(m), functorch_config.patch(activation_memory_budget=b))
    for b in (None, 0.8, 0.6, "min"):
        kw = {} if b is None else {"budget": b}
        run(f"remat {b or 'no budget'}", lambda m, p, kw=kw: remat.compile(
            m, cache=False, on_plan=lambda g, plan: p.append(plan), **kw))


if __name__ == "__main__":
    main()
