"""The simulator's two-stream time against times worked out by hand, for a few offload schedules.

The graph is :func:`remat.graph.examples.offload_chain` (x -> f0..f3 -> the tangent -> b3..b0, each op 1
cost unit and 100 bytes; b3 reads f2, b2 f1, b1 f0, b0 x), saved set {x, f0, f1, f2}. f0 is offloaded right
after its compute and freed after f1 (the offloading schedules), reloaded before b1 or b2. The
lowering (:mod:`remat.lower.offload`) waits for the offload at the free and for the reload
before its first reader, so compute stalls there when a copy is slower than the compute it can
hide behind. Each row gives the hand-worked time and stall beside the simulator's prediction;
the script exits 1 if any differ.

    python benchmarks/two_streams.py   # rows: benchmarks/results/two_streams.json
"""

from __future__ import annotations

import sys

from remat.cost.transfer import Link
from remat.graph.examples import offload_chain as chain
from remat.graph.examples import offload_chain_statements
from remat.graph.graph import Graph
from remat.plans.schedule import Schedule
from remat.plans.simulator import simulate
from remat.bench import harness


def offloading(g: Graph, reload_before: str | None) -> Schedule:
    return Schedule.from_list(g, offload_chain_statements(reload_before))


# (name, reload before, copy time, hand-worked step time, hand-worked stall at the free, why)
CASES = [
    ("no offload", None, None, 8.0, 0.0, "8 computes of 1"),
    ("copy 0.5, reload before b2", "b2", 0.5, 8.0, 0.0,
     "offload 1-1.5 ends before the free at 2; reload 6-6.5 hides behind b2 (6-7), b1 reads f0 at 7"),
    ("copy 1, reload before b1", "b1", 1.0, 9.0, 0.0,
     "offload 1-2 ends at the free; reload 6-7 starts when b2 ends, b1 waits for it: 7-8"),
    ("copy 2, reload before b2", "b2", 2.0, 10.0, 1.0,
     "offload 1-3: compute stalls at the free from 2 to 3; reload 6-8 beside b2 (6-7); b1 waits: 8-9"),
    ("copy 10, reload before b1", "b1", 10.0, 27.0, 9.0,
     "offload 1-11: stall 2-11; f2, f3, b3, b2 run 11-15; reload 15-25; b1, b0 run 25-27"),
]


def arguments(ap) -> None:
    pass


def run(args):
    g = chain()
    rows, bad = [], 0
    print("| schedule | hand: step | simulated | hand: stall at free | simulated | copy stream busy | why (by hand) |")
    print("|---|---|---|---|---|---|---|")
    for name, before, copy, want, want_stall, why in CASES:
        link = Link(100.0 / copy) if copy else Link(float("inf"))
        r = simulate(offloading(g, before), link=link)
        stall = sum(b - a for kind, a, b in r.times if kind == "wait")
        ok = r.valid and abs(r.predicted_seconds - want) < 1e-9 and abs(stall - want_stall) < 1e-9
        bad += not ok
        rows.append({"schedule": name, "hand_step": want, "simulated_step": r.predicted_seconds,
                     "hand_stall": want_stall, "simulated_stall": stall, "copy_busy": r.copy_seconds,
                     "peak_bytes": r.peak_bytes, "agrees": ok})
        print(f"| {name} | {want:g} | {r.predicted_seconds:g} | {want_stall:g} | {stall:g} | "
              f"{r.copy_seconds:g} | {why}{'' if ok else ' **DIFFERS**'} |")
    return harness.Result(rows, printed=True, status=1 if bad else 0)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
