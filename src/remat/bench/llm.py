"""Language-model training steps, side by side: what users already do against remat, eager and
compiled (``benchmarks/llm.py``).

Models (transformers configs with random weights, widths small enough for a CPU): ``llama``,
``qwen`` (Qwen2), ``mixtral`` (an MoE with transformers' grouped experts), ``lora`` (a Llama
whose base is frozen, peft's LoRA on the attention's q and v) and ``gpt2``. Each row is one
method in a fresh process (:func:`in_subprocess`): the step is ``model(input_ids=ids,
labels=labels).loss.backward()``, labels with a prompt and a quarter of the rest ignored. ``remat full`` is remat.checkpoint's
default (full checkpointing's predicted peak, the least recomputation that keeps it).

Methods: ``eager``; ``hf-gc`` (transformers' gradient checkpointing, non-reentrant);
``hf-gc+chunked`` (that, with the head and loss in token chunks under ``torch.utils.checkpoint``,
Liger's algorithm written in plain torch: :class:`ChunkedLM`); ``op-sac`` (torchtitan's op
policy); ``remat 0.8`` / ``remat 0.5`` / ``remat min`` (:func:`remat.checkpoint`); ``torch.compile``
(inductor); ``knob 0.5`` (PyTorch's ``activation_memory_budget``); ``remat.compile 0.5`` /
``remat.compile min``. Each row: peak above resident (the profiler's allocation records), step
time (median of the repeats), first-step seconds, the largest gradient difference from eager.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CONFIGS = {
    # (layers, hidden, heads, kv heads, ff, vocab)
    "llama": (2, 128, 4, 2, 352, 32000),
    "qwen": (2, 128, 4, 2, 352, 64000),
    "mixtral": (2, 128, 4, 2, 176, 32000),
    "lora": (2, 128, 4, 2, 352, 32000),
    "gpt2": (2, 128, 4, 4, 512, 50257),
}

METHODS = ("eager", "hf-gc", "hf-gc+chunked", "op-sac", "remat full", "remat 0.8", "remat 0.5", "remat min",
           "torch.compile", "knob 0.5", "remat.compile 0.5", "remat.compile min")

CHUNKS = 8
"""Token chunks of the hand-chunked head and loss (the bar)."""


def build(model: str, seq: int, batch: int = 1, vocab: int | None = None, seed: int = 0):
    """``(module, ids, labels)``: ``model``'s causal LM with random weights (seeded)."""
    import torch
    import transformers as tr

    from .fission import lm_labels

    if model not in CONFIGS:
        raise ValueError(f"unknown model {model!r}: use one of {', '.join(CONFIGS)}")
    layers, hidden, heads, kv, ff, v = CONFIGS[model]
    v = vocab or v
    torch.manual_seed(seed)
    common = dict(vocab_size=v, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=max(seq, 512),
                  tie_word_embeddings=False, use_cache=False)
    if model in ("llama", "lora"):
        lm = tr.LlamaForCausalLM(tr.LlamaConfig(**common))
    elif model == "qwen":
        lm = tr.Qwen2ForCausalLM(tr.Qwen2Config(**common))
    elif model == "mixtral":
        lm = tr.MixtralForCausalLM(tr.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2))
    else:
        lm = tr.GPT2LMHeadModel(tr.GPT2Config(vocab_size=v, n_embd=hidden, n_layer=layers, n_head=heads,
                                              n_positions=max(seq, 512), resid_pdrop=0.0, embd_pdrop=0.0,
                                              attn_pdrop=0.0, use_cache=False))
    if model == "lora":
        from peft import LoraConfig, get_peft_model

        lm = get_peft_model(lm, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                           lora_dropout=0.0))
    lm.train()
    ids = torch.randint(0, v, (batch, seq))
    return lm, ids, lm_labels(ids)


class ChunkedLM:
    """The bar: transformers' checkpointing, then the model's final hidden states through the head
    and the cross-entropy in :data:`CHUNKS` token chunks, each under ``torch.utils.checkpoint``
    (a chunk's logits exist only while it runs), summed over the count of valid labels."""

    def __init__(self, lm, chunks: int = CHUNKS) -> None:
        self.lm, self.chunks = lm, chunks
        inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        self.base = getattr(inner, inner.base_model_prefix)
        self.head = inner.get_output_embeddings()

    def _part(self, h, y):
        import torch.nn.functional as F

        return F.cross_entropy(self.head(h).float(), y, ignore_index=-100, reduction="sum")

    def loss(self, ids, labels):
        import torch
        import torch.nn.functional as F

        h = self.base(input_ids=ids).last_hidden_state
        y = F.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
        h = h.reshape(-1, h.shape[-1])
        total = None
        for hc, yc in zip(h.chunk(self.chunks), y.chunk(self.chunks)):
            part = torch.utils.checkpoint.checkpoint(self._part, hc, yc, use_reentrant=False)
            total = part if total is None else total + part
        return total / (y != -100).sum()


def _loss_fn(lm, method: str):
    """``loss(ids, labels)`` of ``lm`` under ``method`` (applied in place)."""
    import torch

    import remat
    from remat.eager import baselines
    from remat.eager.blocks import enable_transformers_checkpointing

    def plain(ids, labels):
        return lm(input_ids=ids, labels=labels).loss

    if method == "eager":
        return plain
    if method in ("hf-gc", "hf-gc+chunked"):
        enable_transformers_checkpointing(lm, use_reentrant=False)
        return ChunkedLM(lm).loss if method == "hf-gc+chunked" else plain
    if method == "op-sac":
        baselines.op_sac(lm)
        return plain
    if method.startswith("remat "):
        b = method.split()[1]
        remat.checkpoint(lm, budget=b if b in ("min", "full") else float(b))
        return plain
    if method == "torch.compile":
        return torch.compile(plain)
    if method.startswith("knob "):
        import torch._functorch.config as fc

        fc.activation_memory_budget = float(method.split()[1])
        return torch.compile(plain)
    if method.startswith("remat.compile "):
        b = method.split()[1]
        return remat.compile(plain, budget=b if b == "min" else float(b))
    raise ValueError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")


def measure(model: str, method: str, seq: int, batch: int = 1, vocab: int | None = None,
            repeats: int = 5) -> dict:
    """One row: ``method`` on ``model`` in this process."""
    import copy


    from .measure import peak_memory, step_time

    lm, ids, labels = build(model, seq, batch, vocab)
    ref_model = copy.deepcopy(lm)
    ref_model(input_ids=ids, labels=labels).loss.backward()
    ref = [p.grad for p in ref_model.parameters()]
    del ref_model
    loss = _loss_fn(lm, method)
    params = [p for p in lm.parameters()]

    def step():
        for p in params:
            p.grad = None
        loss(ids, labels).backward()

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    err = max((float((p.grad - r).abs().max()) for p, r in zip(params, ref) if r is not None and p.grad is not None),
              default=None)
    peak = peak_memory(step, held=params).peak_bytes
    t = step_time({"m": step}, repeats=repeats, warmup=1)["m"]
    row = {"model": model, "method": method, "seq": seq, "batch": batch,
           "vocab": vocab or CONFIGS[model][-1], "peak_bytes": int(peak), "step_s": round(t.median_s, 4),
           "first_s": round(first, 2), "grad_err": err}
    planner = getattr(lm, "_remat_planner", None)
    if planner is not None and planner.head is not None:
        row["head_chunk"] = planner.head.last_chunk
    return row


CHILD = """
import json, warnings, torch
warnings.simplefilter("ignore")
torch.set_num_threads({threads})
from remat.bench.llm import measure
print("ROW " + json.dumps(measure({model!r}, {method!r}, {seq}, {batch}, {vocab}, {repeats})))
"""


def in_subprocess(model: str, method: str, seq: int, batch: int = 1, vocab: int | None = None,
                  repeats: int = 5, threads: int = 1, timeout: float | None = 900,
                  probes_dir: str | None = None) -> dict:
    """:func:`measure` in a fresh interpreter (nothing compiled, cached or allocated is shared
    between rows): its row, or one whose ``status`` says what failed."""
    code = CHILD.format(model=model, method=method, seq=int(seq), batch=int(batch), vocab=vocab,
                        repeats=int(repeats), threads=int(threads))
    # probes (the device profile, SAC's dispatch cost) from ``probes_dir`` when given, as a user's
    # second run reads them; plans never cached
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "REMAT_CACHE_DIR": probes_dir or "off"}
    from . import harness

    row = harness.child_row(code, {"model": model, "method": method, "seq": seq, "batch": batch}, env=env,
                            timeout=timeout, failed="failed")
    return row if "status" in row else {**row, "status": "ok"}


WARM = """
import torch
torch.set_num_threads({threads})
from remat.cost.calibrate import profile_for
from remat.eager.policy import sac_overhead
profile_for("cpu"); sac_overhead()
"""


def warm_probes(directory: str, threads: int = 1) -> None:
    """Measure this machine's probes once into ``directory`` (what ``remat.checkpoint``'s first
    run stores and every later one reads)."""
    env = {**os.environ, "REMAT_CACHE_DIR": directory}
    subprocess.run([sys.executable, "-c", WARM.format(threads=int(threads))], check=True, env=env,
                   capture_output=True)


def ratios(rows: list[dict]) -> list[dict]:
    """Each row's peak and step time against eager's and against the bar's (``hf-gc+chunked``)
    on the same model and sequence."""
    def key(r):
        return (r["model"], r["seq"], r.get("batch", 1))

    by = {(key(r), r["method"]): r for r in rows if r.get("status") == "ok"}
    out = []
    for r in rows:
        e, bar = by.get((key(r), "eager")), by.get((key(r), "hf-gc+chunked"))
        row = dict(r)
        if r.get("status") == "ok":
            if e:
                row["peak_vs_eager"] = round(r["peak_bytes"] / e["peak_bytes"], 3)
                row["time_vs_eager"] = round(r["step_s"] / e["step_s"], 2)
            if bar:
                row["peak_vs_bar"] = round(r["peak_bytes"] / bar["peak_bytes"], 3)
                row["time_vs_bar"] = round(r["step_s"] / bar["step_s"], 2)
        out.append(row)
    return out
