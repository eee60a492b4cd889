"""remat's budgets against plain torch.compile and PyTorch's knob (``activation_memory_budget``), side by side.

Issue 30, "What it must show": on Mistral, Gemma2, BERT (dropout), Whisper, Swin, CLIP,
Wav2Vec2, Mamba, GPT-2, Llama and a CNN with BatchNorm, in one run, for each of 0.8, 0.6,
0.4, 0.2, ``min`` and ``max_overhead=0.1``: remat's and the knob's measured peak as a fraction
of plain ``torch.compile``'s, step-time ratio, planning time and gradient checks; no fraction
refused; measured fraction <= asked wherever remat does not warn; remat's least <= the knob's
least on every model.

Per model (``remat.zoo.trials.budget_case``), every method on its own copy of the same weights
and inputs, through the same compiler (``--compiler eager``: ``aot_eager_decomp_partition``
for plain torch.compile and ``remat.compile(compiler="eager")``, no kernel codegen;
``inductor``: real kernels):

- ``torch.compile``: plain ``torch.compile(model)``, the reference of every fraction and
  step-time ratio (each compile through a backend object of its own, so that no method runs
  code dynamo compiled for another);
- ``eager``: plain autograd (for scale);
- ``no-recompute``: ``remat.compile(model, solver="no-recompute")``, the gradient reference of
  remat's rows (remat's pipeline draws dropout masks its own way);
- ``remat``: ``remat.compile(model, cache=False)`` at no budget, at each of ``--budgets``, at
  ``budget="min"`` and at ``max_overhead=0.1``; remat's warnings are recorded (``warned``) and
  an exception is a row (``refused: ...``, ``error: ...``), not the end of the run;
- ``knob``: plain torch.compile with ``torch._functorch.config.activation_memory_budget = B``
  (solver ``dp``) at each of ``--budgets`` and at 0.0, its least.

Columns (``remat.bench.budgets``): peak above the step's start (profiler allocation records on
a CPU, the CUDA allocator on a GPU; gradients zeroed in place between steps), ``fraction`` of
the reference's, remat's ``predicted`` fraction (its plans), step-time ratio to the reference
(one alternating loop, median [min, max] of per-round ratios), ``plan s`` (remat:
``plan.solve_seconds`` summed; knob and reference: seconds in
``min_cut_rematerialization_partition``), ``compile s`` (first step minus a steady one), and the
gradient checks: max |g - g_ref| / max |g_ref| against eager autograd and against a reference
with the same random draws (no-recompute for remat's rows, torch.compile for the others; every
step seeded: compiled code draws its dropout masks differently from eager autograd, so for
models with dropout the second is the comparison), and ``fd``: the method's gradient against
its own forward along random unit directions (central differences, every forward seeded).
Plans are not served from remat's cache and inductor's FX-graph and AOTAutograd caches are off.

    python benchmarks/budgets_vs_torch.py [--models mistral,gemma2,...] [--budgets 0.8,0.6,0.4,0.2]
        [--compiler eager|inductor] [--size quick|default] [--repeats 5] [--device cpu|cuda]

Writes ``benchmarks/results/budgets_vs_torch.json`` (every row and the run's settings;
``--results``) and ``--out``/``rows.jsonl`` (rows as they come); prints a Markdown table per
model with the issue's checks under it, and all checks at the end. ``--capture`` only writes
each model's graphs and the knob's saved sets under ``--out``, to plan offline.
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

DEFAULT_MODELS = ("mistral", "gemma2", "bert", "whisper", "swin", "clip", "wav2vec2", "mamba", "gpt2", "llama",
                  "cnn")
DEFAULT_BUDGETS = (0.8, 0.6, 0.4, 0.2)
KNOB_LEAST = 0.0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"comma-separated, of {','.join(BUDGET_SIZES)} (default: %(default)s)")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in DEFAULT_BUDGETS),
                    help="fractions for remat and the knob (default: %(default)s; the knob also runs at 0.0)")
    ap.add_argument("--compiler", default="eager", choices=("eager", "inductor"),
                    help="eager: aot_eager_decomp_partition / remat's eager compiler (no codegen); inductor")
    ap.add_argument("--size", default="default", help="model sizes, a key of BUDGET_SIZES (quick, default, ...)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds of the alternating loop")
    ap.add_argument("--max-overhead", type=float, default=0.1, help="remat's max_overhead row (negative: none)")
    ap.add_argument("--skip", default="", help="comma-separated rows to leave out: eager, min, overhead, fd")
    ap.add_argument("--fd-step", type=float, default=1e-3,
                    help="the directional check's step (and 4x it), a share of the parameters' norm")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    ap.add_argument("--time-limit", type=float, default=None, help="remat's time_limit (default: remat's)")
    ap.add_argument("--out", default="out/budgets_vs_torch", help="where rows.jsonl and --capture's files go")
    ap.add_argument("--capture", action="store_true",
                    help="only capture: write each model's graphs (remat JSON) and the saved sets of "
                         "PyTorch's knob at each budget (plans JSON) under --out, for planning offline")
    ap.add_argument("--at-torch-peak", default="none", choices=("none",),
                    help="accepted for older command lines: the rows of remat at the knob's measured "
                         "fraction are gone")
    ap.set_defaults(threads=1)  # stable timings on a shared CPU


def run(args):
    ap = args.parser
    models = budgets.checked_models(ap, args.models, args.size)
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if skip - {"eager", "min", "overhead", "fd"}:
        ap.error(f"--skip takes eager, min, overhead and fd, not {', '.join(sorted(skip))}")
    fractions = _floats(args.budgets)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA GPU")
    budgets.fresh_compiles()
    ms = budgets.methods(fractions, fractions + [KNOB_LEAST], eager="eager" not in skip, least="min" not in skip,
                         max_overhead=None if "overhead" in skip or args.max_overhead < 0 else args.max_overhead)
    settings = budgets.Settings(compiler=args.compiler, device=args.device, time_limit=args.time_limit,
                                fd_step=args.fd_step, fd_directions=0 if "fd" in skip else 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.capture:
        for name in models:
            budgets.capture(budget_case(name, args.size, getattr(torch, args.dtype), args.device), fractions, out)
        return 0
    on_row = budgets.row_writer(out / "rows.jsonl")  # every row as it comes

    meta = {"compiler": args.compiler, "dtype": args.dtype, "repeats": args.repeats, "budgets": fractions,
            "knob_budgets": fractions + [KNOB_LEAST], "models": models, "size": args.size,
            "sizes": {m: BUDGET_SIZES[m][args.size] for m in models}, "descriptions": {}}
    print(f"torch {torch.__version__}, compiler {args.compiler}, {args.dtype}, device {args.device}, "
          f"size {args.size}, repeats {args.repeats}, budgets {fractions}", flush=True)
    rows: list[dict] = []
    summary: list[str] = []
    t_start = time.perf_counter()
    for name in models:
        t0 = time.perf_counter()
        try:
            case = budget_case(name, args.size, getattr(torch, args.dtype), args.device)
            print(f"\n### {case.description}\n\n({sum(p.numel() for p in case.model.parameters()) / 1e6:.2f} M "
                  f"parameters)", flush=True)
            model_rows = budgets.run_model(case, ms, settings, args.repeats, on_row)
        except Exception as e:  # noqa: BLE001 - one model's failure does not stop the others
            print(f"{name}: {error_status(e)}\n{traceback.format_exc()[-2000:]}", flush=True)
            summary.append(f"{name}: {error_status(e)}")
            continue
        meta["descriptions"][name] = case.description
        print()
        print(budgets.table(model_rows))
        print(f"\n({budgets.LEGEND})\n")
        lines = budgets.checks(model_rows)
        print("\n".join(lines))
        summary += [f"{name} {line[2:]}" for line in lines]
        print(f"\n({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
        rows += budgets.as_dicts(model_rows)
    meta["seconds"] = time.perf_counter() - t_start
    print("\n## Checks\n\n" + "\n".join(f"- {s}" for s in summary))
    return harness.Result(rows, meta, printed=True)


def main(argv: list[str] | None = None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
