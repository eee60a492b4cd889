"""The plan cache across processes, as a user meets it (issue 38): an out-of-reach fraction planned
once, and a corrupt cache file that costs one re-plan, not remat.

A transformers Qwen2 (4 layers x 128, vocabulary 4096, 4 x 256 tokens) under
``remat.compile(budget=0.2, compiler="eager")``: the fraction is out of reach, so the step runs
at the least memory remat finds, with a warning. One process per run, all sharing one
``$REMAT_CACHE_DIR``: run 1 plans and stores the plan that ran; run 2 loads it; then every cache
file is overwritten with bytes that are not UTF-8, and run 3 plans again (a
``RematCacheWarning``, the budget applied: no fallback) and replaces them; run 4 loads again.

    python benchmarks/plan_cache_trial.py [--budget 0.2]

Columns: the first step's seconds (capture, planning and the step), the planner's seconds (the
plans' ``solve_seconds``), the cache's answer, whether the plan is the out-of-reach one
(``plan.out_of_reach``), and the warnings: budget, cache, fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from remat.bench import harness

COLUMNS = ("run", "what", "first_step_s", "planning_s", "cache", "out_of_reach", "budget_warnings",
           "cache_warnings", "fallback_warnings")

_STEP = r"""
import json, time, warnings, torch, transformers, remat
torch.manual_seed(0)
cfg = transformers.Qwen2Config(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                               use_cache=False)
lm = transformers.Qwen2ForCausalLM(cfg)
lm.loss_type = "ForCausalLM"
ids = torch.randint(0, 4096, (4, 256))
plans = []
f = remat.compile(lm, budget=BUDGET, compiler="eager", on_plan=lambda g, p: plans.append(p))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    t = time.perf_counter()
    f(input_ids=ids, labels=ids).loss.backward()
    first = time.perf_counter() - t
count = lambda c: sum(issubclass(w.category, c) for w in seen)
print(json.dumps({"first_step_s": first, "planning_s": sum(p.solve_seconds for p in plans),
                  "cache": ",".join(str(p.cache) for p in plans),
                  "out_of_reach": all(p.out_of_reach is not None for p in plans),
                  "budget_warnings": count(remat.RematBudgetWarning), "cache_warnings": count(remat.RematCacheWarning),
                  "fallback_warnings": count(remat.RematFallbackWarning)}))
"""


def arguments(ap) -> None:
    ap.add_argument("--budget", default="0.2")


def _run(cache: Path, budget: str) -> dict:
    env = {**os.environ, "REMAT_CACHE_DIR": str(cache), "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
           "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    r = subprocess.run([sys.executable, "-c", _STEP.replace("BUDGET", repr(float(budget)))], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(args):
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d)
        for k, what in enumerate(["plans, stores the plan that ran", "loads it"], 1):
            rows.append({"run": k, "what": what, **_run(cache, args.budget)})
        for p in cache.glob("*.json"):
            p.write_bytes(b"\xff\xfe not a plan")
        for k, what in enumerate(["after every cache file was corrupted", "loads again"], 3):
            rows.append({"run": k, "what": what, **_run(cache, args.budget)})
    print(harness.markdown_table(rows, COLUMNS))
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
