"""The ``remat`` command line: ``remat plan``, ``remat sweep``, ``remat capture``, ``remat profile``,
``remat demo``, ``remat bench``, ``remat fit``.

Each command lives in its own module, imported only when it runs (``remat plan`` on a saved
graph never loads torch). A mistake in the arguments (an unknown solver, model, method or
size, a budget remat cannot read, a count below 1, a negative time limit) prints one line and
exits with status 2 before any work (:mod:`remat.cli.checks`); a budget no plan meets exits
with status 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from ..errors import InfeasibleBudgetError, RematError
from ..solvers import DEFAULT_TIME_LIMIT, names
from . import checks
from .checks import SIZES, Parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="remat", description=__import__("remat").__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a saved graph (remat JSON or a Checkmate graph)")
    p.add_argument("graph", help="graph file: remat.graph JSON or Checkmate node-link JSON")
    p.add_argument("--solver", default="auto", type=checks.solver, help=f"one of: {', '.join(names(graphs=True))} (default auto)")
    p.add_argument("--budget", default=None, type=checks.budget,
                   help="peak-memory budget: bytes with a unit ('6GiB', '512MB', 1e9), a fraction of "
                        "the activation memory without recomputation (0.6), or 'min'; remat plans "
                        "within 99%% of a byte budget, as remat.compile does")
    p.add_argument("--time-limit", type=checks.seconds, default=DEFAULT_TIME_LIMIT,
                   help=f"seconds the solver may search (default {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (remat.Plan.from_dict reads it)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="draw the plan's memory timeline and its copy stream over time into PNG "
                        "(with --frontier: the frontier, peak against step time)")
    p.add_argument("--bandwidth", type=checks.positive_number, default=None,
                   help="host link bandwidth (bytes/s, or bytes per cost unit for the swapping "
                        "solvers on a graph without a device); default: the device's, measured")
    p.add_argument("--no-offload", action="store_true",
                   help="plan without offloading to host memory (remat.compile's offload=False)")
    p.add_argument("--max-overhead", type=checks.share, default=None,
                   help="instead of a budget: the least memory within this share of extra step time "
                        "(0.10), by MAGIS's search (solvers auto and magis); with --frontier, the "
                        "overhead asked (default 0.1)")
    p.add_argument("--frontier", action="store_true",
                   help="instead of one plan, the memory/time frontier: the plans remat finds for no "
                        "budget, each of --fractions, min and --max-overhead (default 0.1), none smaller "
                        "and faster than another, and what each budget picks (--plot draws it)")
    p.add_argument("--fractions", default=None, type=checks.budgets,
                   help="with --frontier: comma-separated fractions of the activation memory to ask "
                        "(default 1.0,0.9,0.8,0.7,0.6,0.5,0.4,0.3)")
    _target_arguments(p)
    p.set_defaults(module="plan")

    s = sub.add_parser("sweep", help="overhead vs memory budget for budgeted solvers (seeds/001 Fig. 5)")
    s.add_argument("graph", help="graph file: remat.graph JSON or Checkmate node-link JSON")
    s.add_argument("--budgets", default=None, type=checks.budgets,
                   help="comma-separated budgets (bytes with units or fractions); default: --points "
                        "budgets from the smallest feasible found to the no-recomputation peak")
    s.add_argument("--points", type=checks.positive_int, default=8)
    s.add_argument("--solvers", default=None, type=checks.solvers, help="comma-separated solver names (default: checkmate, "
                   "checkmate-lp, checkpoint-all, chen-sqrtn, chen-greedy, griewank)")
    s.add_argument("--time-limit", type=checks.seconds, default=DEFAULT_TIME_LIMIT,
                   help=f"seconds each solve may search (default {DEFAULT_TIME_LIMIT:g})")
    s.add_argument("--plot", default=None, help="write the overhead-vs-budget plot to this PNG")
    s.add_argument("--json", action="store_true")
    s.set_defaults(module="sweep")

    c = sub.add_parser("capture", help="write the joint graph of a zoo model's training step to JSON")
    c.add_argument("--model", default="mlp", help="a zoo entry (remat.zoo.names()): cos-cos, mlp, gpt2, ...")
    c.add_argument("--size", default="tiny", choices=SIZES)
    c.add_argument("--out", default="graph.json", type=Path)
    c.add_argument("--batch", type=checks.positive_int, default=None, help="batch size (default: the zoo's for the size)")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the model's and its floating inputs' dtype (default float32)")
    c.add_argument("--abstract", default=None, choices=["meta", "fake"],
                   help="build the model on the meta device or under FakeTensorMode and capture it "
                        "without allocating it (remat.plan's inputs=remat.shapes(...))")
    _target_arguments(c)
    c.set_defaults(module="capture")

    d = sub.add_parser("demo", help="the seeds' examples: eager vs PyTorch's partitioner vs no-recompute vs remat")
    d.add_argument("examples", nargs="*", help="subset of: cos-cos dropout-mask tanh-tanh gelu-erf")
    d.add_argument("--numel", type=checks.elements, default=1 << 20, help="elements per input tensor (at most 2**30)")
    d.add_argument("--repeats", type=checks.positive_int, default=20, help="timed steps per method")
    d.add_argument("--compiler", default="inductor", choices=["inductor", "eager"],
                   help="'eager' skips kernel codegen (fast; times are then not meaningful)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(module="demo")

    b = sub.add_parser("bench", help="benchmark the model zoo: every method side by side, measured and predicted")
    b.add_argument("--models", default="all", help="'all' or comma-separated zoo names (e.g. cos-cos,gpt2)")
    b.add_argument("--size", default="tiny", help="tiny, small or full (comma-separated for several)")
    b.add_argument("--methods", default="all", help="'all' or comma-separated methods: eager, "
                   "torch-checkpoint, or any solver name with options as solver:key=value,... "
                   "(e.g. mincut-aggressive, auto:budget=0.6, checkmate:budget=0.5,time_limit=20)")
    b.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N for one GPU)")
    b.add_argument("--out", type=Path, default=None,
                   help="output folder (default out/bench-SIZE-DEVICE-COMPILER)")
    b.add_argument("--plot", action="store_true", help="write plots under OUT/plots")
    b.add_argument("--repeats", type=checks.positive_int, default=None,
                   help="timed rounds per method (default by size)")
    b.add_argument("--batch", type=checks.positive_int, default=None,
                   help="batch size (default: the zoo's for the size)")
    b.add_argument("--compiler", default="auto", choices=["auto", "inductor", "eager"],
                   help="'eager' runs the partitioned graphs without kernel codegen (fast; "
                        "times are then not those of compiled kernels); 'auto' (default): "
                        "eager at size tiny, inductor otherwise")
    b.add_argument("--no-resume", action="store_true", help="re-run records already ok in OUT/results.json")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--threads", type=checks.positive_int, default=None, help="torch CPU threads (default: torch's)")
    b.add_argument("--no-kernel-cache", action="store_true",
                   help="turn off inductor's kernel cache too (cold compile times; much slower)")
    b.set_defaults(module="bench")

    r = sub.add_parser("profile", help="measure this machine's device into a profile file, or show a named GPU's")
    r.add_argument("-o", "--out", default=None, help="write the profile as JSON here (remat plan --profile FILE reads it)")
    r.add_argument("--gpu", default=None, help="instead of measuring: a GPU's datasheet profile (H100, H200, "
                   "A100-40GB, A100-80GB, L4, RTX4090) or a profile file")
    r.add_argument("--device", default=None, choices=["cpu", "cuda"], help="the device to measure (default: cuda when there is one)")
    r.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"],
                   help="the training dtype (a named GPU: default bf16; measured: float32)")
    r.add_argument("--json", action="store_true", help="print the profile as JSON")
    r.add_argument("--remeasure", action="store_true",
                   help="measure again instead of reading the measurement stored for this device")
    r.set_defaults(module="profile")

    from . import fit  # no torch: the subcommand's arguments

    fit.add_parser(sub)
    return parser


def _target_arguments(p: argparse.ArgumentParser) -> None:
    """``--device`` and ``--profile``: the device a graph is planned for (remat.plan's)."""
    p.add_argument("--device", default=None,
                   help="plan for this device: cpu, cuda or a GPU's name (H100, H200, A100-40GB, "
                        "A100-80GB, L4, RTX4090; a dtype may follow: H100-bf16): the graph records it "
                        "and is priced with its profile")
    p.add_argument("--profile", default=None,
                   help="the device's numbers: a GPU profile's name (H100-bf16) or a profile JSON "
                        "written by `remat profile -o FILE` on that GPU")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    checks.check(parser, args)  # before any work: one line and exit 2
    try:
        return importlib.import_module(f"{__package__}.{args.module}").run(args)
    except InfeasibleBudgetError as e:
        print(f"remat: infeasible budget: {e}", file=sys.stderr)
        return 1
    except RematError as e:
        print(f"remat: error: {e}", file=sys.stderr)
        return 2
