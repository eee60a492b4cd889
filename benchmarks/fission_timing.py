"""Fission plans' predicted against measured step time (issue 31, item 4: within 1.3x).

For each graph, one region of the F-Tree (:func:`remat.solvers.magis.ftree.ftree`, the
candidate with the most nodes) split in n = 2, 4, 8, 16 parts on the conservative min cut's
saved set (``remat.bench.fission.fixed_fission``, run through ``remat.compile`` as the search's
plans are: lowered by the partitioner with ``plan.fissions``), beside ``no-recompute``. Each
plan's step is measured (the least of an alternating loop's samples: others share this machine
and only ever slow a step down; the median is in the JSON) and predicted by the simulator with
this machine's calibrated profile (``remat.cost.calibrate.cpu_profile``: per-op fixed cost,
matmul/convolution and bandwidth curves, a pointwise element's arithmetic), in the additive view under the eager compiler and
the fusion-aware one under inductor. ``ratio error`` is the predicted ratio to no-recompute over
the measured one. Beside it: the ratio the default CPU profile predicts (what planning uses:
``remat.cost.model.PROFILES["cpu"]``, per-kernel pricing with fixed numbers), and the one the
cost model gave before per-kernel pricing (``remat.bench.fission.OLD_CPU``: no curves, no op by
op view), with its error.

Graphs: ``mlp`` (the wide-batch MLP of ``benchmarks/magis_trial.py``, batch 1,024, sum of
squares: the region is the whole step), ``mixer`` (the MLP-Mixer, batch 64), ``head`` (an LM
head + mean cross-entropy over 2,048 tokens, vocabulary 8,192, a quarter of the labels -100).

    python benchmarks/fission_timing.py [--cases mlp,mixer,head] [--parts 2,4,8,16]
        [--compiler eager|inductor] [--repeats 9] [--threads 1]

Writes ``benchmarks/results/fission_timing.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

from remat.bench import fission, harness  # noqa: E402


def arguments(ap) -> None:
    ap.add_argument("--cases", default="mlp,mixer,head")
    ap.add_argument("--parts", default="2,4,8,16")
    ap.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.set_defaults(threads=1)


def run(args):
    from remat.cost.calibrate import cpu_profile

    profile = cpu_profile()
    print(f"calibrated: {profile}", file=sys.stderr, flush=True)
    parts = [int(x) for x in args.parts.split(",")]
    rows = []
    for name in args.cases.split(","):
        case = fission.timing_case(name)
        print(f"{case.description} ({args.compiler})", file=sys.stderr, flush=True)
        rows += fission.timing_rows(case, parts, compiler=args.compiler, repeats=args.repeats, profile=profile)
    print(f"\ncompiler {args.compiler}, CPU, {args.threads} thread(s); ratios to no-recompute\n")
    print(fission.timing_table(rows))
    errs = [r["ratio_error"] for r in rows if r.get("ratio_error") is not None and r["plan"] != "no-recompute"]
    if errs:
        worst = max(errs, key=lambda e: max(e, 1 / e))
        print(f"\nworst ratio error {worst:.2f} (target within 1.3x); "
              f"{sum(1 for e in errs if 1 / 1.3 <= e <= 1.3)} of {len(errs)} within")
    return harness.Result(rows, {"compiler": args.compiler, "profile": repr(profile)}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
