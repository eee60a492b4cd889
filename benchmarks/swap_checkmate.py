"""Swapping with recomputation against recomputation alone on Checkmate's graphs (issue 11).

For every Checkmate MLSys graph shipped in ``remat.data`` and each budget (a
fraction of the activation memory without recomputation), the predicted step time of:

- ``recompute``: the fastest plan of recomputation alone among Checkmate's MILP (``checkmate``,
  ``--time-limit`` seconds) and ``auto`` without offloading (min cuts, the peak descent, the
  baselines: checkpoint-all, Chen's sqrt(n) and greedy, Griewank's REVOLVE);
- ``checkmate``: the MILP alone (its incumbent when it stops on the time limit);
- ``swap``: swapping alone, from the step without recomputation;
- ``swap+recompute``: ``swap-recompute`` (recomputation plans for several budgets, each swapped
  down, the fastest that fits).

Times are the simulator's two-stream makespan over the graph's profiled costs (its own unit),
as a ratio to the step without recomputation: 1.00 is no overhead, ``-`` no plan fits. The
link is :func:`remat.cost.transfer.link_for_graph`'s default for a graph without a device
(it moves a quarter of the forward's activation bytes in the forward's time), scaled by
``--link`` (2, 4: faster links). The least peak each method reaches (``min``) closes each
table. Prints Markdown.

    python benchmarks/swap_checkmate.py [--graphs VGG16 vgg_unet] [--link 1]

Rows (one per graph and budget): ``benchmarks/results/swap_checkmate.json``.
"""

from __future__ import annotations

import sys
import os
from pathlib import Path

from remat.bench import harness
from remat.data import CHECKMATE_DIR
from remat.cost.model import default_cost_model
from remat.cost.transfer import link_for_graph
from remat.errors import InfeasibleBudgetError
from remat.graph.io import load_graph
from remat.plans.budget import reference_schedule, resident_bytes
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.solvers.portfolio import portfolio

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ("VGG16", "VGG19", "MobileNet", "ResNet50", "vgg_unet", "fcn_8_vgg", "segnet")
BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2)


def _run(make):
    try:
        return make()
    except InfeasibleBudgetError:
        return None


def arguments(ap) -> None:
    ap.add_argument("--graphs", nargs="*", default=list(GRAPHS))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument("--link", type=float, default=1.0, help="link bandwidth as a multiple of the default")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")


def run(args):
    rows = []
    budgets = [float(b) for b in args.budgets.split(",")] + ["min"]
    files = sorted(CHECKMATE_DIR.glob("*train_nx.json"))
    print(f"Link: {args.link:g} x the default; time limit {args.time_limit:g} s per solve.\n")
    for name in args.graphs:
        path = next((f for f in files if f.name.startswith(name + "_")), None)
        if path is None:
            continue
        g = load_graph(path)
        cm = default_cost_model(g)
        bw = link_for_graph(g, cm).bandwidth * args.link
        base = simulate(reference_schedule(g), cm)
        res, act = resident_bytes(g), base.peak_bytes - resident_bytes(g)
        print(f"### {name} ({len(g)} nodes; activations {act / 2**30:.2f} GiB)\n")
        print("| budget | recompute | checkmate | swap | swap+recompute | its swaps | its recomputation from |")
        print("|---|---|---|---|---|---|---|")
        for b in budgets:
            limit = None if b == "min" else int(res + b * act)
            rec = [p for p in (
                _run(lambda: solve(g, "checkmate", budget=b, time_limit=args.time_limit)) if b != "min" else None,
                portfolio(g, limit or 0, cm, args.time_limit, swapping=False)) if p is not None and p.statements]
            rec = [p for p in rec if b == "min" or p.peak_bytes <= limit]
            mi = next((p for p in rec if p.solver == "checkmate"), None)
            sw = _run(lambda: solve(g, "swap", budget=b, bandwidth=bw, time_limit=args.time_limit))
            sr = _run(lambda: solve(g, "swap-recompute", budget=b, bandwidth=bw, time_limit=args.time_limit))

            def cell(p):
                if p is None:
                    return "-"
                t = f"{p.predicted_seconds / base.predicted_seconds:.3f}"
                return f"{t} ({(p.peak_bytes - res) / act:.2f})" if b == "min" else t
            best = min(rec, key=lambda p: (p.peak_bytes, p.predicted_seconds) if b == "min"
                       else (p.predicted_seconds,)) if rec else None
            print(f"| {b} | {cell(best)} | {cell(mi)} | {cell(sw)} | {cell(sr)} | "
                  f"{sr.details.get('swaps', 0) if sr else '-'} | "
                  f"{sr.details.get('recomputation_from', '') if sr else ''} |", flush=True)

            def ratio(p):
                return None if p is None else p.predicted_seconds / base.predicted_seconds

            def frac(p):
                return None if p is None else (p.peak_bytes - res) / act
            rows.append({"graph": name, "nodes": len(g), "activation_bytes": act, "budget": str(b),
                         "recompute": ratio(best), "recompute_fraction": frac(best), "recompute_solver":
                         best.solver if best else None, "checkmate": ratio(mi), "checkmate_fraction": frac(mi),
                         "swap": ratio(sw), "swap_fraction": frac(sw), "swap_recompute": ratio(sr),
                         "swap_recompute_fraction": frac(sr), "swaps": sr.swaps if sr else None,
                         "recomputation_from": sr.details.get("recomputation_from") if sr else None})
        print()
    return harness.Result(rows, {"link": args.link, "time_limit": args.time_limit}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
