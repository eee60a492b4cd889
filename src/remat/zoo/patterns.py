"""The seeds' patterns: small graphs where what to save matters most.

===========================  ==========================  ======================  =======================
entry                        tiny                        small                   full
===========================  ==========================  ======================  =======================
cos-cos (4 inputs)           4 x 2^10                    4 x 2^22                4 x 2^25
dropout-mask                 2^10                        2^22                    2^25
gelu-erf                     2^10                        2^22                    2^25 (Table 1)
evonorm-b0, evonorm-s0       (2, 8, 8, 8), 4 groups      (16, 32, 64, 64)        (128, 32, 128, 128)
transformer-encoder (B,S,D)  (2, 8, 32), 4 heads, ff 64  (8, 128, 256), 8/1024   (64, 512, 512), 8/2048
===========================  ==========================  ======================  =======================

(S0 uses 32 groups at small and full.) ``qehvi`` is in :mod:`remat.zoo.qehvi`.

The whole pattern is one checkpoint block (``blocks == [""]``). Every input requires grad.
The loss of the pointwise patterns is ``out.sum()`` as in the seeds; the normalization and
encoder patterns use ``out.pow(2).mean()`` (the sum of a normalized output has a ~zero
gradient), with random affine parameters in their normalizations (with the identity
affine, ``mean(LayerNorm(x)^2)`` would be constant). EvoNorm follows timm's
``EvoNorm2dB0``/``EvoNorm2dS0`` formulas (seeds/003 runs timm's module) written out in
plain torch; B0 updates its running variance in training mode as timm does. The shapes of
seeds/003's first EvoNorm setting are the full size.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .registry import register

# -- the seeds' worked examples as functions (also the demo's) ---------------------------------

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


_NUMEL = {"tiny": 1 << 10, "small": 1 << 22, "full": 1 << 25}


class Pointwise(nn.Module):
    """Wraps one of the seed functions as a module without parameters."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)

    def extra_repr(self) -> str:
        return self.fn.__name__


def _sum(out):
    return out.sum()


def _mean_square(out):
    return out.float().pow(2).mean()


def _pointwise(fn, n_inputs, size):
    n = _NUMEL[size]
    inputs = tuple(torch.randn(n).requires_grad_() for _ in range(n_inputs))
    return dict(model=Pointwise(fn), inputs=inputs, loss=_sum, blocks=[""], batch=None)


@register("cos-cos", "pattern", "seeds/000 Sec. 2.3: cos(cos(a+b+c+d)); the optimum saves only a+b+c+d",
          has_batch=False)
def _cos_cos(size, batch):
    return _pointwise(f1, 4, size)


@register("dropout-mask", "pattern", "seeds/000 Sec. 2.3: x * (rand_like(x) < 0.5); save the bool mask",
          has_batch=False)
def _dropout_mask(size, batch):
    return _pointwise(f2, 1, size)


@register("gelu-erf", "pattern", "seeds/000 Table 1: GeLU written with erf; recomputing saves all but x",
          has_batch=False)
def _gelu_erf(size, batch):
    return _pointwise(gelu_erf, 1, size)


# -- EvoNorm -------------------------------------------------------------------------------

class EvoNormB0(nn.Module):
    """EvoNorm-B0 (Liu et al. 2020; timm's ``EvoNorm2dB0``, eps 1e-3, momentum 0.1):
    ``x / max(sqrt(var_batch + eps), v*x + instance_std(x)) * weight + bias``, where
    ``var_batch`` is the batch variance per channel in training mode (and the running
    variance, updated with the unbiased batch variance, in eval mode)."""

    def __init__(self, channels: int, eps: float = 1e-3, momentum: float = 0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.v = nn.Parameter(torch.ones(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x):
        shape = (1, -1, 1, 1)
        if self.training:
            var = x.float().var(dim=(0, 2, 3), unbiased=False)
            n = x.numel() / x.shape[1]
            with torch.no_grad():
                self.running_var.copy_(self.running_var * (1 - self.momentum)
                                       + var.detach() * (self.momentum * n / (n - 1)))
        else:
            var = self.running_var
        left = var.add(self.eps).sqrt().to(x.dtype).view(shape).expand_as(x)
        inst_std = x.float().var(dim=(2, 3), unbiased=False, keepdim=True).add(self.eps).sqrt().to(x.dtype)
        right = x * self.v.to(x.dtype).view(shape) + inst_std.expand_as(x)
        x = x / torch.maximum(left, right)
        return x * self.weight.to(x.dtype).view(shape) + self.bias.to(x.dtype).view(shape)


class EvoNormS0(nn.Module):
    """EvoNorm-S0 (timm's ``EvoNorm2dS0``, eps 1e-5):
    ``x * sigmoid(v*x) / group_std(x) * weight + bias`` (no batch statistics)."""

    def __init__(self, channels: int, groups: int = 32, eps: float = 1e-5):
        super().__init__()
        if channels % groups:
            raise ValueError(f"channels {channels} not divisible by groups {groups}")
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.v = nn.Parameter(torch.ones(channels))

    def group_std(self, x):
        b, c, h, w = x.shape
        g = x.reshape(b, self.groups, c // self.groups, h, w)
        std = g.float().var(dim=(2, 3, 4), unbiased=False, keepdim=True).add(self.eps).sqrt().to(x.dtype)
        return std.expand(g.shape).reshape(b, c, h, w)

    def forward(self, x):
        shape = (1, -1, 1, 1)
        v = self.v.to(x.dtype).view(shape)
        x = x * (x * v).sigmoid() / self.group_std(x)
        return x * self.weight.to(x.dtype).view(shape) + self.bias.to(x.dtype).view(shape)


_EVO = {"tiny": (2, 8, 8, 8, 4), "small": (16, 32, 64, 64, 32), "full": (128, 32, 128, 128, 32)}


def _evonorm(cls, size, batch):
    b, c, h, w, groups = _EVO[size]
    b = batch or b
    model = cls(c) if cls is EvoNormB0 else cls(c, groups=groups)
    # random affine parameters so that their gradients are not trivially symmetric
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        model.bias.normal_(0, 0.1)
        model.v.uniform_(0.5, 1.5)
    x = torch.randn(b, c, h, w).requires_grad_()
    return dict(model=model, inputs=(x,), loss=_mean_square, blocks=[""], batch=b)


@register("evonorm-b0", "pattern", "seeds/003: EvoNorm-B0 (batch variance, running stats) as in timm")
def _evonorm_b0(size, batch):
    return _evonorm(EvoNormB0, size, batch)


@register("evonorm-s0", "pattern", "seeds/003: EvoNorm-S0 (group std, sigmoid gating) as in timm")
def _evonorm_s0(size, batch):
    return _evonorm(EvoNormS0, size, batch)


# -- nn.TransformerEncoderLayer --------------------------------------------------------------

# batch, sequence, d_model, heads, feed-forward width
_ENC = {"tiny": (2, 8, 32, 4, 64), "small": (8, 128, 256, 8, 1024), "full": (64, 512, 512, 8, 2048)}


@register("transformer-encoder", "pattern",
          "seeds/003: one nn.TransformerEncoderLayer (post-norm, ReLU, batch_first, dropout 0)")
def _transformer_encoder(size, batch):
    b, s, d, heads, ff = _ENC[size]
    b = batch or b
    model = nn.TransformerEncoderLayer(d, heads, dim_feedforward=ff, dropout=0.0, batch_first=True)
    with torch.no_grad():  # non-trivial LayerNorm affines: mean(LayerNorm(x)^2) is constant otherwise
        for norm in (model.norm1, model.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.1)
    x = torch.randn(b, s, d).requires_grad_()
    return dict(model=model, inputs=(x,), loss=_mean_square, blocks=[""], batch=b)
