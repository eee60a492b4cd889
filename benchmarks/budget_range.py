"""remat's budgets from 0.9 down to 0.3, ``"min"`` and ``max_overhead``, against plain torch.compile.

Issue 39, "What it must show" (first bullet) and its item 3: on transformers LMs (GPT-2, Llama,
Mistral, a Mixtral MoE, a LoRA fine-tune of a Llama), an encoder (BERT), a vision transformer
(Swin), a ResNet-18, a ConvNeXt-style CNN and a CNN with BatchNorm, in one run: for each
fraction of ``--budgets``, ``budget="min"`` and ``max_overhead=0.1``, remat's measured peak as
a fraction of plain ``torch.compile``'s measured peak, the step-time ratio, remat's predicted
fraction and step time, whether it warned, and its first call (compile and first step) over
plain torch.compile's first call; then item 3's cells per model:

- every fraction met (measured <= f x plain torch.compile's measured peak, plus 2%) or warned,
  the warning naming the least memory reached and the predicted slowdown;
- ``"min"`` the least measured peak among remat's rows;
- ``max_overhead``'s measured step ratio within 5% of its bound (1.1 x 1.05);
- no plan run that another row's plan beats on both predicted peak and predicted time;
- out of reach (warned), a step no slower than ``"min"``'s (5%);
- measured peaks monotone in the fraction (2%).

Per model (``remat.zoo.trials.budget_case``, ``--size quick``), every method on its own copy of
the same weights and inputs, through the same compiler (``--compiler eager``:
``aot_eager_decomp_partition`` for plain torch.compile and ``remat.compile(compiler="eager")``;
``inductor``), measured by ``remat.bench.budgets`` (peaks from the profiler's allocation records
on a CPU, the CUDA allocator on a GPU; step times in one alternating loop, median [min, max] of
per-round ratios; gradients against ``remat.compile(solver="no-recompute")`` with the same
random draws and against the method's own forward along random directions). Before the first
model one tiny module is compiled both ways, and before each model's rows one plain
torch.compile of it is run and thrown away, so that no first call pays alone for the process's
imports or for what dynamo keeps across compiles of the same code.
Plans are not served from remat's cache; inductor's FX-graph and AOTAutograd caches are off.

    python benchmarks/budget_range.py [--models gpt2,llama,...] [--budgets 0.9,0.8,...,0.3]
        [--compiler eager|inductor] [--size quick|default] [--repeats 5] [--device cpu|cuda]

Writes ``benchmarks/results/budget_range.json`` (every row and the run's settings;
``--results``) and ``--out``/``rows.jsonl`` (rows as they come); prints a Markdown table and
the checks per model, then one summary table and every check that failed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from remat.bench import budgets, harness  # noqa: E402
from remat.bench.measure import error_status  # noqa: E402
from remat.zoo.trials import BUDGET_SIZES, budget_case  # noqa: E402

DEFAULT_MODELS = ("gpt2", "llama", "mistral", "mixtral", "lora", "bert", "swin", "resnet18", "convnext", "cnn",
                  "qwen2")
DEFAULT_BUDGETS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated, of {','.join(BUDGET_SIZES)} (default: %(default)s)")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in DEFAULT_BUDGETS),
                    help="fractions of plain torch.compile's activation memory (default: %(default)s)")
    ap.add_argument("--compiler", default="eager", choices=("eager", "inductor"),
                    help="eager: aot_eager_decomp_partition / remat's eager compiler (no codegen); inductor")
    ap.add_argument("--size", default="quick", help="model sizes, a key of BUDGET_SIZES (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds of the alternating loop")
    ap.add_argument("--max-overhead", type=float, default=0.1, help="remat's max_overhead row (negative: none)")
    ap.add_argument("--skip", default="", help="comma-separated checks to leave out: fd (directional), "
                                               "gradients (the no-recompute row and the gradient checks)")
    ap.add_argument("--fd-step", type=float, default=1e-3, help="the directional check's step (and 4x it)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    ap.add_argument("--time-limit", type=float, default=None, help="remat's time_limit (default: remat's)")
    ap.add_argument("--out", default="out/budget_range", help="where rows.jsonl goes")
    ap.set_defaults(threads=1)  # stable timings on a shared CPU


def run(args):
    ap = args.parser
    models = budgets.checked_models(ap, args.models, args.size)
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if skip - {"fd", "gradients"}:
        ap.error(f"--skip takes fd and gradients, not {', '.join(sorted(skip))}")
    fractions = [float(x) for x in args.budgets.split(",") if x.strip()]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA GPU")
    budgets.fresh_compiles()
    overhead = None if args.max_overhead < 0 else args.max_overhead
    ms = budgets.range_methods(fractions, overhead, gradients="gradients" not in skip)
    settings = budgets.Settings(compiler=args.compiler, device=args.device, time_limit=args.time_limit,
                                fd_step=args.fd_step, fd_directions=0 if skip & {"fd", "gradients"} else 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    on_row = budgets.row_writer(out / "rows.jsonl")  # every row as it comes

    meta = {"compiler": args.compiler, "dtype": args.dtype, "repeats": args.repeats, "budgets": fractions,
            "max_overhead": overhead, "models": models, "size": args.size,
            "sizes": {m: BUDGET_SIZES[m][args.size] for m in models}, "descriptions": {}, "model_seconds": {},
            "checks": {}}
    print(f"torch {torch.__version__}, compiler {args.compiler}, {args.dtype}, device {args.device}, "
          f"size {args.size}, repeats {args.repeats}, budgets {fractions}, max_overhead {overhead}", flush=True)
    t_start = time.perf_counter()
    budgets.warm_up(args.compiler)
    rows: list[dict] = []
    by_model: dict = {}
    failed: list[str] = []
    for name in models:
        t0 = time.perf_counter()
        try:
            case = budget_case(name, args.size, getattr(torch, args.dtype), args.device)
            n_params = sum(p.numel() for p in case.model.parameters())
            print(f"\n### {case.description}\n\n({n_params / 1e6:.2f} M parameters)", flush=True)
            model_rows = budgets.run_model(case, ms, settings, args.repeats, on_row, warm=True)
        except Exception as e:  # noqa: BLE001 - one model's failure does not stop the others
            print(f"{name}: {error_status(e)}\n{traceback.format_exc()[-2000:]}", flush=True)
            failed.append(f"{name}: {error_status(e)}")
            continue
        meta["descriptions"][name] = case.description
        by_model[name] = model_rows
        lines = budgets.range_checks(model_rows, overhead)
        meta["checks"][name] = lines
        failed += [f"{name} {line[2:]}" for line in lines if ": NO" in line]
        meta["model_seconds"][name] = time.perf_counter() - t0
        print("\n" + budgets.range_table(model_rows) + "\n\n" + "\n".join(lines), flush=True)
        print(f"\n({name}: {meta['model_seconds'][name]:.0f} s)", flush=True)
        rows += budgets.as_dicts(model_rows)
    meta["seconds"] = time.perf_counter() - t_start
    print("\n## Summary\n\nmeasured fraction of plain torch.compile's peak (step ratio); *: warned\n")
    print(budgets.range_summary(by_model, fractions))
    print("\n## Failed checks\n\n" + ("\n".join(f"- {s}" for s in failed) or "none"))
    print(f"\n({meta['seconds'] / 60:.1f} min)")
    return harness.Result(rows, meta, printed=True)


def main(argv: list[str] | None = None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
