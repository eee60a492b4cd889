"""Checkmate's maximum-batch-size experiment (seeds/001 Section 6.4, Figure 6) with remat's solvers.

For each graph and solver: the largest batch size whose training step fits a 16 GB V100 at a
cost of at most one extra forward pass (paper eq. 10: cost <= 2 * forward + backward, i.e.
cost(no recomputation) + cost(forward)). The graph is rebuilt at each batch size probed
(:func:`remat.graph.batch.scale_batch`: every value's bytes and every cost scale with the
batch) and the solver re-run; :func:`remat.bench.max_batch.max_batch` gallops from a start batch
and bisects. A probe is feasible when the solver returns a simulator-checked schedule within
the budget whose cost is within the limit (every solver returns the cheapest schedule it
finds within the budget, so an over-limit answer means it has none within both).

The setup follows the MLSys 2020 artifact (``experiments/experiment_max_batchsize_{ilp,
baseline}.py``, ``platforms.py``):

- GPU memory ``16 * 1000**3`` bytes (``platform_memory("p32xlarge")``), minus the fixed
  ``M_fixed = 2 * M_param`` (parameters and their gradients, ``g.cost_ram_fixed``): the
  Checkmate graphs carry no parameter nodes, so the budget given to the solvers is
  ``16e9 - 2 * 4 * params``, with the Keras model's parameter count (:data:`PARAMS`; VGG19:
  143,667,240). Graphs whose count is not known here get ``M_param = 0`` (said in the output).
- The input image batch (``data``, ``B*224*224*3`` float32; added by remat's loader) is *not*
  charged by the artifact's max-batch MILP (its memory is ``B * (sum of node sizes)`` with no
  input term). ``--input artifact`` (default) gives it zero bytes; ``--input remat`` keeps it
  (remat's model: inputs are resident constant overhead); ``--input both`` runs both.

Solvers: checkpoint-all, chen-sqrtn, chen-greedy, griewank (the baselines, no time limit),
checkmate (the MILP, ``--time-limit`` seconds per solve, default 60) and checkmate-lp (two-phase
LP rounding, same limit). The baselines start at the graph's own batch; the MILP and LP start
from the best baseline's result (``--no-warm-start``: the graph's batch), which only saves
probes. A MILP probe that hit its time limit without a schedule within the limits and without
a proof that none exists is *undecided*: it counts as infeasible and the result is flagged;
after ``--max-undecided`` (default 2) undecided probes in a row the search stops.

Published (Checkmate artifact README, VGG19): checkpoint-all 167, Chen sqrt(n) 197, Chen greedy
266, Checkmate MILP 289 (proved optimal); MILP lower bounds for the others: U-Net 57, FCN8 60,
SegNet 62, ResNet50 193, MobileNet 1105 (``src/remat/data/checkmate/README.md``).

    python benchmarks/max_batch_checkmate.py                    # VGG19
    python benchmarks/max_batch_checkmate.py --graphs VGG19 VGG16 --input both
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from remat.data import CHECKMATE_DIR
from remat.solvers import info
from remat.graph.graph import Graph
from remat.graph.io import load_graph
from remat.graph.batch import base_batch_of
from remat.bench.max_batch import max_batch, one_forward_overhead
from remat.bench import harness

ROOT = Path(__file__).resolve().parents[1]
GRAPH_DIR = CHECKMATE_DIR

GPU_BYTES = 16 * 1000**3
"""The artifact's ``platform_memory("p32xlarge")``: a 16 GB V100, in decimal bytes."""

PARAMS = {"VGG16": 138_357_544, "VGG19": 143_667_240, "MobileNet": 4_253_864,
          "ResNet50": 25_636_712}
"""Parameter counts of the Keras application models (ImageNet heads, 224x224x3), float32."""

PUBLISHED = {
    "VGG19": {"checkpoint-all": 167, "chen-sqrtn": 197, "chen-greedy": 266, "checkmate": 289},
    "vgg_unet": {"checkmate": 57}, "fcn_8_vgg": {"checkmate": 60}, "segnet": {"checkmate": 62},
    "ResNet50": {"checkmate": 193}, "MobileNet": {"checkmate": 1105},
}
"""The artifact's maximum batch sizes (VGG19 proved optimal; the others are the MILP's best
after its time limit, lower bounds)."""

SOLVERS = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank", "checkmate", "checkmate-lp")
TIMED = ("checkmate", "checkmate-lp")


def graph_path(model: str) -> Path:
    hits = sorted(p for p in GRAPH_DIR.glob(f"{model}_*_train_nx.json")
                  if p.name.removeprefix(model + "_")[:1].isdigit())
    if not hits:
        raise SystemExit(f"no Checkmate graph for {model!r} in {GRAPH_DIR}")
    return hits[0]


def without_input_bytes(g: Graph) -> Graph:
    """``g`` with its input values at zero bytes (the artifact's max-batch memory model)."""
    return Graph([n.replace(bytes=0) if n.role == "input" else n for n in g.nodes], name=g.name)


def run_graph(model: str, input_mode: str, solvers: list[str], time_limit: float, gpu_bytes: float,
        warm_start: bool, max_probes: int | None, max_undecided: int | None = 2, log=print) -> dict:
    path = graph_path(model)
    g = load_graph(path)
    base = base_batch_of(g.name)
    if input_mode == "artifact":
        g = without_input_bytes(g)
    params = PARAMS.get(model)
    fixed = 2 * 4 * (params or 0)
    budget = gpu_bytes - fixed
    limit = one_forward_overhead(g)
    out = {"model": model, "graph": path.name, "input": input_mode, "base_batch": base,
           "params": params, "fixed_bytes": fixed, "gpu_bytes": gpu_bytes, "budget_bytes": budget,
           "max_overhead": limit, "time_limit": time_limit, "solvers": {}}
    log(f"\n{model} ({path.name}), input {input_mode}: budget {budget:.6g} B = {gpu_bytes:.3g} - "
        f"2 x {params or 0} params x 4 B; cost limit {limit:.4f} x no-recompute cost")
    best_baseline = None
    for s in solvers:
        fn = info(s).fn
        solve = (lambda gg, b, fn=fn: fn(gg, b, time_limit=time_limit)) if s in TIMED else fn
        start = best_baseline if (s in TIMED and warm_start and best_baseline) else base

        def show(p, s=s):
            log(f"  {s:15s} batch {p.batch:5d}: {'ok ' if p.feasible else 'no '} {p.status:12s} "
                + (f"overhead {p.overhead:.3f} " if p.overhead is not None else "")
                + f"{p.seconds:6.1f} s" + (" UNDECIDED (time limit)" if p.undecided else ""))

        r = max_batch(g, solve, budget, limit, base_batch=base, start=start,
                      max_probes=max_probes, max_undecided=max_undecided, on_probe=show)
        d = r.to_dict()
        d["time_limit_hits"] = sorted(p.batch for p in r.probes
                                      if p.status == "time_limit" or p.undecided)
        d["statuses_at_result"] = next((p.status for p in r.probes if p.batch == r.batch), None)
        out["solvers"][s] = d
        if s not in TIMED and r.batch > 0:
            best_baseline = max(best_baseline or 0, r.batch)
        log(f"  {s:15s} => max batch {r.batch}" + ("" if r.exact else " (not exact)")
            + f", {len(r.probes)} probes, {r.seconds:.1f} s")
    return out


def markdown(results: list[dict]) -> str:
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        rs = [r for r in results if r["model"] == model]
        pub = PUBLISHED.get(model, {})
        modes = [r["input"] for r in rs]
        head = ("| solver | " + " | ".join(f"ours ({m} input)" for m in modes)
                + " | published (artifact) | ours / checkpoint-all (first column) | published / checkpoint-all |")
        r0 = rs[0]
        lines += [f"### {model}: maximum batch size, {r0['gpu_bytes'] / 1e9:g} GB budget minus "
                  f"2 x params ({r0['fixed_bytes'] / 1e9:.3f} GB), cost <= {r0['max_overhead']:.3f}"
                  " x no-recompute", "", head, "|" + "---|" * (len(modes) + 4)]
        for s in rs[0]["solvers"]:
            cells = []
            for r in rs:
                d = r["solvers"].get(s)
                if d is None:
                    cells.append("")
                    continue
                c = str(d["batch"])
                if d["batch"] == 0 and d["undecided"]:
                    c = (f"— (undecided: no schedule within the cost limit found in the time "
                         f"limit at batch {', '.join(map(str, d['undecided']))})")
                elif not d["exact"]:
                    c += f" (bracket {d['batch']}..{d['infeasible_batch']}"
                    c += ", time limit hit)" if d["undecided"] else ")"
                cells.append(c)
            ca = rs[0]["solvers"].get("checkpoint-all", {}).get("batch")
            ours = rs[0]["solvers"][s]["batch"]
            p, pa = pub.get(s), pub.get("checkpoint-all")
            lines.append(f"| {s} | " + " | ".join(cells) + f" | {p if p is not None else '—'} | "
                         + (f"{ours / ca:.2f}" if ca else "—") + " | "
                         + (f"{p / pa:.2f}" if p and pa else "—") + " |")
        lines.append("")
    return "\n".join(lines)


def arguments(ap) -> None:
    ap.add_argument("--graphs", nargs="*", default=["VGG19"],
                    help="model names (file prefixes): VGG19 VGG16 MobileNet ResNet50 vgg_unet ...")
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--input", choices=("artifact", "remat", "both"), default="artifact",
                    help="artifact: the data input takes no memory (as the artifact's MILP); "
                         "remat: it is resident; both: run each")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per-solve limit for the MILP/LP (s)")
    ap.add_argument("--gpu-bytes", type=float, default=GPU_BYTES)
    ap.add_argument("--max-probes", type=int, default=None, help="cap on solves per search")
    ap.add_argument("--max-undecided", type=int, default=2,
                    help="stop a search after this many time-limited (undecided) probes in a row")
    ap.add_argument("--no-warm-start", action="store_true")
    ap.add_argument("--md", default=str(ROOT / "out" / "max_batch_checkmate.md"))


def run(args):
    t0 = time.perf_counter()
    solvers = args.solvers.split(",")
    modes = ["artifact", "remat"] if args.input == "both" else [args.input]
    results = [run_graph(m, mode, solvers, args.time_limit, args.gpu_bytes, not args.no_warm_start,
                   args.max_probes, args.max_undecided, log=lambda s: print(s, file=sys.stderr, flush=True))
               for m in args.graphs for mode in modes]
    md = markdown(results)
    total = time.perf_counter() - t0
    print(md)
    print(f"total {total:.0f} s")
    Path(args.md).parent.mkdir(parents=True, exist_ok=True)
    Path(args.md).write_text(md + f"\ntotal runtime {total:.0f} s\n")
    return harness.Result(results, {"seconds": total}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
