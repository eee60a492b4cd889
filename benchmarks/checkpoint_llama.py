"""remat.checkpoint side by side on a tiny transformers Llama, eager, on this CPU (one thread).

Rows: no checkpointing; full checkpointing (transformers' gradient_checkpointing_enable); remat.checkpoint
at budget None (full checkpointing's predicted peak), 0.8, 0.5 and "min". Columns: measured peak above
resident (the profiler's allocation records, remat.bench.measure.peak_memory) as a fraction of no
checkpointing, remat's predicted fraction, step time against no checkpointing (median and best of
the repeats, methods alternating, remat.bench.measure.step_time; the best is the steadier on a
shared machine), and the largest gradient difference against no
checkpointing under the same seed (attention dropout on). The broader comparison (op SAC,
offload-everything, BERT, a CNN) is benchmarks/eager_checkpoint.py.

    python benchmarks/checkpoint_llama.py [--repeats 15] [--dropout 0.1] [--width 64] [--seq 128]
"""

import copy
import sys
import warnings

import torch

import remat
from remat.eager.blocks import enable_transformers_checkpointing
from remat.bench import harness
from remat.bench.measure import peak_memory, step_time


def arguments(ap) -> None:
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--dropout", type=float, default=0.1, help="attention dropout")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.set_defaults(threads=1)


def run(args) -> harness.Result:
    return harness.Result(measure(args.repeats, args.dropout, args.width, args.seq), printed=True,
                          meta={"width": args.width, "seq": args.seq, "dropout": args.dropout})


def measure(repeats: int = 15, dropout: float = 0.1, width: int = 64, seq: int = 128) -> list:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    L, W, B, S, V = 4, width, 8, seq, 512
    cfg = LlamaConfig(vocab_size=V, hidden_size=W, intermediate_size=4 * W, num_hidden_layers=L,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=S,
                      attention_dropout=dropout)
    base = LlamaForCausalLM(cfg)
    base.train()
    ids = torch.randint(0, V, (B, S))

    def grads(m, seed):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return [p.grad.clone() for p in m.parameters()]

    rows = {}
    for kind in ["eager", "full", None, 0.8, 0.5, "min"]:
        m = copy.deepcopy(base)
        if kind == "full":
            enable_transformers_checkpointing(m, use_reentrant=False)
        elif kind != "eager":
            remat.checkpoint(m, budget=kind)

        def step(m=m):
            torch.manual_seed(0)
            m(input_ids=ids, labels=ids, use_cache=False).loss.backward()

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            step()
            step()
            peak = peak_memory(step, warmup=1, timeline=False).peak_bytes
        warned = any(issubclass(x.category, remat.RematBudgetWarning) for x in w)
        rows["remat " + str(kind) if kind not in ("eager", "full") else kind] = (m, step, peak, warned)
    t = step_time({k: v[1] for k, v in rows.items()}, repeats=repeats)
    e = rows["eager"][2]
    g0 = grads(rows["eager"][0], 3)
    print(f"Llama {L} layers, width {W}, batch {B}x{S}, vocabulary {V}, attention dropout {dropout}; "
          f"CPU, 1 thread, median of {repeats}")
    print("| method | peak / no ckpt | predicted | step time / no ckpt: median (best) | max abs grad diff |")
    print("|---|---|---|---|---|")
    best = {k: min(v.samples) if v.samples else v.median_s for k, v in t.items()}
    out = []
    for k, (m, step, peak, warned) in rows.items():
        d = max((a - b).abs().max().item() for a, b in zip(g0, grads(m, 3)))
        pred = ""
        if hasattr(m, "remat_summary"):
            s = m.remat_summary()
            pred = f"{s.peak / s.peak_eager:.3f}"
        print(f"| {k} | {peak / e:.3f}{' (warned)' if warned else ''} | {pred} | "
              f"{t[k].median_s / t['eager'].median_s:.3f} ({best[k] / best['eager']:.3f}) | {d:.1e} |")
        out.append({"method": k, "fraction": peak / e, "warned": warned, "predicted": pred or None,
                    "ratio": t[k].median_s / t["eager"].median_s, "best_ratio": best[k] / best["eager"],
                    "grad_max_abs_diff": d})
    print()
    for k in ("remat None", "remat 0.8", "remat 0.5"):
        print(k, rows[k][0].remat_summary())
    return out


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
