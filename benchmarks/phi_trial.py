"""A user trial on a model no test names: Phi (attention and MLP in parallel, rotary embeddings
on half of each head, residual dropout 0.1), stepped as a training loop that keeps the model's
output until the backward ends, beside PyTorch's own memory-budget knob, under CPU inductor.
The table of ``bloom_trial.py``, with PyTorch's partition through remat as a last row.

    PYTHONPATH=src python benchmarks/phi_trial.py [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import PhiConfig, PhiForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import bloom_trial  # noqa: E402


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
                    num_attention_heads=4, max_position_embeddings=128, partial_rotary_factor=0.5,
                    resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0)
    return PhiForCausalLM(cfg).train()


def make(fn, model, ids):
    """A step that holds the model's output (logits, cache) through the backward."""
    return bloom_trial.seeded_step(model, lambda: fn(input_ids=ids, labels=ids))


if __name__ == "__main__":
    bloom_trial.table(torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1)), build, make,
                      __doc__, solvers=("torch-mincut",))
