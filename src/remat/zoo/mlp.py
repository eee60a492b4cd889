"""``mlp``: a multi-layer perceptron classifier (Linear + GELU blocks, then a linear head).

=====  =====  ======  =====  =======  =======
size   batch  d_in    width  depth    classes
=====  =====  ======  =====  =======  =======
tiny   16     32      64     2        10
small  256    512     1024   4        100
full   1024   1024    4096   8        1000
=====  =====  ======  =====  =======  =======

Input ``(batch, d_in)`` (no grad), cross-entropy loss against fixed random labels. Blocks:
``layers.0`` ... ``layers.{depth-1}`` (each Linear + GELU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import _to_device_loss, register

_SIZES = {"tiny": (16, 32, 64, 2, 10), "small": (256, 512, 1024, 4, 100), "full": (1024, 1024, 4096, 8, 1000)}


class MLPNet(nn.Module):
    def __init__(self, d_in: int, width: int, depth: int, classes: int):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in if i == 0 else width, width), nn.GELU()) for i in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def cross_entropy(out, target):
    return F.cross_entropy(out.float(), target)


@register("mlp", "model", "MLP classifier: Linear+GELU blocks and a linear head")
def _mlp(size, batch):
    b, d_in, width, depth, classes = _SIZES[size]
    b = batch or b
    model = MLPNet(d_in, width, depth, classes)
    x = torch.randn(b, d_in)
    y = torch.randint(0, classes, (b,))
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y),
                blocks=[f"layers.{i}" for i in range(depth)], batch=b)


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, d_out=10, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)
