"""Offloading on the training graphs captured on an H100, predicted (issue 11; no GPU lent).

GPT-2 small and a Llama-3.2-1B-wide model at batch 8 x 1024 in bf16 (``benchmarks/data/h100``,
captured on the one GPU lease this project had), planned offline with the H100 bf16 profile,
inductor's fused memory and the H100's measured pinned link (54 GB/s,
:data:`remat.cost.transfer.H100_LINK`). For each budget (a fraction of the step's activation
memory), the simulator's predicted step time over the step without recomputation, and the
predicted peak's fraction:

- ``recompute``: ``auto`` without offloading (remat's fusion-aware planner);
- ``torch offload``: what PyTorch's activation offloading does, simulated: the step without
  recomputation with every saved activation offloaded after its compute and reloaded before
  its first backward read (prefetched as far as hides the copy): one point, whatever the budget;
- ``swap``: remat's swapping alone; ``swap+recompute``: the two chosen together.

MAGIS's published reference points (seeds/004 Fig. 10, on an RTX 3090): <= 5% overhead at 80%
of PyTorch's peak, <= 15% at 40%. Prints Markdown.

    python benchmarks/swap_h100_graphs.py [--models gpt2,llama] [--budgets 0.8,0.4]

Rows (one per model and budget): ``benchmarks/results/swap_h100_graphs.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from remat.bench import h100, harness
from remat.cost.model import CostModel, default_cost_model
from remat.cost.transfer import link_for_graph
from remat.errors import InfeasibleBudgetError
from remat.plans.budget import activation_bytes, reference_schedule, resident_bytes
from remat.plans.phases import split_schedule
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.solvers.portfolio import portfolio
from remat.solvers.magis.swap import gaps, offload


def offload_all(s, link, cm):
    """Every saved activation offloaded across the forward/backward cut."""
    g = s.graph
    saved = [n for n in split_schedule(s).saved if not g[n].is_primal]
    for v in saved:
        cut = next(k for k, st in enumerate(s.statements)
                   if st.op == "compute" and g[st.node].role in ("tangent", "backward"))
        gap = next((gp for gp in gaps(s) if gp.node == v and gp.after < cut < gp.before), None)
        if gap is not None:
            s = offload(s, gap, link, cm)
    return s


DATA = Path(__file__).parent / "data" / "h100"


def arguments(ap) -> None:
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--budgets", default="0.8,0.6,0.4,0.2")
    ap.add_argument("--time-limit", type=float, default=60.0)


def run(args):
    rows = []
    for name in args.models.split(","):
        g = h100.graph(DATA, name)
        cm = CostModel(default_cost_model(g).device, fused_memory=True)
        link = link_for_graph(g, cm)
        ref = reference_schedule(g)
        base = simulate(ref, cm)
        res, act = resident_bytes(g), activation_bytes(g)

        def cell(p):
            if p is None:
                return "-"
            return f"{p.predicted_seconds / base.predicted_seconds:.3f} ({(p.peak_bytes - res) / act:.2f})"
        off = simulate(offload_all(ref, link, cm), cm, link=link)
        print(f"\n### {name} ({len(g)} nodes, {cm.device.name}, link {link.bandwidth / 1e9:.0f} GB/s; "
              f"no recomputation: {base.predicted_seconds * 1e3:.1f} ms predicted)\n")
        print(f"PyTorch-style offload of every saved activation: {off.predicted_seconds / base.predicted_seconds:.3f} "
              f"of the time at {(off.peak_bytes - res) / act:.2f} of the memory "
              f"({off.offloads} values, compute waits {off.wait_seconds * 1e3:.1f} ms).\n")
        print("| budget | recompute | swap | swap+recompute | swaps | seconds |\n|---|---|---|---|---|---|")
        for b in [float(x) for x in args.budgets.split(",")]:
            t0 = time.perf_counter()
            limit = int(res + b * act)
            rec = portfolio(g, limit, cm, args.time_limit / 2, swapping=False)
            rec = rec if rec.feasible else None
            row = [cell(rec)]
            sr = None
            for solver in ("swap", "swap-recompute"):
                try:
                    p = solve(g, solver, budget=b, cost_model=cm, time_limit=args.time_limit)
                except InfeasibleBudgetError:
                    p = None
                row.append(cell(p))
                sr = p
            print(f"| {b} | {' | '.join(row)} | {sr.details.get('swaps', 0) if sr else '-'} | "
                  f"{time.perf_counter() - t0:.0f} |", flush=True)
            rows.append({"model": name, "nodes": len(g), "budget": b, "cells": dict(zip(
                ("recompute", "swap", "swap_recompute"), row)), "swaps": sr.swaps if sr else None,
                "torch_offload_time_ratio": off.predicted_seconds / base.predicted_seconds,
                "torch_offload_fraction": (off.peak_bytes - res) / act, "seconds": time.perf_counter() - t0})
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
