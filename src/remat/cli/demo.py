"""``remat demo``: the seeds' worked examples, every method side by side in one run.

For each example (cos-cos, the dropout-like mask, tanh-tanh, GeLU with erf) it compiles the
training step with PyTorch's partitioner, without recomputation, and with remat, then
measures saved tensors (autograd's saved-tensor hooks) and the median step time against
eager autograd. Times on a CPU are only ratios; the seeds' absolute numbers are from GPUs.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

import torch
from rich.console import Console
from rich.table import Table

from ..api import compile as remat_compile
from ..bench.measure import graph_caches_off, saved_activation_bytes, step_time
from ..plans.budget import format_bytes
from ..zoo.patterns import SEED_EXAMPLES

METHODS = ("eager", "torch-mincut", "no-recompute", "mincut-conservative")
"""Plain autograd, then ``remat.compile`` with each solver: PyTorch's partitioner, PyTorch's
``default_partition`` (no recomputation) and remat's default (the conservative min cut)."""
REMAT = METHODS[-1]


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
    if method == "eager":
        return fn
    return remat_compile(fn, solver=method, compiler=compiler, strict=True,
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

            def step(c=compiled):
                for x in inputs:
                    x.grad = None
                c(*inputs).sum().backward()

            with graph_caches_off():  # the first step compiles: plan it, even on a second run
                saved[method] = saved_activation_bytes(step, held=inputs)
            steps[method] = step
            names[method] = [s.name for s in plans[0].saved_activations] if plans else None
        if progress:
            progress(f"{name}: timing {len(METHODS)} methods x {repeats} steps")
        times = {k: t.median_s for k, t in step_time(steps, repeats=repeats, warmup=3).items()}
        for method in METHODS:
            s = saved[method]
            rows.append(DemoRow(name, method, s.count, s.activation_bytes, times[method] * 1e3,
                                times[method] / times["eager"], names[method]))
    return rows


def rows_as_dicts(rows: list[DemoRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def run(args) -> int:
    console = Console(stderr=True)
    examples = args.examples or list(SEED_EXAMPLES)  # checked by remat.cli.checks
    with console.status("starting") as status:
        rows = run_demo(examples, numel=args.numel, repeats=args.repeats, compiler=args.compiler,
                        progress=lambda msg: status.update(msg))
    if args.json:
        print(json.dumps(rows_as_dicts(rows), indent=1))
        return 0
    table = Table(title=f"remat demo: seeds' examples, {args.numel} float32 elements per input, "
                        f"median of {args.repeats} CPU steps (compiler: {args.compiler})")
    for col in ("example", "method", "saved tensors", "saved bytes", "step ms", "time vs eager", "remat saves"):
        table.add_column(col, justify="left" if col in ("example", "method", "remat saves") else "right")
    for r in rows:
        table.add_row(r.example if r.method == METHODS[0] else "", r.method, str(r.saved_tensors),
                      format_bytes(r.saved_bytes), f"{r.step_ms:.2f}", f"{r.vs_eager:.2f}x",
                      ", ".join(r.saved_names) if r.method == REMAT and r.saved_names is not None else "",
                      end_section=r.method == METHODS[-1])
    Console(width=None if sys.stdout.isatty() else 130).print(table)
    return 0
