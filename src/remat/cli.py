"""The ``remat`` command line: ``remat demo``, ``remat plan GRAPH.json [--budget B]``,
``remat sweep GRAPH.json``, ``remat capture``, ``remat bench``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import RematError

CAPTURE_MODELS = ("cos-cos", "dropout-mask", "tanh-tanh", "gelu-erf", "mlp", "cnn", "transformer", "gpt2")


def _console():
    from rich.console import Console

    return Console(stderr=True)


def cmd_plan(args) -> int:
    from .graph_io import load_graph
    from .solvers import solve

    if args.budget is not None:
        from .cli_budget import cmd_plan_budget

        args.solver = args.solver or "checkmate"
        return cmd_plan_budget(args)
    args.solver = args.solver or "mincut"
    if args.solver != "mincut":
        raise SystemExit(f"remat plan: solver {args.solver!r} needs --budget (only mincut plans without one)")
    graph = load_graph(args.graph)
    options = {"mode": args.mode} if args.solver == "mincut" else {}
    plan = solve(graph, args.solver, **options)
    if args.json:
        out = {
            "graph": graph.name, "solver": plan.solver, "options": plan.options,
            "saved": plan.saved_names, "cost": plan.cost, "solve_seconds": plan.solve_seconds,
            "saved_activation_bytes": plan.saved_activation_bytes, "recomputed": plan.recomputed,
            "stats": plan.stats,
        }
        print(json.dumps(out, indent=1))
    else:
        print(plan.summary())
    return 0


def _example_model(name: str):
    import torch

    from . import models as M

    torch.manual_seed(0)
    if name in M.SEED_EXAMPLES:
        fn, n = M.SEED_EXAMPLES[name]
        return fn, [torch.randn(1024, requires_grad=True) for _ in range(n)]
    if name == "mlp":
        return M.MLP(), [torch.randn(16, 32)]
    if name == "cnn":
        return M.ConvBN(), [torch.randn(4, 3, 16, 16)]
    if name == "transformer":
        return M.TransformerBlock(), [torch.randn(2, 8, 32)]
    if name == "gpt2":
        return M.GPT2Loss(M.gpt2_tiny()), [torch.randint(0, 256, (2, 16))]
    raise SystemExit(f"unknown model {name!r}; choose one of {CAPTURE_MODELS}")


def cmd_capture(args) -> int:
    from .api import plan
    from .graph_io import save_graph

    model, inputs = _example_model(args.model)
    p = plan(model, *inputs, mode=args.mode)
    graph = p.graph
    graph.name = args.model
    save_graph(graph, args.out)
    _console().print(f"wrote {len(graph)} nodes of {args.model!r} to {args.out}")
    return 0


def cmd_demo(args) -> int:
    from rich.table import Table

    from .demo import METHODS, rows_as_dicts, run_demo
    from .models import SEED_EXAMPLES
    from .plans import _fmt_bytes

    console = _console()
    examples = args.examples or list(SEED_EXAMPLES)
    for e in examples:
        if e not in SEED_EXAMPLES:
            raise SystemExit(f"unknown example {e!r}; choose from {list(SEED_EXAMPLES)}")
    with console.status("starting") as status:
        rows = run_demo(examples, numel=args.numel, repeats=args.repeats, compiler=args.compiler,
                        progress=lambda msg: status.update(msg))
    if args.json:
        print(json.dumps(rows_as_dicts(rows), indent=1))
        return 0
    table = Table(title=f"remat demo: seeds' examples, {args.numel} float32 elements per input, "
                        f"median of {args.repeats} CPU steps (compiler: {args.compiler})")
    for col in ("example", "method", "saved tensors", "saved bytes", "step ms", "time vs eager", "remat saves"):
        table.add_column(col, justify="left" if col in ("example", "method", "remat saves") else "right")
    for r in rows:
        table.add_row(r.example if r.method == METHODS[0] else "", r.method, str(r.saved_tensors),
                      _fmt_bytes(r.saved_bytes), f"{r.step_ms:.2f}", f"{r.vs_eager:.2f}x",
                      ", ".join(r.saved_names) if r.method == "remat" and r.saved_names is not None else "",
                      end_section=r.method == METHODS[-1])
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 130).print(table)
    return 0


def cmd_bench(args) -> int:
    """``remat bench``: the zoo's models x methods, measured side by side (remat.bench.runner)."""
    import time

    from rich.console import Console

    from .bench import report
    from .bench.runner import run

    if args.compiler == "auto":
        # tiny checks the harness: eager runs the same partitioned graphs without kernel
        # codegen (all of the zoo in ~4 min here, against ~23 min with inductor)
        args.compiler = "eager" if set(args.size.split(",")) == {"tiny"} else "inductor"
        print(f"remat bench: compiler {args.compiler} (--compiler inductor|eager to choose)",
              file=sys.stderr)
    if args.out is None:
        args.out = Path("out") / f"bench-{args.size}-{args.device}-{args.compiler}"
    t0 = time.perf_counter()
    records = run(args.models, args.size, args.methods, device=args.device, out_dir=args.out,
                  repeats=args.repeats, compiler=args.compiler, resume=not args.no_resume,
                  progress=not args.no_progress, batch=args.batch, kernel_cache=not args.no_kernel_cache,
                  threads=args.threads)
    elapsed = time.perf_counter() - t0
    if args.plot:
        from .bench.plots import plot_all

        plot_all(records, args.out)
    wanted = set(args.size.split(","))
    shown = [r for r in records if r.get("size") in wanted and r.get("device") == args.device]
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(report.rich_table(shown, title=f"remat bench ({args.size}, {args.device}, "
                                                 f"compiler {args.compiler}): {args.out}"))
    from .bench.fidelity import fidelity

    f = fidelity(shown)
    fmt = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    _console().print(f"fidelity: Spearman peak {fmt(f['peak']['spearman'])}, step time "
                     f"{fmt(f['step']['spearman'])}; {len(f['findings'])} predictions off by more "
                     f"than {f['tolerance'] * 100:.0f}% (see {args.out / 'fidelity.md'}); "
                     f"took {elapsed:.0f} s")
    failed = [r for r in shown if r.get("status") != "ok"]
    return 1 if failed and len(failed) == len(shown) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="remat", description=__import__("remat").__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a saved graph (remat JSON or a Checkmate graph)")
    p.add_argument("graph", help="graph file: remat.graph JSON or Checkmate node-link JSON")
    p.add_argument("--solver", default=None,
                   help="mincut (default), or with --budget: checkmate, checkmate-lp, checkpoint-all, "
                        "chen-sqrtn, chen-greedy, griewank (and their -ap/-linearized variants)")
    p.add_argument("--mode", default="conservative", choices=["conservative", "aggressive"])
    p.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    p.set_defaults(func=cmd_plan)
    from .cli_budget import add_parsers

    add_parsers(sub, p)

    c = sub.add_parser("capture", help="write a built-in example model's joint graph to JSON")
    c.add_argument("--model", default="mlp", choices=CAPTURE_MODELS)
    c.add_argument("--out", default="graph.json", type=Path)
    c.add_argument("--mode", default="conservative", choices=["conservative", "aggressive"])
    c.set_defaults(func=cmd_capture)

    d = sub.add_parser("demo", help="the seeds' examples: eager vs torch.compile vs no-recompute vs remat")
    d.add_argument("examples", nargs="*", help="subset of: cos-cos dropout-mask tanh-tanh gelu-erf")
    d.add_argument("--numel", type=int, default=1 << 20, help="elements per input tensor")
    d.add_argument("--repeats", type=int, default=20, help="timed steps per method")
    d.add_argument("--compiler", default="inductor", choices=["inductor", "eager"],
                   help="'eager' skips kernel codegen (fast; times are then not meaningful)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="benchmark the model zoo: every method side by side, measured and predicted")
    b.add_argument("--models", default="all", help="'all' or comma-separated zoo names (e.g. cos-cos,gpt2)")
    b.add_argument("--size", default="tiny", help="tiny, small or full (comma-separated for several)")
    b.add_argument("--methods", default="all", help="'all' or comma-separated methods (eager,compile,"
                   "no-recompute,checkpoint,remat-conservative,remat-aggressive,remat:<solver>...)")
    b.add_argument("--device", default="cpu", help="cpu or cuda")
    b.add_argument("--out", type=Path, default=None,
                   help="output folder (default out/bench-SIZE-DEVICE-COMPILER)")
    b.add_argument("--plot", action="store_true", help="write plots under OUT/plots")
    b.add_argument("--repeats", type=int, default=None, help="timed rounds per method (default by size)")
    b.add_argument("--batch", type=int, default=None, help="batch size (default: the zoo's for the size)")
    b.add_argument("--compiler", default="auto", choices=["auto", "inductor", "eager"],
                   help="'eager' runs the partitioned graphs without kernel codegen (fast; "
                        "times are then not those of compiled kernels); 'auto' (default): "
                        "eager at size tiny, inductor otherwise")
    b.add_argument("--no-resume", action="store_true", help="re-run records already ok in OUT/results.json")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    b.add_argument("--no-kernel-cache", action="store_true",
                   help="turn off inductor's kernel cache too (cold compile times; much slower)")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RematError as e:
        print(f"remat: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
