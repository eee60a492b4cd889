"""A user names a solver and a time limit (issue 38's review): Checkmate's LP rounding on a
transformers Starcoder2 (a model no test names), beside plain torch.compile, PyTorch's knob with
its ILP knapsack solver and remat's ``auto``, one run, remat's eager compiler (AOTAutograd and
the partitioners, no kernel codegen).

Rows: the first step's seconds (capture and planning included), the peak of a later step above
its start (:func:`remat.bench.harness.measure_peak`), the loss, the plan each graph ran and the
warnings remat gave. Where the named solver finds no plan at any budget (too large for it, or
out of time), remat falls back to PyTorch's partitioner with a warning; before, the first step
raised ``InfeasibleBudgetError`` ("fits the budget of 0 B").

    python benchmarks/named_solver_trial.py                   # 1 layer, 4 x 128 tokens
    python benchmarks/named_solver_trial.py --layers 4 --seq 256

Rows: ``benchmarks/results/named_solver_trial.json``.
"""

from __future__ import annotations

import os
import time
import warnings

os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402

COLUMNS = ["method", "first_step_s", "peak_mib", "loss", "plans", "warnings"]


def arguments(ap) -> None:
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--limits", default="2,60", help="checkmate-lp's time limits, comma-separated")


def _model(layers: int):
    import transformers

    cfg = transformers.Starcoder2Config(vocab_size=2048, hidden_size=256, intermediate_size=1024,
                                        num_hidden_layers=layers, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    return transformers.Starcoder2ForCausalLM(cfg)


def _row(method: str, make, args, ids) -> dict:
    torch._dynamo.reset()
    model = _model(args.layers)
    plans: list = []

    def step(fn):
        model.zero_grad(set_to_none=True)
        out = fn(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.item()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        fn, patch = make(model, plans)
        with patch:
            loss = step(fn)
            first = time.perf_counter() - t0
            peak = harness.measure_peak(lambda: step(fn))
    said = sorted({f"{type(w.message).__name__}: {str(w.message)[:120]}" for w in caught
                   if type(w.message).__name__.startswith("Remat")})
    return {"method": method, "first_step_s": round(first, 1), "peak_mib": round(peak / 2**20, 2),
            "loss": round(loss, 5), "plans": "; ".join(f"{p.solver} ({p.status})" for p in plans),
            "warnings": " | ".join(said)}


def run(args):
    from contextlib import nullcontext

    ids = torch.randint(0, 2048, (4, args.seq), generator=torch.Generator().manual_seed(0))
    knob = functorch_config.patch(activation_memory_budget=args.budget, activation_memory_budget_solver="ilp")

    def remat_compile(**kw):
        return lambda m, plans: (remat.compile(m, compiler="eager", cache=False, budget=args.budget,
                                               on_plan=lambda g, p: plans.append(p), **kw), nullcontext())

    methods = [("torch.compile", lambda m, plans: (torch.compile(m, backend="aot_eager"), nullcontext())),
               (f"PyTorch's knob {args.budget:g} (ilp)", lambda m, plans: (torch.compile(m, backend="aot_eager"), knob))]
    methods += [(f"remat checkmate-lp {args.budget:g}, time_limit {limit:g}",
                 remat_compile(solver="checkmate-lp", time_limit=limit))
                for limit in (float(x) for x in args.limits.split(","))]
    methods.append((f"remat auto {args.budget:g}", remat_compile()))
    rows = []
    for method, make in methods:
        rows.append(_row(method, make, args, ids))
        print(harness.markdown_table(rows[-1:], COLUMNS), flush=True)
    print(harness.markdown_table(rows, COLUMNS))
    return harness.Result(rows, {"model": f"Starcoder2 {args.layers} x 256, 4 x {args.seq} tokens"},
                          COLUMNS, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__, columns=COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
