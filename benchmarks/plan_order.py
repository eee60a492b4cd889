"""What keeping inductor to a budgeted plan's order (``remat.lower.plan_order``) costs and saves.

For each model and budget, two copies of the same model and inputs compiled with
``remat.compile(model, budget=B)`` under inductor: ``plan order`` as remat ships it (only near
kernels fuse, late ``addmm`` fusions split back, no buffer held for reuse), and ``inductor's
order`` with all three left out (inductor compiles as it would on its own). Measured:
peak above the step's start (profiler allocation records on a CPU, the CUDA allocator on a
GPU), the plan's predicted peak, the fraction of PyTorch's no-recompute measured peak (its own
row: the reference, measured and predicted), and
step-time medians from one alternating loop (``remat.bench.measure.step_time``).

    python benchmarks/plan_order.py [--models qwen2,llama,t5] [--budgets 0.6,min,none]
        [--repeats 10] [--device cpu]

Models and sizes are ``remat.zoo.trials.budget_case``'s ``quick`` ones (those of
``budgets_vs_torch.py``). Rows: ``benchmarks/results/plan_order.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import contextlib  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch._dynamo.config as dynamo_config  # noqa: E402

import remat  # noqa: E402
import remat.lower.backend as backend  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.bench.measure import step_time  # noqa: E402
from remat.errors import InfeasibleBudgetError  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402
from remat.zoo.trials import budget_case  # noqa: E402

COLUMNS = ("model", "budget", "order", "peak_bytes", "predicted_bytes", "measured_over_predicted",
           "fraction_of_no_recompute", "step_ms", "status")


@contextlib.contextmanager
def _inductor_order():
    """Compile as inductor would on its own: no fusion veto, no addmm split, buffer reuse."""
    saved = backend.in_plan_order
    backend.in_plan_order = lambda: contextlib.nullcontext()
    try:
        yield
    finally:
        backend.in_plan_order = saved


def _variant(name: str, budget, device: str, inductor_order: bool, solver: str = "auto"):
    case = budget_case(name, "quick", torch.float32, device)
    plans = []
    fn = remat.compile(case.model, solver=solver, budget=budget, cache=False,
                       on_plan=lambda g, p: plans.append(p))
    step = harness.make_step(fn, case.model, case.inputs, "keep")
    with _inductor_order() if inductor_order else contextlib.nullcontext():
        step()  # compiles the forward and the backward
    peak = harness.measure_peak(step, device)
    predicted = sum(p.peak_bytes - resident_bytes(p.graph) for p in plans)
    return step, peak, predicted


def arguments(ap) -> None:
    ap.add_argument("--models", default="qwen2,llama,t5")
    ap.add_argument("--budgets", default="0.6")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.set_defaults(threads=1)


def run(args) -> list[dict]:
    dynamo_config.recompile_limit = 64
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} thread(s), inductor")
    rows = []
    for name in args.models.split(","):
        _, reference, ref_predicted = _variant(name, None, args.device, False, solver="no-recompute")
        rows.append({"model": name, "budget": "-", "order": "PyTorch's no-recompute (the reference)",
                     "peak_bytes": reference, "predicted_bytes": ref_predicted,
                     "measured_over_predicted": reference / ref_predicted, "fraction_of_no_recompute": 1.0,
                     "step_ms": None, "status": "ok"})
        for b in args.budgets.split(","):
            budget = None if b == "none" else b if b == "min" else float(b)
            try:
                runs = {label: _variant(name, budget, args.device, off)
                        for label, off in (("plan order", False), ("inductor's order", True))}
            except InfeasibleBudgetError as e:
                rows.append({"model": name, "budget": str(budget), "order": "-", "status": "infeasible",
                             "smallest_feasible_bytes": e.smallest_feasible})
                continue
            times = step_time({k: v[0] for k, v in runs.items()}, repeats=args.repeats, warmup=2,
                              device=args.device)
            for label, (_, peak, predicted) in runs.items():
                rows.append({"model": name, "budget": str(budget), "order": label, "peak_bytes": peak,
                             "predicted_bytes": predicted, "measured_over_predicted": peak / predicted,
                             "fraction_of_no_recompute": peak / reference,
                             "step_ms": times[label].median_s * 1e3, "status": "ok"})
    return harness.Result(rows, columns=COLUMNS)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
