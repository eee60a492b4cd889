"""remat's partitioner with Python's cyclic collector paused (as it runs) and running, side by side.

Inside a compile the heap is torch's, and every full collection scans all of it; the
partitioner pauses the collector while it plans (``RematPartitioner.__call__``, ``gc_paused``).
This script measures what that buys: for each depth and method, one fresh interpreter per mode
(caches off, as ``benchmarks/planner_scale.py --llama``) runs the first call of the transformers
Llama of :func:`remat.bench.first_call.llama`, with ``remat.lower.partitioner.gc_paused``
as committed (``paused``) or replaced by a context that does nothing (``running``). Columns: the
first call, remat's partition (``partition_s``) and its reference / solve parts, the full
(generation 2) collections counted inside the partitioner and their seconds
(``gc.callbacks``), all full collections of the process, and peak RSS.

    python benchmarks/gc_pause.py                       # depths 16 and 32, "remat min" and "remat 0.5"
    python benchmarks/gc_pause.py --depths 32 --methods "remat min"

Rows: ``benchmarks/results/gc_pause.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from remat.bench import harness

CHILD = """
import contextlib, gc, json, time, torch
torch.set_num_threads(1)
import remat.lower.partitioner as P
if {mode!r} == "running":
    P.gc_paused = contextlib.nullcontext
inside = {{"on": False}}
counts = {{"inside": [0, 0.0], "all": [0, 0.0]}}
start = {{}}
def clock(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        start["t"] = time.perf_counter()
        return
    d = time.perf_counter() - start["t"]
    counts["all"][0] += 1; counts["all"][1] += d
    if inside["on"]:
        counts["inside"][0] += 1; counts["inside"][1] += d
gc.callbacks.append(clock)
call = P.RematPartitioner.__call__
def marked(self, *a, **k):
    inside["on"] = True
    try:
        return call(self, *a, **k)
    finally:
        inside["on"] = False
P.RematPartitioner.__call__ = marked
from remat.bench.first_call import first_call
row = first_call({depth}, {method!r}, "eager", None, None)
row.update(mode={mode!r}, gc_inside=counts["inside"][0], gc_inside_s=round(counts["inside"][1], 2),
           gc_all=counts["all"][0], gc_all_s=round(counts["all"][1], 2))
print("ROW " + json.dumps(row))
"""

COLUMNS = ("depth", "method", "mode", "first_s", "partition_s", "reference_s", "solve_s", "gc_inside", "gc_inside_s",
           "gc_all", "gc_all_s", "rss_mb")


def one(depth: int, method: str, mode: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "REMAT_CACHE_DIR": "off"}
    out = subprocess.run([sys.executable, "-c", CHILD.format(depth=depth, method=method, mode=mode)],
                         capture_output=True, text=True, env=env)
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        return {"depth": depth, "method": method, "mode": mode, "status": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(rows[-1])


def arguments(ap) -> None:
    ap.add_argument("--depths", default="16,32", help="Llama depths, comma-separated")
    ap.add_argument("--methods", default="remat min,remat 0.5", help="methods of remat.bench.first_call.METHODS")


def run(args):
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        for method in (m.strip() for m in args.methods.split(",")):
            for mode in ("running", "paused"):  # one after the other, so load hits both alike
                rows.append(one(depth, method, mode))
                print(harness.markdown_table(rows[-1:], COLUMNS), flush=True)
    print(harness.markdown_table(rows, COLUMNS))
    return harness.Result(rows, {}, COLUMNS, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__, columns=COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
