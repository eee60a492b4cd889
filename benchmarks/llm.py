"""Language models trained the ways users train them, against remat, eager and compiled, on this CPU.

One process per row (remat.bench.llm.in_subprocess). Models: Llama, Qwen2, a Mixtral-style MoE
(transformers' grouped experts), a peft LoRA fine-tune of a Llama (base frozen) and GPT-2, at
widths a 2-core CPU trains (2 layers x 128), with vocabularies 32k-64k and sequences 512-4096.
Rows: eager; transformers' gradient checkpointing (hf-gc); hf-gc with the head and loss
hand-chunked in 8 token chunks under torch.utils.checkpoint (hf-gc+chunked, Liger's algorithm
in plain torch: the bar); torchtitan's op SAC; remat.checkpoint 0.8 / 0.5 / "min"; plain
torch.compile; PyTorch's activation_memory_budget 0.5; remat.compile 0.5 / "min". Columns: peak
above resident (the profiler's allocation records), step time (median), first step, the largest
gradient difference from eager, and peak and time against eager and against the bar. The
device probes remat.checkpoint prices with are measured once, before the rows, into a temporary
folder every row reads (as a user's second run reads them); plans are never cached.

    python benchmarks/llm.py [--models llama,qwen,mixtral,lora,gpt2] [--seqs 1024]
                             [--methods eager,hf-gc,...] [--repeats 5]

Targets (BENCHMARKS.md): remat's least, eager and compiled, at most 0.9x the bar's peak at no more
than its step time (+5%); remat at 0.5 faster than full checkpointing; remat's first step at most
1.5x transformers' checkpointing's.
"""

from remat.bench import harness
import tempfile

from remat.bench.llm import CONFIGS, METHODS, in_subprocess, ratios, warm_probes

COLUMNS = ["model", "seq", "vocab", "method", "peak_MiB", "peak_vs_eager", "peak_vs_bar", "step_s",
           "time_vs_eager", "time_vs_bar", "first_s", "grad_err", "head_chunk", "status"]


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    ap.add_argument("--seqs", default="1024", help="sequence lengths, comma-separated")
    ap.add_argument("--vocab", type=int, default=None, help="every model's vocabulary (default: each model's)")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated: " + ", ".join(METHODS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=900, help="seconds a row may take")


def run(args):
    rows = []
    probes = tempfile.mkdtemp(prefix="remat-llm-probes-")  # measured once, read by every row
    warm_probes(probes, args.threads or 1)
    for model in (m.strip() for m in args.models.split(",")):
        for seq in (int(s) for s in args.seqs.split(",")):
            for method in (m.strip() for m in args.methods.split(",")):
                row = in_subprocess(model, method, seq, vocab=args.vocab, repeats=args.repeats,
                                    threads=args.threads or 1, timeout=args.timeout, probes_dir=probes)
                if "peak_bytes" in row:
                    row["peak_MiB"] = round(row["peak_bytes"] / harness.MiB, 2)
                rows.append(row)
                print(harness.markdown_table(ratios(rows)[-1:], COLUMNS), flush=True)
    rows = ratios(rows)
    print(harness.markdown_table(rows, COLUMNS))
    return harness.Result(rows, {}, COLUMNS, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__, columns=COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
