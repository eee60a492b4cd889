"""``remat bench``: the zoo's models x methods, measured side by side (:mod:`remat.bench.runner`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rich.console import Console

from ..bench import report
from ..bench.fidelity import fidelity
from ..bench.plots import plot_all
from ..bench.runner import run as run_bench


def resolve(args) -> bool:
    """``--compiler auto`` and the default ``--out`` made concrete; True where the compiler was
    chosen here. Raises :class:`remat.OptionError` when the results to resume from cannot be
    read (:func:`remat.bench.report.load_results`)."""
    chosen = args.compiler == "auto"
    if chosen:
        # tiny checks the harness: eager runs the same partitioned graphs without kernel
        # codegen (all of the zoo in ~4 min here, against ~23 min with inductor)
        args.compiler = "eager" if set(args.size.split(",")) == {"tiny"} else "inductor"
    if args.out is None:
        args.out = Path("out") / f"bench-{args.size}-{args.device}-{args.compiler}"
    if not args.no_resume:
        report.load_results(args.out / "results.json")
    return chosen


def run(args) -> int:
    if getattr(args, "compiler_chosen", False):
        print(f"remat bench: compiler {args.compiler} (--compiler inductor|eager to choose)", file=sys.stderr)
    t0 = time.perf_counter()
    records = run_bench(args.models, args.size, args.methods, device=args.device, out_dir=args.out,
                        repeats=args.repeats, compiler=args.compiler, resume=not args.no_resume,
                        progress=not args.no_progress, batch=args.batch,
                        kernel_cache=not args.no_kernel_cache, threads=args.threads)
    elapsed = time.perf_counter() - t0
    if args.plot:
        plot_all(records, args.out)
    wanted = set(args.size.split(","))
    shown = [r for r in records if r.get("size") in wanted and r.get("device") == args.device]
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(report.rich_table(shown, title=f"remat bench ({args.size}, {args.device}, "
                                                 f"compiler {args.compiler}): {args.out}"))
    f = fidelity(shown)
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    Console(stderr=True).print(f"fidelity: Spearman peak {fmt(f['peak']['spearman'])}, step time "
                               f"{fmt(f['step']['spearman'])}; {len(f['findings'])} predictions off by "
                               f"more than {f['tolerance'] * 100:.0f}% (see {args.out / 'fidelity.md'}); "
                               f"took {elapsed:.0f} s")
    failed = [r for r in shown if r.get("status") != "ok"]
    return 1 if failed and len(failed) == len(shown) else 0
