"""User trial (issue 12): fission and the search on models no test names, beside PyTorch's own.

``--model mixer``: an MLP-Mixer written for this trial (patch tokens x channels; token-mixing
MLPs across a transpose, channel-mixing MLPs, LayerNorm), batch 64 x 64 tokens x 128
channels. ``--model mlp``: three linear layers on a batch of 1,024 with a sum-of-squares
loss, where activations dominate and a region can hold the whole step. Each method runs on its own copy of the model from the same weights:

- ``no-recompute``: PyTorch's ``default_partition`` (the reference: peak and time ratios);
- ``torch knob 0.5``: PyTorch's partitioner with ``activation_memory_budget = 0.5``;
- ``remat auto 0.5``: ``remat.compile(model, budget=0.5)``;
- ``remat magis 0.5``: ``remat.compile(model, solver="magis", budget=0.5)``;
- ``remat +10%``: ``remat.compile(model, max_overhead=0.10)`` (least memory within 10% more
  predicted time);
- ``remat auto min`` / ``remat magis min, no fission`` / ``remat magis min``: the least memory
  each reaches (``budget="min"``).

Prints per method: the measured peak above the step's start (profiler allocation records),
as a share of no-recompute's; the step time over no-recompute's (median of alternating
rounds); the plan's predicted peak share; its fissions; the gradients' largest difference from
eager autograd.

    python benchmarks/magis_trial.py [--model mixer|mlp] [--batch N] [--repeats 5]
        [--compiler inductor|eager]
"""

from __future__ import annotations

import sys
import copy
import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import peak_memory, step_time  # noqa: E402
from remat.zoo.trials import Mixer, WideMLP  # noqa: E402
from remat.bench import harness  # noqa: E402


def arguments(ap) -> None:
    ap.add_argument("--model", default="mixer", choices=["mixer", "mlp"])
    ap.add_argument("--batch", type=int, default=None, help="default 64 (mixer), 1024 (mlp)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    ap.add_argument("--time-limit", type=float, default=30.0)


def run(args):
    torch.manual_seed(0)
    if args.model == "mixer":
        batch = args.batch or 64
        ref, inputs = Mixer(), (torch.randn(batch, 64, 48), torch.randint(0, 10, (batch,)))
    else:
        batch = args.batch or 1024
        ref, inputs = WideMLP(), (torch.randn(batch, 64), torch.randint(0, 8, (batch,)))
    ref(*inputs).backward()
    eager = [p.grad.clone() for p in ref.parameters()]

    methods = {
        "no-recompute": dict(solver="no-recompute"),
        "torch knob 0.5": dict(solver="torch-mincut", knob=0.5),
        "remat auto 0.5": dict(budget=0.5),
        "remat magis 0.5": dict(solver="magis", budget=0.5),
        "remat +10%": dict(max_overhead=0.10),
        "remat auto min": dict(budget="min"),
        "remat magis min, no fission": dict(solver="magis", budget="min", solver_options={"fission": False}),
        "remat magis min": dict(solver="magis", budget="min"),
    }
    steps, rows = {}, {}
    for name, kw in methods.items():
        torch._dynamo.reset()
        model = copy.deepcopy(ref)
        model.zero_grad(set_to_none=True)
        plans = []
        knob = kw.pop("knob", None)
        compiled = remat.compile(model, compiler=args.compiler, cache=False, time_limit=args.time_limit,
                                 on_plan=lambda g, p, plans=plans: plans.append(p), **kw)

        def step(compiled=compiled, model=model):
            model.zero_grad(set_to_none=False)
            compiled(*inputs).backward()

        try:
            if knob is not None:
                with functorch_config.patch(activation_memory_budget=knob,
                                            activation_memory_budget_solver="dp"):
                    step()
            else:
                step()
        except remat.InfeasibleBudgetError as e:
            rows[name] = {"status": f"infeasible (smallest {e.smallest_feasible:,} B)"}
            continue
        err = max(float((p.grad - e).abs().max()) for p, e in zip(model.parameters(), eager))
        pm = peak_memory(step, warmup=1, timeline=False)
        fis = [f"{len(f.nodes)} nodes / {f.n}" for p in plans for f in p.fissions]
        predicted = sum(p.peak_bytes for p in plans if p.peak_bytes is not None)
        rows[name] = {"status": "ok", "peak": pm.peak_bytes, "grad_err": err, "fissions": fis,
                      "predicted_peak": predicted, "plan_s": sum(p.solve_seconds for p in plans)}
        steps[name] = step
    times = step_time(steps, repeats=args.repeats, warmup=1)
    base = rows["no-recompute"]["peak"]
    t0 = times["no-recompute"].median_s
    print(f"{type(ref).__name__}, batch {batch}, {args.compiler}, CPU; ratios to no-recompute")
    print("| method | peak | time | plan s | fissions | grad err |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        if r["status"] != "ok":
            print(f"| {name} | {r['status']} | | | | |")
            continue
        print(f"| {name} | {r['peak'] / base:.3f} | {times[name].median_s / t0:.3f} | {r['plan_s']:.1f} | "
              f"{', '.join(r['fissions']) or '-'} | {r['grad_err']:.1e} |")
        r.update(peak_ratio=r["peak"] / base, time_ratio=times[name].median_s / t0, step_ms=times[name].median_s * 1e3)
    return harness.Result([{"method": k, **v} for k, v in rows.items()],
                          {"model": type(ref).__name__, "batch": batch}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
