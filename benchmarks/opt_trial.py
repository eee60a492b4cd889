"""A user trial on a model no test names: OPT (ReLU feed-forward, learned positions, hidden
dropout 0.1), called as a user calls it, beside PyTorch's own memory-budget knob, under CPU
inductor. The table of ``bloom_trial.py``, with PyTorch's partition through remat as a last row.

    PYTHONPATH=src python benchmarks/opt_trial.py [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import OPTConfig, OPTForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import bloom_trial  # noqa: E402


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=3, ffn_dim=512, num_attention_heads=4,
                    max_position_embeddings=128, word_embed_proj_dim=128, dropout=0.1, attention_dropout=0.0)
    return OPTForCausalLM(cfg).train()


make = bloom_trial.make  # model(input_ids=ids, labels=ids).loss, the generator seeded

if __name__ == "__main__":
    bloom_trial.table(torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1)), build, make,
                      __doc__, solvers=("torch-mincut",))
