"""The first eager step of ``remat.checkpoint`` in a fresh process, with the device probes measured
(no stored measurement) and read from disk (stored by an earlier process), side by side.

Each row is one fresh interpreter that builds a small transformers Llama (4 layers, width 64,
batch 8 x 128 tokens, vocabulary 512), calls ``remat.checkpoint(model)`` and times its first
training step (forward and backward; the capture and planning of the blocks included), and counts
the device measurements it made (``remat.cost.calibrate``'s probes: the CPU profile and SAC's
dispatch overhead). All processes share one cache folder (``REMAT_CACHE_DIR``): a first process,
not reported, warms the machine's file caches and stores the probes; then ``measured`` processes
start with its ``probes`` folder deleted and ``stored`` processes with it kept, alternating, so
load on the machine falls on both alike. Every process captures and plans its blocks (the eager
path has no plan cache).

    python benchmarks/probe_cache.py [--processes 3]

Rows: ``benchmarks/results/probe_cache.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from remat.bench import harness

CHILD = """
import json, time
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
from transformers import LlamaConfig, LlamaForCausalLM
import remat
import remat.cost.calibrate as c
made = {{"profile": 0, "sac": 0}}
measure, measure_sac = c._measure, c._measure_sac
def counted(*a, **k):
    made["profile"] += 1
    return measure(*a, **k)
def counted_sac():
    made["sac"] += 1
    return measure_sac()
c._measure, c._measure_sac = counted, counted_sac
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
model = LlamaForCausalLM(cfg).train()
ids = torch.randint(0, 512, (8, 128))
remat.checkpoint(model)
t1 = time.perf_counter()
model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
t2 = time.perf_counter()
model.zero_grad(set_to_none=True)
model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
t3 = time.perf_counter()
print("ROW " + json.dumps({{"first_step_s": round(t2 - t1, 3), "second_step_s": round(t3 - t2, 3),
                           "process_s": round(t3 - t0, 3), "measured_profile": made["profile"],
                           "measured_sac": made["sac"]}}))
"""

COLUMNS = ("mode", "process", "first_step_s", "second_step_s", "process_s", "measured_profile", "measured_sac")


def one(cache: Path, mode: str, threads: int) -> dict:
    if mode == "measured":
        shutil.rmtree(cache / "probes", ignore_errors=True)
    env = {**os.environ, "REMAT_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", CHILD.format(threads=threads)], capture_output=True, text=True, env=env)
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        return {"mode": mode, "status": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return {"mode": mode, **json.loads(rows[-1])}


def arguments(ap) -> None:
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per mode")
    ap.add_argument("--child-threads", type=int, default=1, help="torch threads in each process")


def run(args):
    rows = []
    with tempfile.TemporaryDirectory(prefix="remat-probe-cache-") as d:
        cache = Path(d)
        one(cache, "measured", args.child_threads)  # fills the plan cache (and the probes): not reported
        for i in range(args.processes):
            for mode in ("measured", "stored"):
                rows.append({**one(cache, mode, args.child_threads), "process": i + 1})
                print(harness.markdown_table(rows[-1:], COLUMNS), flush=True)
    summary = []
    for mode in ("measured", "stored"):
        firsts = [r["first_step_s"] for r in rows if r["mode"] == mode and "first_step_s" in r]
        if firsts:
            summary.append({"mode": mode, "process": "median", "first_step_s": statistics.median(firsts)})
    print(harness.markdown_table(rows + summary, COLUMNS))
    return harness.Result(rows + summary, {}, COLUMNS, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__, columns=COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
