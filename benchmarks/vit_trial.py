"""A user trial on a model no test names: a ViT (transformers' ``ViTForImageClassification``:
a convolutional patch embedding, so the forward is channels-last under inductor, then
attention blocks with hidden dropout 0.1), beside PyTorch's own memory-budget knob, under CPU
inductor. The table of ``bloom_trial.py``: measured peak above the step's start, remat's
prediction, the measured fraction of the activation memory, and the largest gradient
difference from the knob at 1.0 (the same dropout masks); and PyTorch's own partition
(``solver="torch-mincut"``) judged by remat's simulator, beside remat's default.

    PYTHONPATH=src python benchmarks/vit_trial.py [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import ViTConfig, ViTForImageClassification  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import bloom_trial  # noqa: E402


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=128, num_hidden_layers=3,
                    num_attention_heads=4, intermediate_size=256, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.0, num_labels=10,
                    # set here, else the first call sets it and dynamo recompiles (both planned)
                    problem_type="single_label_classification")
    return ViTForImageClassification(cfg).train()


def make(fn, model, inputs):
    images, labels = inputs
    return bloom_trial.seeded_step(model, lambda: fn(pixel_values=images, labels=labels).loss)


if __name__ == "__main__":
    g = torch.Generator().manual_seed(1)
    bloom_trial.table((torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)),
                      build, make, __doc__, solvers=("torch-mincut",))
