"""Re-ordering for peak memory (remat.transforms.reorder, MAGIS Section 6.1): simulated peaks
before and after, on Checkmate's graphs and on the zoo's captured graphs.

For each graph, two schedules: ``no-recompute`` (the saved set is every forward value the
backward reads, primal inputs included; on a captured graph, PyTorch's own partition without
recomputation that capture records, :func:`remat.plans.budget.reference_saved`) and
``mincut-conservative`` (the plan's schedule). Each is re-ordered by :func:`reorder` under the
graph's cost model (:func:`remat.cost.model.default_cost_model`: fused memory for a graph
captured under inductor); the peaks are the simulator's, the seconds those ``reorder`` took.
Checkmate's random layered graphs are forward-only DAGs (no backward): both schedules are the
same forward.

    python benchmarks/reorder_table.py [--zoo mlp,gpt2,...|none]
        [--compiler eager|inductor] [--size tiny] [--block 20] [--synthetic 2000]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
import time  # noqa: E402

from remat.data import CHECKMATE_DIR
from remat.cost.model import default_cost_model  # noqa: E402
from remat.graph.io import load_graph  # noqa: E402
from remat.graph.synthetic import synthetic_joint_graph  # noqa: E402
from remat.plans.budget import reference_saved  # noqa: E402
from remat.plans.schedule import schedule_from_saved_set  # noqa: E402
from remat.plans.simulator import simulate  # noqa: E402
from remat.solvers import solve  # noqa: E402
from remat.transforms.reorder import reorder  # noqa: E402
from remat.bench import harness  # noqa: E402

CHECKMATE = CHECKMATE_DIR
ZOO = "mlp,transformer-encoder,gpt2,bert,vit,resnet18,mobilenetv2"


def no_recompute_saved(g) -> list[str]:
    """Every forward value (primal inputs included) a backward node reads."""
    reads = {i for n in g.nodes if n.role in ("tangent", "backward") for i in n.inputs}
    return [n.name for n in g.nodes if n.is_forward and n.name in reads]


def rows(name: str, g, mincut_schedule, block: int):
    cm = default_cost_model(g)
    saved = reference_saved(g)
    cases = [("no-recompute", schedule_from_saved_set(g, saved if saved is not None else no_recompute_saved(g))),
             ("mincut-conservative", mincut_schedule)]
    for label, s in cases:
        before = simulate(s, cm, timeline=False)
        t = time.perf_counter()
        r = reorder(s, cm, block=block)
        seconds = time.perf_counter() - t
        after = simulate(r, cm, timeline=False)
        assert after.valid and after.peak_bytes <= before.peak_bytes
        cut = 100 * (before.peak_bytes - after.peak_bytes) / before.peak_bytes
        yield (f"| {name} | {len(g)} | {label} | {before.peak_bytes:,} | {after.peak_bytes:,} | "
               f"{cut:.2f} | {seconds:.2f} |")


def checkmate_graphs():
    for path in sorted(CHECKMATE.glob("*.json")):
        if path.name.endswith("train_nx.json") or path.name.startswith("random_layered"):
            yield path.name.removesuffix(".json"), load_graph(path)


def zoo_graphs(names: list[str], compiler: str, size: str):
    import torch

    import remat
    from remat.zoo import registry

    for name in names:
        torch.manual_seed(0)
        case = registry.build(name, size)
        got: list = []
        fn = remat.compile(case.model, compiler=compiler, solver="mincut-conservative", cache=False,
                           dynamic=False, on_plan=lambda g, p: got.append((g, p)))
        case.loss(fn(*case.inputs)).backward()
        torch._dynamo.reset()
        for k, (g, p) in enumerate(got):
            yield f"{name} ({size}, {compiler}){'' if len(got) == 1 else f' #{k}'}", g, p.schedule(g)


def arguments(ap) -> None:
    ap.add_argument("--zoo", default=ZOO, help="zoo models to capture (comma-separated), or none")
    ap.add_argument("--compiler", default="eager", help="remat.compile's compiler for the zoo")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--no-checkmate", action="store_true")
    ap.add_argument("--synthetic", default="", help="synthetic joint graphs of these node counts too (comma-separated)")


def run(args):
    print("| graph | nodes | schedule | peak before (B) | peak after (B) | reduction (%) | reorder (s) |")
    print("|---|---|---|---|---|---|---|")
    out: list[dict] = []
    if not args.no_checkmate:
        for name, g in checkmate_graphs():
            for line in rows(name, g, solve(g, "mincut-conservative").schedule(), args.block):
                print(line, flush=True)
                out.append(_row(line))
    for n in filter(None, args.synthetic.split(",")):
        g = synthetic_joint_graph(int(n), seed=0)
        for line in rows(f"synthetic {n}", g, solve(g, "mincut-conservative").schedule(), args.block):
            print(line, flush=True)
            out.append(_row(line))
    if args.zoo != "none":
        t = time.perf_counter()
        for name, g, s in zoo_graphs(args.zoo.split(","), args.compiler, args.size):
            for line in rows(name, g, s, args.block):
                print(line, flush=True)
                out.append(_row(line))
        print(f"\nzoo capture and rows: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return harness.Result(out, printed=True)


COLUMNS = ("graph", "nodes", "schedule", "peak_before_bytes", "peak_after_bytes", "reduction_pct", "reorder_s")


def _row(line: str) -> dict:
    """A printed Markdown row as a JSON row (numbers parsed)."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    row: dict = {}
    for k, c in zip(COLUMNS, cells):
        try:
            row[k] = int(c.replace(",", ""))
        except ValueError:
            try:
                row[k] = float(c)
            except ValueError:
                row[k] = c
    return row


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
