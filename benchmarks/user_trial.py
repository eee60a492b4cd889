"""User trials on models no test names, called as a user calls them, beside PyTorch's own
memory-budget knob, under CPU inductor (one table for each; ``--model``):

- ``bloom``: BLOOM (ALiBi attention, tanh-GELU, hidden dropout 0.1).
  ``model(input_ids=ids, labels=ids).loss.backward()``: the output (logits, cache) is dropped
  as the forward returns, which remat's default memory model does not assume
  (``outputs="dropped"`` says so; BENCHMARKS.md "Steps that drop their outputs").
- ``opt``: OPT (ReLU feed-forward, learned positions, hidden dropout 0.1).
- ``phi``: Phi (attention and MLP in parallel, rotary embeddings on half of each head, residual
  dropout 0.1), stepped as a training loop that keeps the model's output until the backward ends.
- ``vit``: transformers' ``ViTForImageClassification`` (a convolutional patch embedding, so the
  forward is channels-last under inductor, then attention blocks with hidden dropout 0.1).
- ``vgg``: a small VGG-style CNN (convolution, batch norm, ReLU and 2 x 2 max pooling four
  times, then a linear classifier). On more than one thread inductor hands each max-pool
  backward to ATen's scatter-add and copies its channels-last index and source
  (:mod:`remat.capture.layouts`).

Rows: each step's measured peak above its start (profiler), remat's prediction, the measured
peak as a fraction of the activation memory remat counts, and the largest gradient difference
from the knob at 1.0 (the same dropout masks: each step seeds the generator); for opt, phi and
vit also PyTorch's own partition (``solver="torch-mincut"``) judged by remat's simulator. The
models and steps are ``remat.zoo.trials.USER_TRIALS``.

    python benchmarks/user_trial.py --model bloom|opt|phi|vit|vgg [--threads N]

Rows: ``benchmarks/results/user_trial_<model>.json``. (Until the harness these were
``bloom_trial.py``, ``opt_trial.py``, ``phi_trial.py``, ``vit_trial.py`` and ``vgg_trial.py``,
five scripts around one table.)
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.zoo.trials import USER_TRIALS  # noqa: E402

MODELS = ("bloom", "opt", "phi", "vit", "vgg")
COLUMNS = ("method", "status", "measured_bytes", "predicted_bytes", "measured_fraction", "grad_err")


def row(kind: str, budget, inputs, reference, build, make, solver: str | None = None) -> tuple[dict, list | None]:
    """A table row, and the gradients of the step: ``build()`` makes the model and
    ``make(fn, model, inputs)`` its step; ``solver``: remat's (default ``auto``)."""
    torch._dynamo.reset()
    model, plans = build(), []
    name = f"{kind} {budget}" + (f" ({solver})" if solver else "")
    r: dict = {"method": name, "kind": kind, "budget": str(budget), "solver": solver, "status": "ok"}
    if kind == "knob":
        with functorch_config.patch(activation_memory_budget=budget):
            fn = torch.compile(model)
            step = make(fn, model, inputs)
            step()
    else:
        fn = remat.compile(model, cache=False, on_plan=lambda g, p: plans.append(p),
                           **({} if budget is None else {"budget": budget}),
                           **({} if solver is None else {"solver": solver}))
        step = make(fn, model, inputs)
        try:
            step()
        except remat.InfeasibleBudgetError as e:
            r.update(status="refused", smallest_feasible_bytes=e.smallest_feasible)  # with parameters
            return r, None
    r["measured_bytes"] = harness.measure_peak(step, "cpu", keep=harness.held(model))
    grads = [p.grad.clone() for p in model.parameters()]
    if reference is not None:
        r["grad_err"] = max((g - x).abs().max().item() for g, x in zip(grads, reference))
    if plans:
        r["predicted_bytes"] = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
        r["activation_bytes"] = sum(activation_bytes(p.graph) for p in plans)
        r["measured_fraction"] = r["measured_bytes"] / r["activation_bytes"]
    return r, grads


def arguments(ap) -> None:
    ap.add_argument("--model", required=True, choices=MODELS)


def run(args):
    t = USER_TRIALS[args.model]
    args.results_stem = f"user_trial_{args.model}"
    print(f"{t.title}; threads: {torch.get_num_threads()}")
    inputs = t.inputs()
    first, reference = row("knob", 1.0, inputs, None, t.build, t.make)
    rows = [first]
    for kind, budget in [("knob", 0.6), ("knob", 0.2), ("remat", None), ("remat", 0.8), ("remat", 0.6),
                         ("remat", "min")]:
        rows.append(row(kind, budget, inputs, reference, t.build, t.make)[0])
    for solver in t.solvers:
        rows.append(row("remat", None, inputs, reference, t.build, t.make, solver)[0])
    return harness.Result(rows, {"model": args.model, "description": t.title}, columns=COLUMNS, title=args.model)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
