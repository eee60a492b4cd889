"""remat's partitioner vs PyTorch's on one captured GPT-2 joint graph (CPU, no kernels).

Captures the joint graph of a GPT-2 training step (transformers config, random weights) as
inductor would partition it, then on copies of that same graph times, alternating:
  - torch: min_cut_rematerialization_partition (whole call), and its choose_saved_values_set;
  - remat: the whole partition as remat.compile runs it (clean-up, capture, solve, lowering of
    the plan's schedule to fw/bw modules), the min cut's choice of the saved set, and the
    whole solve (the choice plus the simulator's check of the plan).
Also reports saved activation bytes and the seeds' cut cost of each choice.

    python benchmarks/bench_partitioner_gpt2.py --layers 12 --embd 768 --seq 256 --repeats 5
"""

from __future__ import annotations

import sys
import statistics
import time

import torch
from torch._functorch import partitioners as P

from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny
from remat.capture import joint as tc
from remat.capture.to_graph import graph_from_joint
from remat.solvers import solve
from remat.lower.backend import _eager_compile
from remat.lower.fx import lower
from remat.lower.options import Options
from remat.lower.partitioner import RematPartitioner
from remat.solvers.mincut.mincut import cut_cost
from remat.bench import harness


def capture_joint(args):
    torch.manual_seed(0)
    lm = gpt2_tiny(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab=args.vocab,
                     positions=args.seq)
    model = GPT2Loss(lm)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    captured = {}

    class Grab(RematPartitioner):
        def __call__(self, gm, joint_inputs, **kwargs):
            captured["gm"] = tc.copy_joint(gm)
            captured["inputs"] = joint_inputs
            captured["kwargs"] = dict(kwargs)
            return tc.torch_mincut(gm, joint_inputs, **kwargs)

    grab = Grab(Options.create(solver="torch-mincut"))
    compiled = torch.compile(model, backend=lambda gm, ex: _eager_compile(gm, ex, grab))
    compiled(ids)
    return captured


def arguments(ap) -> None:
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)


def run(args):

    t0 = time.perf_counter()
    cap = capture_joint(args)
    print(f"captured GPT-2 ({args.layers} layers, n_embd {args.embd}, seq {args.seq}) in "
          f"{time.perf_counter() - t0:.1f} s")
    kwargs = cap["kwargs"]
    kwargs.setdefault("compiler", "inductor")
    n_nodes = len(cap["gm"].graph.nodes)

    choose_times: list[float] = []
    original_choose = P.choose_saved_values_set

    def timed_choose(*a, **k):
        t = time.perf_counter()
        out = original_choose(*a, **k)
        choose_times.append(time.perf_counter() - t)
        return out

    samples = {"torch_partition": [], "torch_choose": [], "remat_partition": [], "remat_choose": [],
               "remat_solve": []}
    results = {}
    for _ in range(args.repeats):
        gm = tc.copy_joint(cap["gm"])
        P.choose_saved_values_set = timed_choose
        try:
            t = time.perf_counter()
            fw, bw = tc.torch_mincut(gm, cap["inputs"], **kwargs)
            samples["torch_partition"].append(time.perf_counter() - t)
        finally:
            P.choose_saved_values_set = original_choose
        samples["torch_choose"].append(choose_times[-1])
        results["torch_saved"] = tc.saved_from_backward(bw)

        gm = tc.copy_joint(cap["gm"])
        t = time.perf_counter()
        joint = tc.prepare_joint(gm, kwargs["num_fwd_outputs"], kwargs.get("static_lifetime_input_indices"))
        graph = graph_from_joint(joint)
        plan = solve(graph, "mincut-conservative")  # the min cut, then the simulator's check
        lower(joint, plan)
        samples["remat_partition"].append(time.perf_counter() - t)
        samples["remat_choose"].append(plan.details["build_seconds"] + plan.details["maxflow_seconds"])
        samples["remat_solve"].append(plan.solve_seconds)
        results["graph"], results["plan"] = graph, plan

    graph, plan = results["graph"], results["plan"]
    torch_saved = [s for s in results["torch_saved"] if s in graph]
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    torch_bytes = sum(graph[s].bytes for s in torch_saved if not graph[s].is_primal)
    row = {
        "fx_nodes": n_nodes, "graph_nodes": len(graph),
        **{f"{k}_ms": round(v, 2) for k, v in med.items()},
        "solve_speedup": round(med["torch_choose"] / med["remat_choose"], 1),
        "partition_speedup": round(med["torch_partition"] / med["remat_partition"], 2),
        "remat_saved_activation_bytes": plan.saved_activation_bytes,
        "torch_saved_activation_bytes": torch_bytes,
        "remat_cut_cost": plan.cost, "torch_cut_cost": cut_cost(graph, torch_saved),
    }
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GPT-2 joint graph, {len(graph)} nodes: partitioner time (median of {args.repeats})")
    table.add_column("")
    table.add_column("PyTorch min-cut", justify="right")
    table.add_column("remat mincut", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("choose saved set (ms)", f"{med['torch_choose']:.1f}", f"{med['remat_choose']:.1f}",
                  f"{row['solve_speedup']}x")
    table.add_row("solve, with the simulator's check (ms)", "", f"{med['remat_solve']:.1f}", "")
    table.add_row("whole partition (ms)", f"{med['torch_partition']:.1f}", f"{med['remat_partition']:.1f}",
                  f"{row['partition_speedup']}x")
    table.add_row("saved activation MiB", f"{torch_bytes / 2**20:.2f}", f"{plan.saved_activation_bytes / 2**20:.2f}",
                  f"{plan.saved_activation_bytes / max(torch_bytes, 1):.3f}")
    table.add_row("cut cost (seeds' model, MiB)", f"{row['torch_cut_cost'] / 2**20:.2f}",
                  f"{plan.cost / 2**20:.2f}", f"{plan.cost / max(row['torch_cut_cost'], 1):.3f}")
    Console(width=110).print(table)
    row.update(layers=args.layers, embd=args.embd, heads=args.heads, vocab=args.vocab, seq=args.seq,
               batch=args.batch, repeats=args.repeats)
    return harness.Result([row], printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
