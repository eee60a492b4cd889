"""Small PyTorch functions and models used by the demo, the tests and the benchmarks.

The seeds' worked examples (seeds/000 Section 2, seeds/003):

- :func:`f1` cos(cos(a+b+c+d)): the optimum saves only ``a+b+c+d``;
- :func:`f2` the dropout-like mask: save the bool mask, never the float random tensor;
- :func:`tanh_tanh` and :func:`gelu_erf`: fused recomputation saves nothing but the input.

Models for gradient checks: :class:`MLP`, :class:`ConvBN` (a CNN with BatchNorm),
:class:`TransformerBlock`, and :func:`gpt2_tiny` (transformers' GPT-2, random weights).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def f1(a, b, c, d):
    """seeds/000 Section 2.3: x = a + b + c + d; return cos(cos(x))."""
    x = a + b + c + d
    return x.cos().cos()


def f2(x):
    """seeds/000 Section 2.3: a dropout-like mask."""
    rand_like = torch.rand_like(x)
    mask = rand_like < 0.5
    return x * mask


def tanh_tanh(x):
    """seeds/000 Section 1: x.tanh().tanh()."""
    return x.tanh().tanh()


def gelu_erf(x):
    """seeds/000 Table 1: GeLU written out with erf, x * Phi(x)."""
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


SEED_EXAMPLES = {
    "cos-cos": (f1, 4),
    "dropout-mask": (f2, 1),
    "tanh-tanh": (tanh_tanh, 1),
    "gelu-erf": (gelu_erf, 1),
}
"""name -> (function, number of tensor inputs)."""


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, d_out=10, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, d_out))

    def forward(self, x):
        return self.net(x)


class ConvBN(nn.Module):
    """A small CNN with BatchNorm, ReLU, pooling and a residual connection."""

    def __init__(self, channels=8, classes=10, dropout=0.0, blocks=1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                          nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))
            for _ in range(blocks))
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = torch.relu(x + block(x))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(self.drop(x))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: attention + GeLU MLP, with dropout."""

    def __init__(self, d_model=32, heads=4, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def gpt2_tiny(n_layer=2, n_embd=64, n_head=4, vocab=256, positions=64, dropout=0.0):
    """GPT-2 from transformers' config with random weights (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # otherwise the loss breaks the graph
    return model


class GPT2Loss(nn.Module):
    """Wraps a GPT-2 LM so that ``model(ids)`` returns the causal LM loss."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss
