"""A user trial on a model no test names: BLOOM (ALiBi attention, tanh-GELU, hidden dropout
0.1), called as a user calls it, beside PyTorch's own memory-budget knob, under CPU inductor.

``model(input_ids=ids, labels=ids).loss.backward()``: the output (logits, cache) is dropped as
the forward returns, which remat's default memory model does not assume (``outputs="dropped"``
says so; BENCHMARKS.md "Steps that drop their outputs"). Prints each
step's measured peak above its start (profiler), remat's prediction, the measured peak as a
fraction of the activation memory remat counts, and the largest gradient difference from
the knob at 1.0 (the same dropout masks: each step seeds the generator).

    PYTHONPATH=src python benchmarks/bloom_trial.py [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import argparse  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from transformers import BloomConfig, BloomForCausalLM  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import peak_memory  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = BloomConfig(vocab_size=1024, hidden_size=128, n_layer=3, n_head=4, hidden_dropout=0.1,
                      attention_dropout=0.0)
    return BloomForCausalLM(cfg).train()


def make(fn, model, ids):
    return seeded_step(model, lambda: fn(input_ids=ids, labels=ids).loss)


def seeded_step(model, loss):
    """A training step: gradients zeroed, the generator seeded (every method draws the same
    dropout masks), ``loss()`` computed and its backward run. ``loss()`` may return the model's
    output instead (its ``.loss`` is run): the step then holds that output through the
    backward, as a loop that reads ``out.logits`` does."""
    def step():
        model.zero_grad(set_to_none=False)
        torch.manual_seed(3)
        out = loss()
        getattr(out, "loss", out).backward()
    return step


def row(kind: str, budget, ids, reference, build=build, make=make, solver: str | None = None):
    """A table row, and the gradients of the step: ``build()`` makes the model and
    ``make(fn, model, ids)`` its step (another trial passes its own); ``solver``: remat's
    (default ``auto``)."""
    torch._dynamo.reset()
    model, plans = build(), []
    if kind == "knob":
        with functorch_config.patch(activation_memory_budget=budget):
            fn = torch.compile(model)
            step = make(fn, model, ids)
            step()
    else:
        fn = remat.compile(model, cache=False, on_plan=lambda g, p: plans.append(p),
                           **({} if budget is None else {"budget": budget}),
                           **({} if solver is None else {"solver": solver}))
        step = make(fn, model, ids)
        try:
            step()
        except remat.InfeasibleBudgetError as e:
            return f"| remat {budget} | refused, least {e.smallest_feasible:,} B with parameters | | | |", None
    held = list(model.parameters()) + list(model.buffers())
    measured = int(peak_memory(step, "cpu", warmup=1, timeline=False, held=held).peak_bytes)
    grads = [p.grad.clone() for p in model.parameters()]
    err = "" if reference is None else \
        f"{max((g - r).abs().max().item() for g, r in zip(grads, reference)):.1e}"
    if not plans:
        return f"| {kind} {budget} | {measured:,} | | | {err} |", grads
    predicted = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    act = sum(activation_bytes(p.graph) for p in plans)
    name = f"{kind} {budget}" + (f" ({solver})" if solver else "")
    return f"| {name} | {measured:,} | {predicted:,} | {measured / act:.3f} | {err} |", grads


def table(ids, build=build, make=make, doc: str | None = None, solvers: tuple[str, ...] = ()) -> None:
    """The trial's table for the model ``build()`` makes, stepped by ``make`` on ``ids``; a row
    without a budget for each of remat's ``solvers`` besides ``auto``."""
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"threads: {torch.get_num_threads()}")
    print("| method | measured (B) | predicted (B) | measured / activation | gradient error vs knob 1.0 |")
    print("|---|---|---|---|---|")
    text, reference = row("knob", 1.0, ids, None, build, make)
    print(text, flush=True)
    for kind, budget in [("knob", 0.6), ("knob", 0.2), ("remat", None), ("remat", 0.8), ("remat", 0.6),
                         ("remat", "min")]:
        print(row(kind, budget, ids, reference, build, make)[0], flush=True)
    for solver in solvers:
        print(row("remat", None, ids, reference, build, make, solver)[0], flush=True)


def main() -> None:
    table(torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1)))


if __name__ == "__main__":
    main()
