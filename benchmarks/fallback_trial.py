"""A model remat cannot plan, with budgets: what PyTorch's partitioner and remat's fallback do.

The model: a transformer-style stack whose every block sends its MLP through ``torch.cond``
(compute skipped when the router says so: conditional computation), which remat cannot plan
(it cannot look into a higher-order op's subgraphs), so every graph falls back to PyTorch's
partitioner (:mod:`remat.lower.fallback`). Rows, one compile each (``--compiler``: remat's
eager compiler by default, or inductor), the same inputs: plain ``torch.compile`` (PyTorch's partitioner), PyTorch's knob
(``activation_memory_budget``) at 0.5 and 0.0, and ``remat.compile`` with a byte budget above
plain torch.compile's measured peak (it holds: PyTorch's partition judged on an opaque
capture), one between the knob's least and plain torch.compile's (remat lowers the knob
until the prediction fits, or refuses), one below anything PyTorch reaches (refused,
``InfeasibleBudgetError`` naming the reason), and a fraction (runs as plain torch.compile, with a
warning that it is not applied). Before issue 38 every remat row ran PyTorch's partition with
the budget dropped and at most one warning per process.

    python benchmarks/fallback_trial.py [--width 256] [--seq 256] [--batch 8] [--blocks 4]
        [--compiler eager|inductor] [--results benchmarks/results/fallback_trial_inductor.json]

Columns: the measured peak above the step's start (profiler allocation records), remat's
predicted peak above the same start where it made one, what happened (ran, refused), the
warning's gist, and the largest gradient error against eager.
"""

from __future__ import annotations

import os
import warnings

os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch._functorch import config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.bench.measure import peak_memory  # noqa: E402

COLUMNS = ("method", "budget", "outcome", "peak_MiB", "predicted_MiB", "of_plain", "grad_err", "warning")


class RoutedBlock(nn.Module):
    """Attention-free mixer block: a token MLP always, a channel MLP only where the router
    says (``torch.cond`` on the batch's mean routing score)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, 1)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.mix = nn.Linear(d, d)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.mix(h).relu()
        go = self.router(h).mean() > -1e9  # always taken, but data-dependent to the compiler

        def mlp(t):
            return self.down(nn.functional.gelu(self.up(t)))

        return x + torch.cond(go, mlp, lambda t: t * 0, (h,))


class RoutedNet(nn.Module):
    def __init__(self, d: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(RoutedBlock(d) for _ in range(blocks))
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).square().mean()


def arguments(ap) -> None:
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--compiler", choices=("eager", "inductor"), default="eager",
                    help="eager: every row without kernel codegen (PyTorch's rows through "
                         "aot_eager_decomp_partition); inductor: real kernels")


def _grads(model, fn, x):
    model.zero_grad(set_to_none=True)
    fn(x).backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


def run(args):
    torch.manual_seed(0)
    model = RoutedNet(args.width, args.blocks)
    x = torch.randn(args.batch, args.seq, args.width)
    resident = sum(p.numel() * p.element_size() for p in model.parameters()) + x.numel() * x.element_size()
    want = _grads(model, model, x)

    def measure(name, budget, make):
        torch._dynamo.reset()
        plans: list = []
        row = {"method": name, "budget": "-" if budget is None else str(budget)}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                fn = make(plans)
                got = _grads(model, fn, x)
                peak = peak_memory(lambda: _grads(model, fn, x)).peak_bytes
                row.update(outcome="ran", peak_MiB=peak / 2**20,
                           grad_err=max(float((a - b).abs().max()) for a, b in zip(got, want)))
                if plans:
                    predicted = sum(max(0, p.peak_bytes - resident) for p in plans[-1:])
                    row["predicted_MiB"] = predicted / 2**20
            except remat.InfeasibleBudgetError as e:
                text = str(e)
                row.update(outcome="refused", warning=text[text.find("does not fit"):][:160] if "does not fit" in text
                           else text[:160])
        notes = [str(w.message) for w in seen if issubclass(w.category, (remat.RematFallbackWarning,))]
        if notes and "warning" not in row:
            note = notes[0]
            row["warning"] = note[note.find("PyTorch's own partitioner runs it."):][:160]
        row["fallback_warnings"] = len(notes)
        return row

    backend = "aot_eager_decomp_partition" if args.compiler == "eager" else "inductor"
    rows = [measure("plain torch.compile", None, lambda plans: torch.compile(model, backend=backend))]
    plain = rows[0]["peak_MiB"]
    # PyTorch's knob is read when the graph is partitioned: patch it around the first call
    for value in (0.5, 0.0):
        torch._dynamo.reset()
        with functorch_config.patch(activation_memory_budget=value):
            rows.append(measure(f"PyTorch's knob {value}", None,
                                lambda plans: torch.compile(model, backend=backend)))
    least_knob = min(r["peak_MiB"] for r in rows)
    total = lambda mib: f"{(resident / 2**20 + mib):.1f}MiB"  # noqa: E731 - a byte budget bounds the whole step
    for label, budget in [("remat, bytes above plain's peak", total(1.3 * plain)),
                          ("remat, bytes between the knob's least and plain's", total((least_knob + plain) / 2)),
                          ("remat, bytes below PyTorch's least", total(0.3 * least_knob)),
                          ("remat, fraction 0.5", 0.5)]:
        rows.append(measure(label, budget, lambda plans, b=budget: remat.compile(
            model, budget=b, compiler=args.compiler, on_plan=lambda g, p: plans.append(p))))
    for r in rows:
        if r.get("peak_MiB") is not None:
            r["of_plain"] = r["peak_MiB"] / plain
    print(harness.markdown_table(rows, COLUMNS))
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
