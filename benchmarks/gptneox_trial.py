"""A user trial on a model no test names: GPT-NeoX (Pythia-like: parallel residual, rotary),
called as a user calls it, beside PyTorch's own memory-budget knob, under CPU inductor.

``model(input_ids=ids, labels=ids)`` returns the logits and the key/value caches beside the
loss, so the compiled graph has outputs the loss does not use. By default the step drops the
output before the backward (``model(...).loss.backward()``); ``--hold-outputs`` keeps it
through the backward (``out = model(...); out.loss.backward()``), as most training loops do.
Prints measured peaks above the step's start (profiler), remat's prediction, and step-time
medians from one alternating loop; checks remat's gradients against eager.

    PYTHONPATH=src python benchmarks/gptneox_trial.py [--hold-outputs] [--repeats 5]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import argparse  # noqa: E402

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import peak_memory, step_time  # noqa: E402
from remat.plans.budget import resident_bytes  # noqa: E402


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128, use_parallel_residual=True,
                        attention_dropout=0.0, hidden_dropout=0.0)
    return GPTNeoXForCausalLM(cfg).train()


def make(fn, model, ids, hold: bool):
    def step():
        model.zero_grad(set_to_none=False)
        if hold:
            out = fn(input_ids=ids, labels=ids)
            out.loss.backward()
        else:
            fn(input_ids=ids, labels=ids).loss.backward()
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hold-outputs", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ids = torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1))
    reference = build()
    reference(input_ids=ids, labels=ids).loss.backward()
    ref_grads = [p.grad.clone() for p in reference.parameters()]
    rows: dict = {}

    def add(label, fn, model, predicted=None):
        step = make(fn, model, ids, args.hold_outputs)
        step()
        rows[label] = (step, peak_memory(step, "cpu", warmup=1, timeline=False).peak_bytes, predicted)
        return model

    torch._dynamo.reset()
    m = build()
    add("torch.compile (no budget)", torch.compile(m), m)
    for b in (0.8, 0.6, 0.4):
        torch._dynamo.reset()
        m = build()
        with functorch_config.patch(activation_memory_budget=b):
            add(f"knob {b}", torch.compile(m), m)
    for b in (None, 0.8, 0.6, 0.4, "min"):
        torch._dynamo.reset()
        m, plans = build(), []
        try:
            fn = remat.compile(m, budget=b, on_plan=lambda g, p: plans.append(p))
            make(fn, m, ids, args.hold_outputs)()
        except remat.InfeasibleBudgetError as e:
            print(f"remat {b}: infeasible, smallest feasible {e.smallest_feasible} bytes with parameters")
            continue
        add(f"remat {b}", fn, m)
        rows[f"remat {b}"] = rows[f"remat {b}"][:2] + (sum(p.peak_bytes - resident_bytes(p.graph) for p in plans),)
        err = max((p.grad - r).abs().max().item() for p, r in zip(m.parameters(), ref_grads))
        print(f"remat {b}: gradient max error against eager {err:.1e}", flush=True)
    times = step_time({k: v[0] for k, v in rows.items()}, repeats=args.repeats, warmup=1, device="cpu")
    base_peak = rows["torch.compile (no budget)"][1]
    base_time = times["torch.compile (no budget)"].median_s
    print(f"hold outputs: {args.hold_outputs}")
    print("| method | measured peak (B) | predicted (B) | fraction of torch.compile's | step ms | vs torch.compile |")
    print("|---|---|---|---|---|---|")
    for k, (_, peak, predicted) in rows.items():
        pred = f"{predicted:,}" if predicted is not None else ""
        print(f"| {k} | {peak:,} | {pred} | {peak / base_peak:.2f} | {times[k].median_s * 1e3:.2f} | "
              f"{times[k].median_s / base_time:.2f} |")


if __name__ == "__main__":
    main()
