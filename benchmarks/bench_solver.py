"""remat's whole min-cut solve, judging included, vs networkx's minimum_cut on synthetic joint graphs.

For each size, builds a transformer-like joint forward+backward graph with
:func:`remat.graph.synthetic.synthetic_joint_graph` and, for each min-cut mode, times in one
run, alternating, the median of ``--repeats`` runs after ``--warmup``:

  - ``solve``: ``remat.solve(g, "mincut-<mode>")``, what a user calls: the min cut, the Plan,
    then the judge every solver passes (the saved set lowered to a Schedule, replayed by the
    simulator: valid, peak, predicted time), on a graph solved before (warm: the graph's
    derived tables, prices and analysis built);
  - ``cold_solve``: the same call on a fresh graph, rebuilt from the same nodes before each
    run (the build not timed), so it builds every table it reads: what the first solve of a
    captured graph costs. ``cold / warm`` is their ratio;
  - its parts, called one after another on the same graph: ``mincut``: ``mincut(g, mode)``
    (analysis, flow network, the three max-flows of the lexicographic tie-break, the cut,
    the Plan); ``schedule``: ``schedule_from_saved_set`` on its saved set; ``simulate``:
    ``simulate`` of that schedule. ``judge / mincut`` is (schedule + simulate) / mincut;
  - networkx: ``nx.minimum_cut`` (preflow_push, its default; ``--nx-funcs`` adds
    shortest_augmenting_path) on the SAME flow network, ``flow_network(g, analyse(g, mode))``,
    infinite arcs left without a capacity attribute (networkx's infinity). Building the
    networkx graph is not timed. Both must find the same minimum cut value (asserted).

``nx / solve`` and ``nx / cold`` are networkx's median over remat's whole warm and cold
solve's, all from this run.

    python benchmarks/bench_solver.py                    # 50,000 nodes, both modes
    python benchmarks/bench_solver.py --sizes 5000 50000 --repeats 9

Rows go to ``benchmarks/results/bench_solver.json`` (:mod:`remat.bench.harness`).
"""

from __future__ import annotations

import gc
import statistics
import time

import networkx as nx
from networkx.algorithms.flow import preflow_push, shortest_augmenting_path

from remat.bench import harness
from remat.cost.model import default_cost_model
from remat.graph.graph import Graph
from remat.graph.synthetic import synthetic_joint_graph
from remat.plans.schedule import schedule_from_saved_set
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.solvers.mincut.maxflow import INF
from remat.solvers.mincut.mincut import MODES, analyse, cut_cost, flow_network, mincut

NX_FLOW_FUNCS = {"preflow_push": preflow_push, "shortest_augmenting_path": shortest_augmenting_path}
COLUMNS = ["nodes", "arcs", "mode", "solve_ms", "cold_solve_ms", "cold_per_warm", "mincut_ms", "schedule_ms",
           "simulate_ms", "judge_per_mincut", "nx_preflow_ms", "nx_per_solve", "nx_per_cold", "nx_per_mincut"]


def networkx_network(net) -> nx.DiGraph:
    """The flow network as a networkx DiGraph; infinite arcs carry no capacity attribute."""
    G = nx.DiGraph()
    G.add_nodes_from(range(net.num_vertices))
    G.add_edges_from((a, b) if c == INF else (a, b, {"capacity": c})
                     for a, b, c in zip(net.tails, net.heads, net.caps))
    return G


def _clock(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_remat(g: Graph, mode: str, repeats: int, warmup: int) -> dict:
    """Medians (ms) of the whole solve, cold and warm, and of its parts, measured alternately
    in one loop."""
    cm = default_cost_model(g)
    parts: dict[str, list[float]] = {"solve": [], "cold": [], "mincut": [], "schedule": [], "simulate": []}
    for k in range(warmup + repeats):
        fresh = Graph(g.nodes, name=g.name, meta=g.meta)  # no derived tables, prices nor analysis
        gc.collect()
        t_cold, cold = _clock(lambda: solve(fresh, f"mincut-{mode}", cost_model=cm))
        del fresh
        gc.collect()
        t_solve, plan = _clock(lambda: solve(g, f"mincut-{mode}", cost_model=cm))
        t_cut, cut = _clock(lambda: mincut(g, mode))
        t_sched, sched = _clock(lambda: schedule_from_saved_set(g, cut.saved_names))
        t_sim, sim = _clock(lambda: simulate(sched, cm))
        if k >= warmup:
            for name, t in zip(parts, (t_solve, t_cold, t_cut, t_sched, t_sim)):
                parts[name].append(t)
    assert cut_cost(g, plan.saved_names, mode) == plan.cost, "plan cost is not its saved set's cost"
    assert sim.valid and sim.peak_bytes == plan.peak_bytes, "the judge and the simulator disagree"
    assert (cold.saved_names, cold.peak_bytes, cold.predicted_seconds) == \
        (plan.saved_names, plan.peak_bytes, plan.predicted_seconds), "a cold solve planned otherwise"
    med = {name: statistics.median(ts) * 1e3 for name, ts in parts.items()}
    return {
        "solve_ms": med["solve"], "mincut_ms": med["mincut"], "schedule_ms": med["schedule"],
        "simulate_ms": med["simulate"],
        "judge_per_mincut": statistics.median((a + b) / c for a, b, c in
                                              zip(parts["schedule"], parts["simulate"], parts["mincut"])),
        "cold_solve_ms": med["cold"], "cold_per_warm": med["cold"] / med["solve"],
        "cut_value": int(plan.cost), "saved": len(plan.saved), "recomputed": len(plan.recomputed),
        "statements": len(sched.statements), "peak_bytes": int(plan.peak_bytes),
        "flow_vertices": plan.details["flow_vertices"], "arcs": plan.details["flow_arcs"],
    }


def bench_networkx(g: Graph, mode: str, funcs: list[str], repeats: int, slow_s: float,
                   expected: int, skip: set[str]) -> dict:
    """Median ms of nx.minimum_cut on remat's flow network; asserts the cut value equals
    ``expected``. A flow function whose single run takes over ``slow_s`` is not repeated and
    is added to ``skip`` (so larger graphs skip it)."""
    G = networkx_network(flow_network(g, analyse(g, mode)))
    out = {}
    for name in funcs:
        if name in skip:
            out[name] = None
            continue
        times = []
        for _ in range(repeats):
            gc.collect()
            t, (value, _) = _clock(lambda: nx.minimum_cut(G, 0, 1, flow_func=NX_FLOW_FUNCS[name]))
            assert value == expected, f"networkx {name} cut value {value} != remat's {expected}"
            times.append(t)
            if t > slow_s:
                skip.add(name)
                break
        out[name] = statistics.median(times) * 1e3
    return out


def arguments(ap) -> None:
    ap.add_argument("--sizes", type=int, nargs="+", default=[50000])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=7, help="timed remat runs per graph and mode (cold and warm)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--nx-funcs", nargs="+", choices=list(NX_FLOW_FUNCS), default=["preflow_push"])
    ap.add_argument("--nx-repeats", type=int, default=3)
    ap.add_argument("--nx-slow", type=float, default=30.0,
                    help="seconds: a networkx flow function slower than this runs once, "
                         "then is skipped for larger graphs")


def run(args) -> harness.Result:
    skip: set[str] = set()
    rows, graphs = [], []
    for n in sorted(args.sizes):
        t_gen, g = _clock(lambda: synthetic_joint_graph(n, seed=args.seed))
        graphs.append({"nodes": len(g), "requested_nodes": n, "generate_ms": t_gen * 1e3,
                       "edges": sum(map(len, g.input_indices))})
        for mode in args.modes:
            row = {"nodes": len(g), "mode": mode, **bench_remat(g, mode, args.repeats, args.warmup)}
            nx_ms = bench_networkx(g, mode, args.nx_funcs, args.nx_repeats, args.nx_slow, row["cut_value"], skip)
            row["nx_preflow_ms"] = nx_ms.get("preflow_push")
            if "shortest_augmenting_path" in nx_ms:
                row["nx_sap_ms"] = nx_ms["shortest_augmenting_path"]
            row["nx_per_solve"] = row["nx_preflow_ms"] / row["solve_ms"] if row["nx_preflow_ms"] else None
            row["nx_per_cold"] = row["nx_preflow_ms"] / row["cold_solve_ms"] if row["nx_preflow_ms"] else None
            row["nx_per_mincut"] = row["nx_preflow_ms"] / row["mincut_ms"] if row["nx_preflow_ms"] else None
            print(f"{len(g):,} nodes, {mode}: cut value {row['cut_value']} (remat) == networkx; "
                  f"{row['saved']} saved, {row['recomputed']} recomputed, {row['statements']:,} statements",
                  flush=True)
            rows.append(row)
    columns = COLUMNS + (["nx_sap_ms"] if "shortest_augmenting_path" in args.nx_funcs else [])
    return harness.Result(rows, meta={"graphs": graphs, "networkx": nx.__version__}, columns=columns,
                          title="remat solve (min cut + judge), cold and warm, vs networkx minimum_cut, "
                                "same flow network, median ms")


if __name__ == "__main__":
    raise SystemExit(harness.main(__file__, run, arguments, doc=__doc__))
