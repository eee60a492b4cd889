"""Where a plan's measured peak leaves its prediction: the allocations before the measured peak
beside the simulator's timeline before its own.

One step of ``remat.compile(model, budget=B)`` under CPU inductor, run under the profiler: the
last ``--events`` allocation and free records up to the measured peak, each with the running
total above the step's start; then every statement of the plan's schedule, up to the
simulator's peak, that changes its resident bytes (less what is resident before the step).
Where the two running totals first part is where the memory model misses something; read
inductor's wrapper there (``TORCH_LOGS=output_code``). Models: ``budgets_vs_torch.py``'s
quick ones, ``gptneox`` and the user trials: ``remat.zoo.trials.model_case``, ``predictions.py``'s
cases. Rows (each record printed, measured and predicted): ``benchmarks/results/peak_trace.json``.

    python benchmarks/peak_trace.py --model resnet18 [--budget min] [--threads N]
        [--events 40] [--node NAME]

``--node``: the predicted statements up to that node's first compute instead of the
simulator's peak (where the measured peak is, when the two peaks are at different places).
``--calls``: instead, the measured and predicted bytes at each library call (a matmul, a
convolution) in order, and where their difference first changes: the kernel group before that
call is where the memory model misses something.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import call_totals, memory_events  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402
from remat.plans.simulator import simulate  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.zoo.trials import model_case  # noqa: E402


def arguments(ap) -> None:
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", default="min", help="none, min or a fraction")
    ap.add_argument("--events", type=int, default=40)
    ap.add_argument("--node", default=None, help="trace the prediction up to this node's compute")
    ap.add_argument("--calls", action="store_true", help="compare the bytes at each library call")


def run(args):
    model, make = model_case(args.model, "cpu")
    plans: list = []
    budget = {} if args.budget == "none" else {"budget": args.budget if args.budget == "min" else float(args.budget)}
    fn = remat.compile(model, cache=False, on_plan=lambda g, p: plans.append(p), **budget)
    step = make(fn, model)
    step()
    step()
    if args.calls:
        return harness.Result(_calls(step, plans[0]), printed=True)
    events = memory_events(step, "cpu")
    totals, total = [], 0
    for _, nbytes in events:
        total += nbytes
        totals.append(total)
    peak_at = max(range(len(totals)), key=totals.__getitem__)
    plan = plans[0]
    g = plan.graph
    schedule = plan.schedule()
    sim = simulate(schedule)
    resident = resident_bytes(g)
    print(f"{args.model} budget={args.budget} threads={torch.get_num_threads()}: measured peak "
          f"{totals[peak_at]:,} B, predicted {sim.peak_bytes - resident:,} B "
          f"(graph {g.name!r}, {len(plans)} graph(s); the first is traced)")
    print(f"\nmeasured: the {args.events} records up to the peak (event, bytes, running total)")
    rows = [{"trace": "summary", "measured_peak_bytes": totals[peak_at],
             "predicted_peak_bytes": sim.peak_bytes - resident, "graph": g.name, "graphs": len(plans)}]
    for k in range(max(0, peak_at - args.events + 1), peak_at + 1):
        print(f"  {k:5d} {events[k][1]:+12,} {totals[k]:14,}")
        rows.append({"trace": "measured", "index": k, "change": events[k][1], "total": totals[k]})
    end = sim.peak_statement if args.node is None else next(
        k for k, st in enumerate(schedule.statements) if st.op == "compute" and st.node == args.node)
    print(f"\npredicted: statements up to {args.node or 'the peak'} that change resident bytes (statement, "
          "node, op, change, running total)")
    changes = [k for k in range(end + 1)
               if sim.timeline[k] != (sim.timeline[k - 1] if k else sim.constant_bytes)]
    for k in changes[-args.events:]:
        st = schedule.statements[k]
        before = sim.timeline[k - 1] if k else sim.constant_bytes
        print(f"  {k:5d} {st.op} {st.node} ({g[st.node].op}) {sim.timeline[k] - before:+,} "
              f"{sim.timeline[k] - resident:,}")
        rows.append({"trace": "predicted", "index": k, "statement": st.op, "node": st.node, "op": g[st.node].op,
                     "change": sim.timeline[k] - before, "total": sim.timeline[k] - resident})
    k = sim.peak_statement
    if k == end and sim.peak_bytes != sim.timeline[k]:
        print(f"  {k:5d} (at the peak: {sim.peak_bytes - sim.timeline[k]:,} B of scratch while "
              f"{schedule.statements[k].node} runs)")
    return harness.Result(rows, printed=True)


LIBRARY_CALLS = {"mm": "aten::mm", "addmm": "aten::addmm", "bmm": "aten::bmm", "baddbmm": "aten::baddbmm",
                 "convolution": "aten::convolution", "convolution_backward": "aten::convolution_backward"}
"""Library calls by the graph's op name and the profiler's."""


def _calls(step, plan) -> list[dict]:
    """Measured and predicted bytes at each library call, side by side (``--calls``)."""
    g = plan.graph
    schedule = plan.schedule()
    sim = simulate(schedule)
    resident = resident_bytes(g)
    predicted = [(st.node, sim.timeline[k] - resident) for k, st in enumerate(schedule.statements)
                 if st.op == "compute" and g[st.node].op.split(".")[0] in LIBRARY_CALLS]
    measured = call_totals(step, LIBRARY_CALLS.values())
    print(f"{len(measured)} measured calls, {len(predicted)} predicted (call, measured, node, predicted, "
          "difference; * where the difference changes)")
    last = None
    rows = []
    for (name, m), (node, p) in zip(measured, predicted):
        mark = "*" if last is not None and m - p != last else " "
        last = m - p
        print(f" {mark} {name:28s} {m:12,}  {node:24s} {p:12,} {m - p:+10,}")
        rows.append({"trace": "call", "call": name, "measured": m, "node": node, "predicted": p,
                     "difference": m - p, "changes": mark == "*"})
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
