"""Is every solver's predicted peak at or above the measured one, and within 10% of it?

For each model, compiler and plan (a solver and a budget): ``remat.compile(model, solver=S,
budget=B, compiler=C)``, one step to plan and compile, then the step's measured peak above
its start (:func:`remat.bench.measure.peak_memory`: profiler allocation records on a CPU)
(gradients zeroed in place, ``zero_grad(set_to_none=False)``: the step allocates
its gradients above its start and adds them in) beside the plans' prediction (``plan.peak_bytes - resident_bytes(graph)`` summed over the
step's graphs) and their ratio ``predicted / measured``: below 1 the simulator under-predicts
(a byte budget can be exceeded), above 1.10 it over-predicts (remat refuses budgets it meets).

Models: ``zoo:NAME`` (the zoo's ``tiny`` entries, :mod:`remat.zoo.registry`, loss as the zoo
has it) or a :func:`remat.zoo.trials.budget_case` name (``quick`` size): gpt2, llama, qwen2,
mistral, t5, cnn, resnet18. Plans (``--plans``): ``auto`` (no budget), ``auto@0.8``,
``auto@0.5``, ``auto@min``, ``mincut-aggressive``, ``torch-mincut``, ``magis@0.5`` (the
search), ``checkmate@0.5`` (skipped on graphs of more than ``--checkmate-nodes`` nodes).
A budget nothing reaches is a row with status ``infeasible``.

    python benchmarks/peak_fidelity.py [--models zoo:resnet18,cnn,t5,gpt2]
        [--compilers eager,inductor] [--inductor-models zoo:mlp,cnn] [--plans auto,auto@0.5,...]
        [--time-limit 10]

Inductor compiles take 10-25 s per plan on a 2-core CPU: it runs only on
``--inductor-models``. Rows: ``benchmarks/results/peak_fidelity.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import copy  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.zoo.trials import loss_case as case, make_step  # noqa: E402

COLUMNS = ("model", "compiler", "plan", "status", "predicted_bytes", "measured_bytes", "ratio",
           "recomputes", "seconds")

PLANS = "auto,auto@0.8,auto@0.5,auto@min,mincut-aggressive,torch-mincut,magis@0.5,checkmate@0.5"


def split(plan: str) -> tuple[str, dict]:
    solver, _, b = plan.partition("@")
    return solver, ({} if not b else {"budget": b if b == "min" else float(b)})


def measure(name: str, compiler: str, plan: str, args) -> dict:
    """One row: the plans' predicted peak above the step's start beside the measured one."""
    base, inputs, loss = case(name)
    solver, kw = split(plan)
    row = {"model": name, "compiler": compiler, "plan": plan}
    model = copy.deepcopy(base)
    plans: list = []
    torch._dynamo.reset()
    if solver == "checkmate":
        kw["solver_options"] = {"threads": 1}
    t0 = time.perf_counter()
    fn = remat.compile(model, solver=solver, compiler=compiler, cache=False, dynamic=False, strict=True,
                       time_limit=args.time_limit, on_plan=lambda g, p: plans.append(p), **kw)
    if solver == "checkmate" and args.checkmate_nodes:
        g = remat.plan(copy.deepcopy(base), *inputs, for_compiler=compiler).graph
        if len(g.nodes) > args.checkmate_nodes:
            return {**row, "status": f"skipped ({len(g.nodes)} nodes)"}
    step = make_step(lambda *xs: loss(fn(*xs)), model, inputs, "keep")

    try:
        step()
    except remat.InfeasibleBudgetError as e:
        return {**row, "status": "infeasible", "smallest_feasible_bytes": e.smallest_feasible}
    seconds = time.perf_counter() - t0
    measured = harness.measure_peak(step, keep=harness.held(model, inputs))
    predicted = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    act = sum(activation_bytes(p.graph) for p in plans)
    return {**row, "status": "ok", "predicted_bytes": predicted, "measured_bytes": measured,
            "ratio": predicted / measured if measured else None, "graphs": len(plans),
            "recomputes": sum(int(p.recomputes or 0) for p in plans), "fissions": sum(len(p.fissions) for p in plans),
            "solvers": ",".join(sorted({str(p.solver) for p in plans})),
            "activation_bytes": act, "seconds": round(seconds, 1)}


def arguments(ap) -> None:
    ap.add_argument("--models", default="zoo:mlp,zoo:resnet18,cnn,t5,gpt2")
    ap.add_argument("--compilers", default="eager,inductor")
    ap.add_argument("--inductor-models", default="zoo:mlp,cnn",
                    help="the models planned under inductor too (compiles take 10-25 s each)")
    ap.add_argument("--plans", default=PLANS, help="solver[@budget], comma separated")
    ap.add_argument("--time-limit", type=float, default=10.0, help="remat.compile's time_limit per graph")
    ap.add_argument("--checkmate-nodes", type=int, default=400, help="checkmate only on graphs this small")


def run(args):
    rows = []
    inductor = set(args.inductor_models.split(","))
    for name in args.models.split(","):
        for compiler in args.compilers.split(","):
            if compiler == "inductor" and name not in inductor:
                continue
            for plan in args.plans.split(","):
                try:
                    r = measure(name, compiler, plan, args)
                except Exception as e:  # a row says what failed; the table goes on
                    r = {"model": name, "compiler": compiler, "plan": plan, **harness.error_row(e)}
                print(" ".join(f"{k}={harness.cell(r.get(k), '{:.3f}')}" for k in COLUMNS), flush=True)
                rows.append(r)
    ok = [r for r in rows if r.get("status") == "ok"]
    under = [r for r in ok if r["ratio"] < 1.0]
    over = [r for r in ok if r["ratio"] > 1.10]
    meta = {"under_predicted": len(under), "over_predicted_10pct": len(over), "ok": len(ok)}
    print(f"{len(ok)} plans measured: {len(under)} under-predicted, {len(over)} over-predicted by more than 10%")
    return harness.Result(rows, meta=meta, columns=COLUMNS)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
