"""A user's trial of fission on a model no test names (issue 31): a transformers Qwen2
(random weights; 2 layers, hidden 128, vocabulary 32,000, batch 1 x 1024 tokens, some labels
-100), the rows of ``benchmarks/fission_lm.py`` (:func:`remat.bench.fission.lm_entries`):
no recomputation, plain torch.compile, PyTorch's knob at 0.0, the hand-chunked head + loss,
transformers' gradient checkpointing, remat ``min`` and remat at 0.4, measured the same way.

    python benchmarks/fission_user_trial.py [--seq 1024] [--compiler eager|inductor]

Writes ``benchmarks/results/fission_user_trial.json``."""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402

import torch  # noqa: E402

from remat.bench import fission, harness  # noqa: E402
from remat.zoo.trials import Case  # noqa: E402


def qwen2_case(seq: int, vocab: int = 32000) -> Case:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        lm = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=vocab, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq,
            tie_word_embeddings=False, use_cache=False))
        ids = torch.randint(0, vocab, (1, seq))
    labels = fission.lm_labels(ids)
    desc = f"Qwen2 (2 x 128, 4 heads / 2 kv, ff 384, vocab {vocab}), batch 1 x {seq}"
    return Case("qwen2-lm", desc, fission.LMLabelsLoss(lm).train(), (ids, labels), {"seq": seq, "vocab": vocab})


def arguments(ap) -> None:
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--compiler", default="eager", choices=["eager", "inductor"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.set_defaults(threads=1)


def run(args):
    case = qwen2_case(args.seq)
    rows = fission.lm_comparison(case, [0.4], [0.0], 8, args.compiler, 60.0, args.repeats)
    return harness.Result(rows, {"case": case.description, **case.config, "compiler": args.compiler},
                          printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
