"""A user trial on a model no test names: GPT-NeoX (Pythia-like: parallel residual, rotary),
called as a user calls it, beside PyTorch's own memory-budget knob, under CPU inductor.

``model(input_ids=ids, labels=ids)`` returns the logits and the key/value caches beside the
loss, so the compiled graph has outputs the loss does not use. By default the step drops the
output before the backward (``model(...).loss.backward()``); ``--hold-outputs`` keeps it
through the backward (``out = model(...); out.loss.backward()``), as most training loops do.
Rows: measured peaks above the step's start (profiler), remat's prediction, and step-time
medians from one alternating loop; remat's gradients against eager. The model and step are
``remat.zoo.trials.USER_TRIALS["gptneox"]``.

    python benchmarks/gptneox_trial.py [--hold-outputs] [--repeats 5]

Rows: ``benchmarks/results/gptneox_trial.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.bench.measure import step_time  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402
from remat.zoo.trials import gptneox as build, gptneox_step as make, token_ids  # noqa: E402

COLUMNS = ("method", "status", "peak_bytes", "predicted_bytes", "fraction", "step_ms", "time_ratio", "grad_err")
BASE = "torch.compile (no budget)"


def arguments(ap) -> None:
    ap.add_argument("--hold-outputs", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.set_defaults(threads=1)


def run(args):
    ids = token_ids()
    reference = build()
    reference(input_ids=ids, labels=ids).loss.backward()
    ref_grads = [p.grad.clone() for p in reference.parameters()]
    rows: dict[str, dict] = {}
    steps: dict = {}

    def add(label, fn, model, **extra):
        step = make(fn, model, ids, args.hold_outputs)
        step()
        steps[label] = step
        rows[label] = {"method": label, "status": "ok", "peak_bytes": harness.measure_peak(step, "cpu"), **extra}

    torch._dynamo.reset()
    m = build()
    add(BASE, torch.compile(m), m)
    for b in (0.8, 0.6, 0.4):
        torch._dynamo.reset()
        m = build()
        with functorch_config.patch(activation_memory_budget=b):
            add(f"knob {b}", torch.compile(m), m)
    refused = []
    for b in (None, 0.8, 0.6, 0.4, "min"):
        torch._dynamo.reset()
        m, plans = build(), []
        try:
            fn = remat.compile(m, budget=b, on_plan=lambda g, p: plans.append(p))
            make(fn, m, ids, args.hold_outputs)()
        except remat.InfeasibleBudgetError as e:
            refused.append({"method": f"remat {b}", "status": "infeasible",
                            "smallest_feasible_bytes": e.smallest_feasible})  # with parameters
            continue
        err = max((p.grad - r).abs().max().item() for p, r in zip(m.parameters(), ref_grads))
        add(f"remat {b}", fn, m, grad_err=err)
        rows[f"remat {b}"]["predicted_bytes"] = sum(p.peak_bytes - resident_bytes(p.graph) for p in plans)
    times = step_time(steps, repeats=args.repeats, warmup=1, device="cpu")
    base_peak, base_time = rows[BASE]["peak_bytes"], times[BASE].median_s
    for k, r in rows.items():
        r.update(fraction=r["peak_bytes"] / base_peak, step_ms=times[k].median_s * 1e3,
                 time_ratio=times[k].median_s / base_time)
    return harness.Result(list(rows.values()) + refused, {"hold_outputs": args.hold_outputs}, columns=COLUMNS)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
