"""A user's trial of ``remat.checkpoint`` on a model no test names (issue 32): a transformers
Qwen2 (random weights; 4 layers, hidden 128, ff 512, vocab 1024, batch 4 x 256 tokens),
trained eagerly. Rows, each on its own copy of the same weights, measured the same way in one
run (peak above the step's start from the profiler's allocation records, one alternating
timing loop, gradients after one step against no checkpointing's): no checkpointing,
transformers' ``gradient_checkpointing_enable()`` (full checkpointing), and
``remat.checkpoint(model, budget=...)`` at 0.8, 0.5 and ``"min"``.

    python benchmarks/eager_user_trial.py [--repeats 5]

Writes ``benchmarks/results/eager_user_trial.json``."""

from __future__ import annotations

import copy
import sys
import warnings

import torch

import remat
from remat.eager.blocks import enable_transformers_checkpointing
from remat.bench import harness
from remat.bench.measure import peak_memory, step_time


def build():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      use_cache=False)
    model = Qwen2ForCausalLM(cfg).train()
    ids = torch.randint(0, 1024, (4, 256))
    return model, ids


def arguments(ap) -> None:
    ap.add_argument("--repeats", type=int, default=5)
    ap.set_defaults(threads=1)


def run(args) -> harness.Result:
    base, ids = build()
    models, notes = {}, {}
    for name in ("none", "hf full", "remat 0.8", "remat 0.5", "remat min"):
        m = copy.deepcopy(base)
        if name == "hf full":
            enable_transformers_checkpointing(m, use_reentrant=False)
        elif name.startswith("remat"):
            b = name.split()[1]
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                remat.checkpoint(m, budget=b if b == "min" else float(b))
                m(input_ids=ids, labels=ids).loss.backward()  # plans at the first call
            notes[name] = [str(x.message)[:120] for x in w if "remat" in type(x.message).__module__]
        models[name] = m

    def step_of(m):
        def step():
            m.zero_grad(set_to_none=False)
            m(input_ids=ids, labels=ids).loss.backward()
        return step

    steps = {k: step_of(m) for k, m in models.items()}
    peaks = {k: peak_memory(s).peak_bytes for k, s in steps.items()}
    times = step_time(steps, repeats=args.repeats)
    ref = {n: p.grad for n, p in models["none"].named_parameters()}
    rows = []
    for k, m in models.items():
        err = max(float((p.grad - ref[n]).abs().max()) for n, p in m.named_parameters())
        rows.append({"method": k, "peak_bytes": peaks[k], "fraction": peaks[k] / peaks["none"],
                     "ratio": times[k].median_s / times["none"].median_s, "grad_max_abs_diff": err,
                     "warnings": notes.get(k, [])})
        print(f"{k:>10}: peak {peaks[k] / 1e6:7.2f} MB ({rows[-1]['fraction']:.3f})  time "
              f"{rows[-1]['ratio']:.2f}x  grad diff {err:.1e}")
    for k, m in models.items():
        if k.startswith("remat") and hasattr(m, "remat_summary"):
            print(f"\n{k}:\n{m.remat_summary()}")
    return harness.Result(rows, {"model": "Qwen2 4 x 128, batch 4 x 256"}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
