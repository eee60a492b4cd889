"""Checkmate's MILP and LP rounding on the Checkmate graphs (seeds/001 Sections 4-6, Table 2).

For each graph: the model size, the smallest feasible budget (:func:`min_budget`, time
limited), the checkpoint-all peak, and at a few budgets between them the MILP's solve time,
status, gap and cost overhead (cost / sum of op costs), and the LP rounding's cost and its
ratio to the MILP (Checkmate's Table 2 reports at most 1.06 as a geometric mean over budgets).
Prints a Markdown table and writes one row per graph (its runs inside) to
``benchmarks/results/bench_checkmate.json``.

    python benchmarks/bench_checkmate.py                      # every graph but n1000
    python benchmarks/bench_checkmate.py --graphs VGG16 unet --time-limit 60
    python benchmarks/bench_checkmate.py --fractions 0.1 0.5 0.9 --big-time-limit 120

Every solve is bounded: ``--time-limit`` per MILP (``--big-time-limit`` for graphs with more
than ``--big`` stages), ``--lp-time-limit`` per LP-rounding sweep, ``--min-time-limit`` for the
smallest-budget search. ``random_layered_n1000`` (999 stages: ~1M R/S binaries, ~3M FREE) is
skipped unless named with ``--graphs``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from remat.data import CHECKMATE_DIR
from remat.cost.model import default_cost_model  # noqa: E402
from remat.graph.io import load_graph  # noqa: E402
from remat.solvers.checkmate.milp import checkmate, min_budget
from remat.solvers.checkmate.bounds import checkpoint_all_peak, memory_lower_bound
from remat.solvers.checkmate.lp_rounding import checkmate_lp  # noqa: E402
from remat.solvers.checkmate.model import build_model  # noqa: E402
from remat.plans.stages import staged  # noqa: E402
from remat.bench import harness  # noqa: E402

DATA = CHECKMATE_DIR
SKIP_BY_DEFAULT = ("random_layered_n1000",)


def human(b) -> str:
    """Bytes in a readable unit (GiB for the Checkmate nets, KiB for the random graphs)."""
    if b is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{int(b)} B"


def fmt(x, digits=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def run_graph(path: Path, args) -> dict:
    g = load_graph(path)
    st = staged(g)
    big = st.n > args.big
    tl = args.big_time_limit if big else args.time_limit
    total = sum(default_cost_model().op_costs(g))
    t0 = time.perf_counter()
    top = checkpoint_all_peak(g)
    cheap, _ = memory_lower_bound(g)
    model = build_model(g, top, free_form=args.free_form)
    build_s = time.perf_counter() - t0
    mb = min_budget(g, time_limit=args.min_time_limit, free_form=args.free_form)
    lo = mb.budget
    lo_note = mb.status
    if lo >= top:  # nothing below checkpoint-all found in time: start from the cheap bound
        lo, lo_note = cheap, "cheap bound (may be infeasible)"
    rec = {"graph": path.stem, "nodes": len(g), "stages": st.n, "model": model.stats,
           "build_seconds": round(build_s, 2), "sum_op_costs": total,
           "checkpoint_all_peak": top, "memory_lower_bound": cheap,
           "min_budget": mb.to_dict(), "low_end": lo, "low_end_source": lo_note,
           "time_limit": tl, "runs": []}
    print(f"\n## {path.stem}: {len(g)} nodes, {st.n} stages, {model.stats['columns']} columns "
          f"({model.stats['binaries']} binary), {model.stats['rows']} rows; smallest budget "
          f"{human(mb.budget)} ({mb.status}, >= {human(mb.lower_bound)}, {mb.seconds:.1f} s), "
          f"checkpoint-all {human(top)}", flush=True)
    for f in args.fractions:
        budget = int(lo + f * (top - lo))
        c0 = time.process_time()
        r = checkmate(g, budget, time_limit=tl, mip_gap=args.mip_gap, free_form=args.free_form,
                      threads=args.threads, explain_infeasible=False)
        c1 = time.process_time()
        lp = checkmate_lp(g, budget, time_limit=args.lp_time_limit, free_form=args.free_form,
                          threads=args.threads)
        c2 = time.process_time()
        ratio = lp.cost / r.cost if lp.feasible and r.feasible and r.cost else None
        run = {
            "fraction": f, "budget": budget,
            "milp": {"status": r.status, "seconds": round(r.solve_seconds, 2),
                     "cpu_seconds": round(c1 - c0, 2), "gap": r.gap,
                     "warm_start": r.details.get("warm_start"),
                     "cost": r.cost, "overhead": r.cost / total if r.cost else None,
                     "peak": r.peak_bytes, "lower_bound": r.lower_bound,
                     "nodes": r.details.get("mip_nodes"), "message": r.message},
            "lp": {"status": lp.status, "seconds": round(lp.solve_seconds, 2),
                   "cpu_seconds": round(c2 - c1, 2), "cost": lp.cost,
                   "overhead": lp.cost / total if lp.cost else None, "peak": lp.peak_bytes,
                   "lp_bound": lp.lower_bound, "candidates": lp.details.get("candidates"),
                   "threshold": lp.details.get("threshold"), "epsilon": lp.details.get("epsilon"),
                   "message": lp.message},
            "ratio": ratio,
        }
        rec["runs"].append(run)
        print(f"| {path.stem[:24]} | {human(budget)} | {r.status} | {r.solve_seconds:.1f} "
              f"({c1 - c0:.1f}) | {fmt(r.gap, 4)} | {fmt(run['milp']['overhead'], 4)} | "
              f"{lp.status} | {lp.solve_seconds:.1f} ({c2 - c1:.1f}) | "
              f"{fmt(run['lp']['overhead'], 4)} | {fmt(ratio, 4)} |", flush=True)
    rec["geomean_ratio"] = geomean([x["ratio"] for x in rec["runs"]])
    return rec


def arguments(p) -> None:
    p.add_argument("--graphs", nargs="*", default=None,
                   help="substrings of graph file names (default: all but n1000)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--fractions", nargs="*", type=float, default=[0.1, 0.5, 0.9],
                   help="budgets as fractions of [smallest feasible, checkpoint-all peak]")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per MILP solve")
    p.add_argument("--big", type=int, default=120, help="stages above which a graph is big")
    p.add_argument("--big-time-limit", type=float, default=120.0,
                   help="seconds per MILP solve on big graphs")
    p.add_argument("--lp-time-limit", type=float, default=300.0,
                   help="seconds per LP-rounding sweep")
    p.add_argument("--min-time-limit", type=float, default=60.0,
                   help="seconds for the smallest-budget search")
    p.add_argument("--mip-gap", type=float, default=0.0)
    p.add_argument("--free-form", default="tight", choices=("paper", "tight"))


def run(args):
    paths = sorted(args.data.glob("*.json"))
    # n1000 runs only when named in full ("n100" alone does not select it)
    skipped = [q.stem for q in paths if any(s in q.stem for s in SKIP_BY_DEFAULT)
               and not any(k in (args.graphs or []) for k in SKIP_BY_DEFAULT)]
    if skipped:
        print(f"skipping {skipped}: 999 stages make a model of 4M columns (3.6M binary) and 16M "
              "rows, 6 GB to build (name it in full with --graphs to run it)")
    paths = [q for q in paths if q.stem not in skipped]
    if args.graphs:
        paths = [q for q in paths if any(s.lower() in q.stem.lower() for s in args.graphs)]
    paths.sort(key=lambda q: len(load_graph(q)))
    print("| graph | budget | MILP | wall s (cpu s) | gap | overhead | LP rounding | wall s "
          "(cpu s) | overhead | LP/MILP |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    out = harness.output_path(args, __file__)
    for q in paths:
        results.append(run_graph(q, args))
        harness.write_rows(out, results, {**harness.environment(), "args": {
            k: str(v) for k, v in vars(args).items() if k != "parser"}}, script="bench_checkmate")
    print("\n| graph | stages | columns | rows | MILP optimal | max MILP s | geomean LP/MILP |")
    print("|---|---|---|---|---|---|---|")
    for rec in results:
        runs = rec["runs"]
        opt = sum(r["milp"]["status"] == "optimal" for r in runs)
        print(f"| {rec['graph'][:24]} | {rec['stages']} | {rec['model']['columns']} | "
              f"{rec['model']['rows']} | {opt}/{len(runs)} | "
              f"{max(r['milp']['seconds'] for r in runs):.1f} | {fmt(rec['geomean_ratio'], 4)} |")
    return harness.Result(results, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
