"""The ``remat`` command line: ``remat demo``, ``remat plan GRAPH.json [--budget B]``,
``remat sweep GRAPH.json``, ``remat capture``, ``remat bench``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import RematError
from .bench import cmd_bench
from .capture import cmd_capture
from .demo import cmd_demo
from .plan import cmd_plan
from .sweep import add_parsers


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
    add_parsers(sub, p)

    c = sub.add_parser("capture", help="write the joint graph of a zoo model's training step to JSON")
    c.add_argument("--model", default="mlp", help="a zoo entry (remat.zoo.names()): cos-cos, mlp, gpt2, ...")
    c.add_argument("--size", default="tiny", choices=["tiny", "small", "full"])
    c.add_argument("--out", default="graph.json", type=Path)
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
