"""A user trial on a model no test names: a small VGG-style CNN (convolution, batch norm, ReLU
and 2 x 2 max pooling four times, then a linear classifier), beside PyTorch's own
memory-budget knob, under CPU inductor. On more than one thread inductor hands each max-pool
backward to ATen's scatter-add and copies its channels-last index and source
(:mod:`remat.capture.layouts`). The table of ``bloom_trial.py``.

    PYTHONPATH=src python benchmarks/vgg_trial.py [--threads N]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cache hit skips planning
os.environ["REMAT_CACHE_DIR"] = "off"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import bloom_trial  # noqa: E402

from remat.zoo.cnn import PooledConvBN  # noqa: E402


class VGGLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = PooledConvBN(widths=(16, 32, 64, 64), classes=10, side=32)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def build() -> nn.Module:
    torch.manual_seed(0)
    return VGGLoss().train()


def make(fn, model, inputs):
    images, labels = inputs
    return bloom_trial.seeded_step(model, lambda: fn(images, labels))


if __name__ == "__main__":
    g = torch.Generator().manual_seed(1)
    bloom_trial.table((torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)),
                      build, make, __doc__)
