"""Checkmate's baselines on Checkmate's graphs: the overhead-vs-memory curves (torch-free).

For every graph shipped in ``remat.data`` (``src/remat/data/checkmate``
shipped in the package) and every baseline of :data:`remat.solvers.baselines.BASELINES`, runs
the baseline with no budget and collects every schedule it evaluated (one for
checkpoint-all and sqrt(n); the whole ``b`` grid for Chen's greedy; every slot count for
Griewank), each simulated: ``(peak bytes, cost overhead)`` with overhead = schedule cost /
sum of op costs (every node computed once; Checkmate's profiled costs). These are the points
of seeds/001 Figure 5; a budget ``B`` is served by the cheapest point with peak <= B.

Prints a Markdown table: per baseline the number of points, the lowest peak reached (as a
fraction of checkpoint-all's peak) and the overhead there, and the lowest overhead within
budgets of 90%, 75% and 50% of checkpoint-all's peak ("-": no point fits). The curves go to
rows of ``benchmarks/results/bench_baselines.json`` (one per graph and baseline, its points
included).

    python benchmarks/bench_baselines.py
    python benchmarks/bench_baselines.py --graphs VGG16 vgg_unet --results out/b.json
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from remat.data import CHECKMATE_DIR
from remat.cost.model import default_cost_model
from remat.graph.io import load_graph
from remat.solvers.baselines import BASELINES
from remat.plans.stages import staged
from remat.bench import harness

ROOT = Path(__file__).resolve().parents[1]
GRAPH_DIR = CHECKMATE_DIR
FRACTIONS = (0.9, 0.75, 0.5)


def label(stem: str) -> str:
    """``VGG16_256_224_224_3_train_nx`` -> ``VGG16``; ``random_layered_n100_w0.27...`` ->
    ``random_layered_n100``."""
    m = re.match(r"(.*?)_\d+_\d+_\d+_\d+_train", stem)
    if m:
        return m.group(1)
    return stem.split("_w")[0]


def op_cost_total(g) -> float:
    costs = default_cost_model().op_costs(g)
    return float(sum(costs[i] for i in staged(g).order))


def run_graph(path: Path) -> dict:
    g = load_graph(path)
    total = op_cost_total(g)
    out = {"graph": path.stem, "name": g.name, "nodes": len(g), "op_cost_total": total,
           "baselines": {}}
    for name, fn in BASELINES.items():
        t0 = time.perf_counter()
        r = fn(g)
        seconds = time.perf_counter() - t0
        assert r.sim is not None and r.sim.valid, (path.stem, name, r.message)
        curve = r.details.get("curve") or [{
            "param": r.details.get("param"), "n_checkpoints": len(r.details.get("checkpoints", [])),
            "peak_bytes": r.peak_bytes, "cost": r.cost, "recomputes": r.sim.recomputes,
            "valid": r.sim.valid}]
        points = [{**p, "overhead": p["cost"] / total if total else 1.0} for p in curve]
        assert all(p["valid"] for p in points), (path.stem, name)
        out["baselines"][name] = {"candidates": r.details.get("candidates"),
                                  "n_candidates": r.details.get("n_candidates"),
                                  "seconds": seconds, "points": points}
    return out


def best_within(points: list[dict], budget: float) -> float | None:
    fits = [p["overhead"] for p in points if p["peak_bytes"] <= budget]
    return min(fits) if fits else None


def markdown(results: list[dict]) -> str:
    head = ("| graph | baseline | cands | points | min peak (x all) | overhead there | "
            + " | ".join(f"best @{int(f * 100)}%" for f in FRACTIONS) + " | seconds |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for res in results:
        ref = res["baselines"]["checkpoint-all"]["points"][0]["peak_bytes"]
        for name, b in res["baselines"].items():
            pts = b["points"]
            low = min(pts, key=lambda p: (p["peak_bytes"], p["overhead"]))
            cells = []
            for f in FRACTIONS:
                v = best_within(pts, f * ref)
                cells.append("-" if v is None else f"{v:.3f}")
            cand = b["candidates"] or "all"
            if b["n_candidates"] is not None:
                cand = f"{cand} ({b['n_candidates']})"
            lines.append(f"| {label(res['graph'])} | {name} | {cand} | {len(pts)} | "
                         f"{low['peak_bytes'] / ref:.3f} | {low['overhead']:.3f} | "
                         + " | ".join(cells) + f" | {b['seconds']:.2f} |")
    return "\n".join(lines)


def arguments(ap) -> None:
    ap.add_argument("--graphs", nargs="*", default=None,
                    help="graph file stems or prefixes (default: all)")


def run(args):
    paths = sorted(GRAPH_DIR.glob("*.json"))
    if not paths:
        print(f"no graphs under {GRAPH_DIR}", file=sys.stderr)
        return 1
    if args.graphs:
        paths = [p for p in paths if any(p.stem.startswith(s) for s in args.graphs)]
    results = []
    for p in paths:
        t0 = time.perf_counter()
        results.append(run_graph(p))
        print(f"{p.stem}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print(markdown(results))
    rows = [{"graph": label(res["graph"]), "file": res["graph"], "nodes": res["nodes"],
             "op_cost_total": res["op_cost_total"], "baseline": name, **b}
            for res in results for name, b in res["baselines"].items()]
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
