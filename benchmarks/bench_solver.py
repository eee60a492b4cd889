"""remat's fusion-aware min cut vs networkx's minimum_cut on synthetic joint graphs (torch-free).

For each size, builds a transformer-like joint forward+backward graph with
:func:`remat.graph.synthetic.synthetic_joint_graph` and, for both modes, times (median of
``--repeats`` runs after ``--warmup``):

  - remat: the whole ``mincut(g, mode)`` call (analysis, flow network, the three max-flows of
    the lexicographic tie-break, extracting the cut, and building the Plan), split with
    ``plan.details`` into build (analysis + network), max-flow (+ cut extraction) and plan;
    and ``cold``: the first plan on a freshly constructed Graph (no cached structure);
  - networkx: ``nx.minimum_cut`` (preflow_push, its default, and shortest_augmenting_path)
    on the SAME flow network, ``flow_network(g, analyse(g, mode))`` with infinite arcs left
    without a capacity attribute (networkx's infinity). Building the networkx graph is not
    timed. Both must find the same minimum cut value (asserted).

Graph construction (``Graph(nodes)``: validation and topological sort) is timed separately.

    PYTHONPATH=src python benchmarks/bench_solver.py
    PYTHONPATH=src python benchmarks/bench_solver.py --sizes 5000 50000 --json out/bench_solver.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import networkx as nx
from networkx.algorithms.flow import preflow_push, shortest_augmenting_path
from rich.console import Console
from rich.table import Table

from remat.graph.graph import Graph
from remat.solvers.mincut.maxflow import INF
from remat.solvers.mincut.mincut import MODES, analyse, cut_cost, flow_network, mincut
from remat.graph.synthetic import synthetic_joint_graph

NX_FLOW_FUNCS = {"preflow_push": preflow_push, "shortest_augmenting_path": shortest_augmenting_path}


def timed(fn, repeats: int, warmup: int = 0) -> tuple[list[float], object]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, and the
    last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    gc.collect()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def networkx_network(net) -> nx.DiGraph:
    """The flow network as a networkx DiGraph; infinite arcs carry no capacity attribute."""
    G = nx.DiGraph()
    G.add_nodes_from(range(net.num_vertices))
    G.add_edges_from((a, b) if c == INF else (a, b, {"capacity": c})
                     for a, b, c in zip(net.tails, net.heads, net.caps))
    return G


def bench_remat(g: Graph, mode: str, repeats: int, warmup: int) -> dict:
    """Warm (median over repeats) and cold (fresh Graph) timings of ``mincut(g, mode)``."""
    plans = []

    def run():
        plan = mincut(g, mode)
        plans.append(plan)
        return plan

    times, plan = timed(run, repeats, warmup)
    timed_plans = plans[warmup:]
    assert cut_cost(g, plan.saved_names, mode) == plan.cost, "plan cost is not its saved set's cost"
    cold = []
    for _ in range(max(1, min(repeats, 3))):
        fresh = Graph(g.nodes, name=g.name)
        gc.collect()
        t0 = time.perf_counter()
        mincut(fresh, mode)
        cold.append(time.perf_counter() - t0)
    med = statistics.median

    def stat(key):
        return med(p.details[key] for p in timed_plans)

    return {
        "remat_ms": med(times) * 1e3,
        "remat_min_ms": min(times) * 1e3,
        "build_ms": stat("build_seconds") * 1e3,
        "maxflow_ms": stat("maxflow_seconds") * 1e3,
        "plan_ms": med(t - p.solve_seconds for t, p in zip(times, timed_plans)) * 1e3,
        "cold_ms": med(cold) * 1e3,
        "cut_value": int(plan.cost),
        "saved": len(plan.saved),
        "recomputed": len(plan.recomputed),
        "flow_vertices": plan.details["flow_vertices"],
        "flow_arcs": plan.details["flow_arcs"],
    }


def bench_networkx(g: Graph, mode: str, funcs: list[str], repeats: int, slow_s: float,
                   expected: int, skip: set[str]) -> dict:
    """nx.minimum_cut on remat's flow network; asserts the cut value equals ``expected``.
    A flow function whose single run takes over ``slow_s`` is not repeated and is added to
    ``skip`` (so larger graphs skip it)."""
    G = networkx_network(flow_network(g, analyse(g, mode)))
    out = {}
    for name in funcs:
        if name in skip:
            out[name] = None
            continue
        gc.collect()
        t0 = time.perf_counter()
        value, _ = nx.minimum_cut(G, 0, 1, flow_func=NX_FLOW_FUNCS[name])
        times = [time.perf_counter() - t0]
        if times[0] > slow_s:
            skip.add(name)
        else:
            more, (value, _) = timed(lambda: nx.minimum_cut(G, 0, 1, flow_func=NX_FLOW_FUNCS[name]),
                                     repeats - 1)
            times += more
        assert value == expected, f"networkx {name} cut value {value} != remat's {expected}"
        out[name] = statistics.median(times) * 1e3
    return out


def bench_size(num_nodes: int, args, skip: set[str], console: Console) -> tuple[dict, list[dict]]:
    t0 = time.perf_counter()
    g = synthetic_joint_graph(num_nodes, seed=args.seed)
    generate_s = time.perf_counter() - t0
    construct, _ = timed(lambda: Graph(g.nodes, name=g.name), max(1, min(args.repeats, 5)))
    info = {"nodes": len(g), "requested_nodes": num_nodes, "seed": args.seed,
            "generate_ms": generate_s * 1e3, "construct_ms": statistics.median(construct) * 1e3}
    console.print(f"[bold]{g.name}[/]: {len(g)} nodes, {sum(map(len, g.input_indices))} edges; "
                  f"generated in {generate_s:.2f} s, Graph(...) construction "
                  f"{info['construct_ms']:.0f} ms (median)")
    rows = []
    for mode in args.modes:
        row = {"nodes": len(g), "mode": mode, **bench_remat(g, mode, args.repeats, args.warmup)}
        row["networkx_ms"] = bench_networkx(g, mode, args.nx_funcs, args.nx_repeats, args.nx_slow,
                                            row["cut_value"], skip)
        nx_ms = row["networkx_ms"].get("preflow_push")
        row["speedup"] = nx_ms / row["remat_ms"] if nx_ms else None
        console.print(f"  {mode}: cut value {row['cut_value']} (remat) == networkx "
                      + ", ".join(f"{k}" for k, v in row["networkx_ms"].items() if v is not None)
                      + f"; {row['saved']} saved, {row['recomputed']} recomputed")
        rows.append(row)
    return info, rows


def render(rows: list[dict], funcs: list[str]) -> Table:
    table = Table(title="remat min cut vs networkx minimum_cut (same flow network, median ms)")
    for col in ("nodes", "arcs", "mode", "remat ms", "build / max-flow / plan ms", "cold ms"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    short = {"preflow_push": "nx preflow ms", "shortest_augmenting_path": "nx SAP ms"}
    for f in funcs:
        table.add_column(short[f], justify="right")
    table.add_column("speedup", justify="right")

    def ms(v):
        return "skipped" if v is None else f"{v:,.1f}"

    for r in rows:
        table.add_row(
            f"{r['nodes']:,}", f"{r['flow_arcs']:,}", r["mode"], ms(r["remat_ms"]),
            f"{r['build_ms']:.1f} / {r['maxflow_ms']:.1f} / {r['plan_ms']:.1f}", ms(r["cold_ms"]),
            *(ms(r["networkx_ms"].get(f)) for f in funcs),
            "-" if r["speedup"] is None else f"{r['speedup']:.0f}x",
        )
    return table


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 50000])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=7, help="timed remat runs per graph and mode")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nx-funcs", nargs="+", choices=list(NX_FLOW_FUNCS), default=list(NX_FLOW_FUNCS))
    ap.add_argument("--nx-repeats", type=int, default=3)
    ap.add_argument("--nx-slow", type=float, default=30.0,
                    help="seconds: a networkx flow function slower than this runs once, "
                         "then is skipped for larger graphs")
    ap.add_argument("--json", metavar="OUT", help="write all numbers to this JSON file")
    args = ap.parse_args(argv)

    console = Console(width=None if sys.stdout.isatty() else 150)
    skip: set[str] = set()
    graphs, rows = [], []
    for n in sorted(args.sizes):
        info, r = bench_size(n, args, skip, console)
        graphs.append(info)
        rows += r
    console.print(render(rows, args.nx_funcs))
    console.print("remat ms: whole mincut() call incl. the Plan; build = analysis + flow network; "
                  "max-flow = 3 OR-Tools max-flows (lexicographic tie-break) + cut extraction; "
                  "cold = first plan on a fresh Graph; speedup = nx preflow / remat ms. "
                  "networkx times exclude building its graph.")
    import ortools

    result = {
        "benchmark": "bench_solver", "args": vars(args), "graphs": graphs, "rows": rows,
        "python": platform.python_version(), "machine": platform.machine(),
        "processor": platform.processor(), "ortools": ortools.__version__,
        "networkx": nx.__version__,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
