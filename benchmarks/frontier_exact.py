"""``auto`` under a budget against an exhaustive search over every saved set of small graphs.

For random joint graphs small enough to enumerate (every subset of the forward values as the
saved set, each replayed by the simulator), and budgets of 1.0 ... 0.2 of the activation
memory: is ``auto`` feasible wherever some saved set is, and how much slower (predicted,
fusion-aware) is its plan than the fastest saved set within the budget? ``auto`` may also
return staged schedules (baselines, the MILP) that no saved set expresses, so it can be
faster or reach lower than the exhaustive search.

    python benchmarks/frontier_exact.py [--graphs 40] [--forward 10] [--seed 0]
"""

from __future__ import annotations

import sys
import itertools
import random
import statistics

from remat.errors import InfeasibleBudgetError, PlanError
from remat.graph.graph import Graph, Node
from remat.plans.budget import Budget
from remat.plans.plan import Plan
from remat.solvers import solve
from remat.bench import harness

BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2)
FORWARD = ("pointwise", "pointwise", "pointwise", "reduction", "view", "compute", "random")


def random_graph(rng: random.Random, n_forward: int) -> Graph:
    """A forward chain-with-skips of ``n_forward`` ops over 2 inputs and a param, and a
    backward that reads each forward value and its tangent, as autograd would."""
    nodes = [Node("x", "placeholder", (), role="input", bytes=rng.choice((256, 1024)), category="input"),
             Node("w", "placeholder", (), role="param", bytes=rng.choice((256, 4096)), category="input")]
    fw = ["x", "w"]
    for i in range(n_forward):
        cat = rng.choice(FORWARD)
        k = 1 if cat in ("view", "random") or len(fw) < 2 else rng.choice((1, 2))
        ins = tuple(dict.fromkeys([fw[-1]] + rng.sample(fw, k - 1)))
        size = rng.choice((256, 512, 1024, 2048, 4096))
        flops = size * (64 if cat == "compute" else 1)
        nodes.append(Node(f"f{i}", cat, ins, role="forward", bytes=size, category=cat, flops=flops))
        fw.append(f"f{i}")
    nodes.append(Node("loss", "reduction", (fw[-1],), role="forward", bytes=4, category="reduction",
                      is_output=True))
    nodes.append(Node("tangent", "placeholder", (), role="tangent", bytes=4, category="input"))
    grad = "tangent"
    for i in reversed(range(n_forward)):
        reads = tuple(dict.fromkeys((grad, f"f{i}", *nodes[2 + i].inputs)))
        nodes.append(Node(f"g{i}", "pointwise", reads, role="backward", bytes=nodes[2 + i].bytes,
                          category="pointwise"))
        grad = f"g{i}"
    nodes.append(Node("grad_w", "compute", (grad, "w"), role="backward", bytes=nodes[1].bytes,
                      category="compute", backward_output=True, flops=4096))
    return Graph(nodes, name=f"random{n_forward}")


def exhaustive(g: Graph) -> list[Plan]:
    forward = [n.name for n in g.nodes if n.role == "forward"]
    primals = [n.name for n in g.nodes if n.is_primal]  # held anyway: saving them costs nothing
    plans = []
    for k in range(len(forward) + 1):
        for saved in itertools.combinations(forward, k):
            try:
                p = Plan.from_saved_set(g, primals + list(saved), solver="exhaustive").judge()
            except PlanError:
                continue
            if p.sim.valid:
                plans.append(p)
    return plans


def arguments(ap) -> None:
    ap.add_argument("--graphs", type=int, default=40)
    ap.add_argument("--forward", type=int, default=10, help="forward ops per graph (2**n saved sets)")
    ap.add_argument("--seed", type=int, default=0)


def run(args):
    rng = random.Random(args.seed)
    rows = {b: {"cases": 0, "exact_feasible": 0, "auto_feasible": 0, "missed": 0, "gaps": []}
            for b in BUDGETS}
    for _ in range(args.graphs):
        g = random_graph(rng, args.forward)
        plans = exhaustive(g)
        for b in BUDGETS:
            r = rows[b]
            r["cases"] += 1
            limit = Budget.parse(b).bytes_for(g)
            fits = [p for p in plans if p.peak_bytes <= limit]
            try:
                got = solve(g, "auto", budget=b, time_limit=10)
            except InfeasibleBudgetError:
                got = None
            r["exact_feasible"] += bool(fits)
            r["auto_feasible"] += got is not None
            if fits and got is None:
                r["missed"] += 1
            if fits and got is not None:
                best = min(p.predicted_seconds for p in fits)
                r["gaps"].append(got.predicted_seconds / best - 1.0)
    print(f"{args.graphs} random graphs, {args.forward} forward ops each (seed {args.seed})\n")
    print("| budget | exhaustive feasible | auto feasible | auto infeasible where a saved set fits "
          "| auto time / best saved set: mean | max | share exact |")
    print("|---|---|---|---|---|---|---|")
    for b, r in rows.items():
        gaps = r["gaps"]
        mean = f"{1 + statistics.mean(gaps):.3f}" if gaps else "-"
        worst = f"{1 + max(gaps):.3f}" if gaps else "-"
        exact = f"{sum(abs(x) < 1e-9 for x in gaps)}/{len(gaps)}" if gaps else "-"
        print(f"| {b} | {r['exact_feasible']}/{r['cases']} | {r['auto_feasible']}/{r['cases']} | "
              f"{r['missed']} | {mean} | {worst} | {exact} |")
    out = [{"budget": str(b), "cases": r["cases"], "exact_feasible": r["exact_feasible"],
            "auto_feasible": r["auto_feasible"], "missed": r["missed"],
            "mean_ratio": 1 + statistics.mean(r["gaps"]) if r["gaps"] else None,
            "max_ratio": 1 + max(r["gaps"]) if r["gaps"] else None,
            "exact": sum(abs(x) < 1e-9 for x in r["gaps"]), "compared": len(r["gaps"])} for b, r in rows.items()]
    return harness.Result(out, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
