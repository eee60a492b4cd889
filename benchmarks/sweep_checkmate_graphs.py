"""Overhead vs memory budget on every reference graph (seeds/001 Figure 5 and Table 2), torch-free.

For every graph shipped in ``remat.data`` (Checkmate's MLSys graphs and Moccasin's
random layered graphs) this runs
remat's budget sweep (:func:`remat.bench.sweep.sweep`, what ``remat sweep`` runs) at ``--points``
budgets evenly spaced from the smallest feasible budget remat finds cheaply
(:func:`remat.solvers.auto.smallest_feasible`: recompute-all and the baselines at their tightest) to
the no-recomputation peak (:func:`remat.plans.budget.reference_peak`); on the forward-only random
layered graphs, where that is the peak itself, from ``--low-fraction`` (0.7) of it. Solvers: checkmate
(MILP), checkmate-lp (two-phase LP rounding), checkpoint-all, chen-sqrtn, chen-greedy and
griewank. The MILP and the LP get ``--time-limit`` seconds per solve (default 60); a MILP that
stops on it reports its incumbent (status ``time_limit``) and its gap to the proven bound.
Graphs with more than ``--milp-max-nodes`` nodes (default 400: the 500- and 1000-node random
layered graphs) are swept without the MILP and the LP, whose models grow as n^2 + n*|E|
variables: on the 500-node graph at 0.9 of its peak the MILP (911k columns, 786k binaries,
3.1M rows, 4 GB) found no schedule in 60 s and the LP relaxation did not finish in 60 s.

From the same rows it computes, per graph: the ratio of each solver's cost to the MILP's at
every budget where both are feasible, and its geometric mean across those budgets (the paper's
Table 2 statistic: LP rounding 1.00-1.06 on these graphs), and the MILP's solve times, statuses
and gaps. A ratio below 1 means the MILP stopped on its time limit with a worse incumbent.

Writes ``benchmarks/results/sweep_checkmate_graphs.json`` (one row per graph, its sweep's rows
inside), ``out/sweeps.md`` (per-graph tables) and
``out/sweeps/<graph>.png`` (:func:`remat.bench.plots.sweep_plot`).

    python benchmarks/sweep_checkmate_graphs.py
    python benchmarks/sweep_checkmate_graphs.py --graphs VGG16 vgg_unet --points 6
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from remat.data import CHECKMATE_DIR
from remat.plans.budget import reference_peak
from remat.bench.plots import sweep_plot
from remat.bench.sweep import markdown as sweep_markdown
from remat.bench.sweep import sweep
from remat.solvers.feasible import smallest_feasible
from remat.graph.io import load_graph
from remat.bench import harness

ROOT = Path(__file__).resolve().parents[1]
GRAPH_DIR = CHECKMATE_DIR
SOLVERS = ("checkmate", "checkmate-lp", "checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank")
TIMED = ("checkmate", "checkmate-lp")
BASELINES = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank")
PAPER_TABLE2 = {"MobileNet": 1.06, "VGG16": 1.01, "VGG19": 1.00, "vgg_unet": 1.03, "ResNet50": 1.05}
"""seeds/001 Table 2: geometric-mean cost ratio of two-phase LP rounding to the MILP."""


def label(stem: str) -> str:
    """``VGG16_256_224_224_3_train_nx`` -> ``VGG16``; ``random_layered_n100_w0.27...`` ->
    ``random_layered_n100``."""
    m = re.match(r"(.*?)_\d+_\d+_\d+_\d+_train", stem)
    return m.group(1) if m else stem.split("_w")[0]


def geomean(xs: list[float]) -> float | None:
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else None


def ratios(rows: list[dict]) -> dict:
    """Per solver: cost / MILP cost at each budget where both are feasible, and the geomean."""
    milp = {r["budget"]: r for r in rows if r["solver"] == "checkmate" and r["feasible"]}
    out = {}
    for s in dict.fromkeys(r["solver"] for r in rows):
        if s == "checkmate":
            continue
        per = {r["budget"]: r["cost"] / milp[r["budget"]]["cost"] for r in rows
               if r["solver"] == s and r["feasible"] and r["budget"] in milp
               and milp[r["budget"]]["cost"]}
        out[s] = {"per_budget": per, "geomean": geomean(list(per.values())),
                  "budgets_both_feasible": len(per),
                  "budgets_milp_only": sum(1 for b in milp if b not in per)}
    return out


def milp_summary(rows: list[dict]) -> dict | None:
    ms = [r for r in rows if r["solver"] == "checkmate"]
    if not ms:
        return None
    secs = [r["solve_seconds"] for r in ms]
    statuses: dict[str, int] = {}
    for r in ms:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    gaps = [r["gap"] for r in ms if r["gap"] is not None]
    return {"statuses": statuses, "seconds_median": float(np.median(secs)),
            "seconds_max": float(max(secs)), "seconds_total": float(sum(secs)),
            "max_gap": max(gaps) if gaps else None}


def mid_comparison(rows: list[dict]) -> list[dict]:
    """At the middle budgets (the 2nd and 3rd quartile of the sweep): MILP vs the best baseline."""
    budgets = sorted(dict.fromkeys(r["budget"] for r in rows))
    mids = budgets[len(budgets) // 4: len(budgets) - len(budgets) // 4] or budgets
    out = []
    for b in mids:
        at = {r["solver"]: r for r in rows if r["budget"] == b}
        base = [(at[s]["overhead"], s) for s in BASELINES if s in at and at[s]["feasible"]]
        m, lp = at.get("checkmate"), at.get("checkmate-lp")
        out.append({"budget": b,
                    "milp": m["overhead"] if m and m["feasible"] else None,
                    "milp_status": m["status"] if m else None,
                    "lp": lp["overhead"] if lp and lp["feasible"] else None,
                    "best_baseline": min(base)[1] if base else None,
                    "best_baseline_overhead": min(base)[0] if base else None})
    return out


def graph_markdown(g, name: str, rows: list[dict], reference: int, info: dict) -> str:
    lines = [f"## {name} ({len(g)} nodes)", "",
             f"Budgets: {len(info['budgets'])} from the smallest feasible found "
             f"({info['smallest_feasible'] / 2**20:.1f} MiB, by {info['smallest_by']}) to the "
             f"no-recompute peak ({reference / 2**20:.1f} MiB). Sweep took {info['seconds']:.0f} s."
             + (f" MILP and LP skipped: {info['skipped']}." if info.get("skipped") else ""), "",
             sweep_markdown(g, rows, reference), ""]
    ms = [r for r in rows if r["solver"] == "checkmate"]
    if ms:
        lines += ["MILP per budget (status, solve seconds, gap to its proven bound):", "",
                  "| budget (MiB) | status | seconds | gap | LP / MILP cost |", "|---|---|---|---|---|"]
        rat = info["ratios"].get("checkmate-lp", {}).get("per_budget", {})
        for r in ms:
            gap = "—" if r["gap"] is None else f"{r['gap']:.2%}"
            ratio = rat.get(r["budget"])
            lines.append(f"| {r['budget'] / 2**20:.1f} | {r['status']} | {r['solve_seconds']:.1f} | {gap} | "
                         + ("—" if ratio is None else f"{ratio:.3f}") + " |")
        lines += ["", "Geometric mean of cost / MILP cost over budgets where both are feasible "
                  "(Table 2 statistic):", "",
                  "| solver | geomean | budgets both feasible | MILP-only budgets |", "|---|---|---|---|"]
        for s, d in info["ratios"].items():
            gm = "—" if d["geomean"] is None else f"{d['geomean']:.3f}"
            lines.append(f"| {s} | {gm} | {d['budgets_both_feasible']} | {d['budgets_milp_only']} |")
        lines.append("")
    return "\n".join(lines)


def _gm(r: dict, s: str) -> str:
    d = r["ratios"].get(s)
    if not d or d["geomean"] is None:
        return "—"
    return f"{d['geomean']:.3f} ({d['budgets_both_feasible']})"


def summary_markdown(results: list[dict]) -> str:
    lines = ["## Summary", "",
             "Ratios are geometric means of cost / MILP cost over the budgets where both are feasible "
             "(count in parentheses); checkpoint-all is feasible only at the top budget, so it is left "
             "out. Mid budgets: the middle ones of the sweep (all but the lowest and highest quarter).", "",
             "| graph | nodes | MILP statuses | MILP s (median / max) | LP/MILP | paper LP/MILP "
             "| sqrt(n)/MILP | greedy/MILP | griewank/MILP | mid-budget overhead: MILP vs best baseline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["milp"]
        mids = "; ".join(
            ("—" if x["milp"] is None else f"{x['milp']:.3f}") + " vs "
            + (f"{x['best_baseline_overhead']:.3f} ({x['best_baseline']})" if x["best_baseline"] else "—")
            for x in r["mid"])
        lines.append(
            f"| {r['label']} | {r['nodes']} | "
            + (", ".join(f"{k} {v}" for k, v in m["statuses"].items()) if m else "skipped") + " | "
            + (f"{m['seconds_median']:.1f} / {m['seconds_max']:.1f}" if m else "—") + " | "
            + _gm(r, "checkmate-lp") + " | "
            + (f"{PAPER_TABLE2[r['label']]:.2f}" if r["label"] in PAPER_TABLE2 else "—") + " | "
            + " | ".join(_gm(r, s) for s in ("chen-sqrtn", "chen-greedy", "griewank"))
            + f" | {mids} |")
    return "\n".join(lines)


class _Named:
    """What the Markdown and plot helpers read of a graph: its name and size."""

    def __init__(self, name: str, nodes: int):
        self.name, self._n = name, nodes

    def __len__(self) -> int:
        return self._n


def header(points, time_limit, milp_max_nodes, total: float) -> str:
    return (f"# Budget sweeps on the reference graphs\n\nGenerated by `benchmarks/sweep_checkmate_graphs.py "
            f"--points {points} --time-limit {time_limit:g} --milp-max-nodes {milp_max_nodes}` in "
            f"{total:.0f} s. Overhead = cost / cost with no recomputation. Budgets are in MiB of the "
            "graph's byte units (the random layered graphs' sizes are abstract units).\n")


def rewrite(path: Path, out: Path) -> int:
    meta, graphs = harness.read_rows(path)
    data = {**meta, "graphs": graphs}
    sections = []
    for r in data["graphs"]:
        g = _Named(r["name"], r["nodes"])
        r["mid"] = mid_comparison(r["rows"])
        r["ratios"] = ratios(r["rows"])  # JSON turned the per-budget keys into strings
        sections.append(graph_markdown(g, r["label"], r["rows"], r["reference_peak"], r))
        sweep_plot(g.name, r["rows"], out / "sweeps" / f"{r['label']}.png")
    (out / "sweeps.md").write_text(header(data["points"], data["time_limit"], data["milp_max_nodes"],
                                          data["seconds"]) + "\n" + summary_markdown(data["graphs"])
                                   + "\n\n" + "\n".join(sections))
    print(summary_markdown(data["graphs"]))
    return 0


def arguments(ap) -> None:
    ap.add_argument("--graphs", nargs="*", default=None, help="labels (VGG16, vgg_unet, random_layered_n100, ...)")
    ap.add_argument("--points", type=int, default=7)
    ap.add_argument("--time-limit", type=float, default=60.0, help="per-solve limit for the MILP and LP (s)")
    ap.add_argument("--milp-max-nodes", type=int, default=400)
    ap.add_argument("--low-fraction", type=float, default=0.7,
                    help="lowest budget, as a fraction of the no-recompute peak, where the baselines "
                         "find nothing below that peak (forward-only graphs)")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--out", default=str(ROOT / "out"), help="sweeps.md and sweeps/<graph>.png")
    ap.add_argument("--from-json", default=None,
                    help="rewrite sweeps.md and the plots from this results file "
                         "(benchmarks/results/sweep_checkmate_graphs.json) without solving")


def run(args):
    out = Path(args.out)
    (out / "sweeps").mkdir(parents=True, exist_ok=True)
    if args.from_json:
        return rewrite(Path(args.from_json), out)
    paths = sorted(GRAPH_DIR.glob("*.json"), key=lambda p: (len(json.loads(p.read_text())["nodes"]), p.name))
    if args.graphs:
        paths = [p for p in paths if label(p.stem) in args.graphs]
    t0 = time.perf_counter()
    results, sections = [], []
    for p in paths:
        tg = time.perf_counter()
        g = load_graph(p)
        name = label(p.stem)
        reference = reference_peak(g)
        low, how = smallest_feasible(g)
        if low >= reference * (1 - 1e-6):
            # forward-only graphs (Moccasin's random layered DAGs): every baseline is the one
            # topological schedule, so sweep fractions of its peak as Moccasin does (0.8, 0.9)
            low, how = int(args.low_fraction * reference), f"{args.low_fraction:g} x the no-recompute peak"
        budgets = sorted({int(x) for x in np.linspace(low, reference, args.points)})
        solvers = args.solvers.split(",")
        skipped = ""
        if len(g) > args.milp_max_nodes:
            skipped = f"{len(g)} nodes > --milp-max-nodes {args.milp_max_nodes}"
            solvers = [s for s in solvers if s not in TIMED]
        print(f"{name}: {len(g)} nodes, {len(budgets)} budgets, solvers {solvers}", file=sys.stderr, flush=True)
        rows = sweep(g, budgets, solvers, args.time_limit, progress=False)
        info = {"budgets": budgets, "smallest_feasible": low, "smallest_by": how, "skipped": skipped,
                "seconds": time.perf_counter() - tg, "ratios": ratios(rows)}
        res = {"label": name, "graph": p.name, "name": g.name, "nodes": len(g), "reference_peak": reference,
               **info, "milp": milp_summary(rows), "mid": mid_comparison(rows), "rows": rows}
        results.append(res)
        sections.append(graph_markdown(g, name, rows, reference, info))
        sweep_plot(g.name, rows, out / "sweeps" / f"{name}.png")
        for x in res["mid"]:
            print(f"  mid budget {x['budget'] / 2**20:.0f} MiB: MILP {x['milp']} ({x['milp_status']}), "
                  f"LP {x['lp']}, best baseline {x['best_baseline']} {x['best_baseline_overhead']}",
                  file=sys.stderr, flush=True)
        print(f"  {info['seconds']:.0f} s", file=sys.stderr, flush=True)
        total = time.perf_counter() - t0
        # written after every graph so that an interrupted run keeps what it finished
        (out / "sweeps.md").write_text(header(args.points, args.time_limit, args.milp_max_nodes, total) + "\n" + summary_markdown(results) + "\n\n"
                                       + "\n".join(sections))
        meta = {**harness.environment(), "points": args.points, "time_limit": args.time_limit,
                "milp_max_nodes": args.milp_max_nodes, "seconds": total}
        harness.write_rows(harness.output_path(args, __file__), results, meta, script="sweep_checkmate_graphs")
    print(summary_markdown(results))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return harness.Result(results, meta if results else {}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
