"""``remat demo``: the seeds' worked examples, every method side by side in one run.

For each example (cos-cos, the dropout-like mask, tanh-tanh, GeLU with erf) it compiles the
training step with PyTorch's partitioner, without recomputation, and with remat, then
measures saved tensors (autograd's saved-tensor hooks) and the median step time against
eager autograd. Times on a CPU are only ratios; the seeds' absolute numbers are from GPUs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from . import measure
from .models import SEED_EXAMPLES

METHODS = ("eager", "torch.compile", "no-recompute", "remat")


@dataclass
class DemoRow:
    example: str
    method: str
    saved_tensors: int
    saved_bytes: int
    step_ms: float
    vs_eager: float
    saved_names: list[str] | None = None


def _compiled(fn, method: str, compiler: str, plans: list):
    from .api import compile as remat_compile

    if method == "eager":
        return fn
    if method == "torch.compile":
        if compiler == "eager":  # same partitioner as torch.compile, no kernel codegen
            return remat_compile(fn, solver="torch-mincut", compiler="eager")
        return torch.compile(fn)
    solver = {"no-recompute": "no-recompute", "remat": "mincut"}[method]
    return remat_compile(fn, solver=solver, compiler=compiler, strict=True,
                         on_plan=lambda g, p: plans.append(p))


def run_demo(examples=None, numel: int = 1 << 20, repeats: int = 20, compiler: str = "inductor",
             progress=None) -> list[DemoRow]:
    """Run the demo and return its rows (one per example and method)."""
    torch.manual_seed(0)
    rows: list[DemoRow] = []
    for name in examples or SEED_EXAMPLES:
        fn, n_inputs = SEED_EXAMPLES[name]
        inputs = [torch.randn(numel, requires_grad=True) for _ in range(n_inputs)]
        steps, saved, names = {}, {}, {}
        for method in METHODS:
            if progress:
                progress(f"{name}: compiling {method}")
            plans: list = []
            compiled = _compiled(fn, method, compiler, plans)
            torch.manual_seed(1)
            saved[method] = measure.saved_tensors(lambda c=compiled: c(*inputs), held=inputs)
            steps[method] = (lambda c=compiled: c(*inputs))
            names[method] = [s.name for s in plans[0].saved_activations] if plans else None
        if progress:
            progress(f"{name}: timing {len(METHODS)} methods x {repeats} steps")
        times = measure.step_times(steps, repeats=repeats, zero=inputs)
        for method in METHODS:
            s = saved[method]
            rows.append(DemoRow(name, method, s.count, s.activation_bytes, times[method] * 1e3,
                                times[method] / times["eager"], names[method]))
    return rows


def rows_as_dicts(rows: list[DemoRow]) -> list[dict]:
    return [asdict(r) for r in rows]
