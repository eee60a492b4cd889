"""Token fission of a loss over the tokens: a head and its loss run chunk by chunk.

The algorithm of Liger-Kernel's fused linear + cross-entropy, in plain torch: the forward
runs each chunk of tokens through the head and the loss with autograd on, takes that
chunk's gradients at once (of the chunk's hidden states and of the head's parameters) and
drops the chunk's logits; the backward only scales the gradients it kept by the loss's
incoming gradient. Nothing is recomputed, so random ops in the head draw once (the masks the
forward used are the ones its gradients used), and only one chunk's logits, log-probabilities
and their gradients exist at a time: what the step holds for the head from its forward to its
backward is the gradient of the hidden states (the bytes of the hidden states autograd would
have saved), where an unchunked loss holds the log-probabilities of every token and the caller
the logits.

:func:`chunked_loss` is the general form (any loss that is a sum over tokens);
:func:`linear_cross_entropy` the common one (a linear head, cross-entropy with ``ignore_index``,
label smoothing, soft-capped logits, mean or sum).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..errors import OptionError


def token_chunk(n_tokens: int, hidden: int, vocab: int) -> int:
    """Liger's chunk size: the tokens whose logits hold about as many elements as all the
    hidden states (a power of two, at most ``n_tokens``)."""
    per = max(1, math.ceil(vocab / max(hidden, 1)))
    size = max(1, math.ceil(n_tokens / per))
    return min(1 << (size - 1).bit_length(), max(n_tokens, 1))


def token_slices(n_tokens: int, chunk: int) -> list[slice]:
    """Consecutive slices of ``chunk`` tokens covering ``n_tokens``."""
    if chunk < 1:
        raise OptionError(f"a chunk holds at least one token, not {chunk}")
    return [slice(a, min(a + chunk, n_tokens)) for a in range(0, n_tokens, chunk)]


class _Chunked(torch.autograd.Function):
    """``sum_k loss_of(hidden[k]) / divisor``, gradients taken chunk by chunk in the forward."""

    @staticmethod
    def forward(ctx, loss_of, slices, divisor, hidden, *params):
        flat = hidden.detach().reshape(1, -1, hidden.shape[-1])
        want_h = hidden.requires_grad
        live = [i for i, p in enumerate(params) if p.requires_grad]
        grad_h = torch.zeros_like(flat) if want_h else None
        grads: list = [None] * len(params)
        total = None
        with torch.enable_grad():
            for sl in slices:
                h = flat[:, sl].detach().requires_grad_(want_h)
                loss = loss_of(h, sl)
                if not torch.is_tensor(loss) or loss.dim() != 0:
                    raise OptionError("a chunked loss's loss_of(hidden_chunk, tokens) must return a 0-dim tensor, "
                                      f"not {type(loss).__name__}"
                                      + (f" of shape {tuple(loss.shape)}" if torch.is_tensor(loss) else ""))
                part = loss.detach()
                part = part.float() if part.dtype in (torch.float16, torch.bfloat16) else part
                total = part if total is None else total + part
                wrt = ([h] if want_h else []) + [params[i] for i in live]
                if not wrt or not loss.requires_grad:
                    continue
                seed = 1.0 / torch.as_tensor(divisor, dtype=loss.dtype, device=loss.device)
                got = torch.autograd.grad(loss, wrt, grad_outputs=seed, allow_unused=True)
                if want_h:
                    if got[0] is not None:
                        grad_h[:, sl] = got[0]
                    got = got[1:]
                g = None
                for i, g in zip(live, got):
                    if g is None:
                        continue
                    if grads[i] is None:  # half-precision gradients summed in fp32, rounded once
                        grads[i] = g.float() if g.dtype in (torch.float16, torch.bfloat16) else g
                    else:
                        grads[i].add_(g)
                # nothing of this chunk outlives it (a weight's gradient is as large as the weight)
                del got, loss, h, g
        ctx.grad_h = None if grad_h is None else grad_h.view(hidden.shape)
        ctx.grads = [g if g is None or g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(grads, params)]
        ctx.first = None  # the incoming gradient of the first backward (scaled in place then)
        if total is None:
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        return total / torch.as_tensor(divisor, dtype=total.dtype, device=total.device)

    @staticmethod
    def backward(ctx, g):
        kept = [ctx.grad_h] + list(ctx.grads)
        if ctx.first is None:  # the first backward: scale in place, no copy
            ctx.first = g.detach().clone()
            out = [None if t is None else t.mul_(g.to(t.dtype)) for t in kept]
        else:  # backward again through a retained graph: what was kept holds first * grad
            ratio = g / ctx.first
            out = [None if t is None else t * ratio.to(t.dtype) for t in kept]
        return (None, None, None, *out)


def chunked_loss(loss_of: Callable, hidden: torch.Tensor, *, params: Sequence[torch.Tensor] = (),
                 chunk: int, divisor=1.0) -> torch.Tensor:
    """``sum over chunks of loss_of(h, tokens) / divisor``, with exact gradients, holding one
    chunk's intermediates at a time.

    ``hidden``: ``(..., H)``, its tokens flattened; ``loss_of(h, tokens)``: the sum of the loss
    over the tokens ``tokens`` (a slice of the flattened tokens), given their hidden states ``h``
    (shape ``(1, len, H)``), a 0-dim tensor; ``params``: the tensors ``loss_of`` reads that need
    gradients (the head's weights); ``chunk``: tokens per chunk; ``divisor``: a number or a 0-dim
    tensor (the count of tokens a mean divides by)."""
    n = hidden.numel() // max(hidden.shape[-1], 1)
    return _Chunked.apply(loss_of, token_slices(n, int(chunk)), divisor, hidden, *params)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                         label_smoothing: float = 0.0, softcap: float | None = None,
                         reduction: str = "mean", chunk: int | str = "auto") -> torch.Tensor:
    """``F.cross_entropy(softcap(hidden @ weight.T + bias), labels)`` (half-precision logits upcast
    to fp32 first, as transformers does) without the logits of
    every token at once (Liger's fused linear cross-entropy, in plain torch): the same value and
    gradients, one chunk of tokens' logits at a time.

    ``hidden``: ``(..., H)``; ``labels``: ``(...)``, the targets of the same tokens (shift them
    first for a causal LM); ``softcap``: logits ``c * tanh(z / c)`` (Gemma 2's final soft
    capping); ``reduction``: ``"mean"`` (over the tokens whose label is not ``ignore_index``) or
    ``"sum"``; ``chunk``: tokens per chunk, ``"auto"``: as many as make one chunk's logits about
    the size of the hidden states (:func:`token_chunk`)."""
    if reduction not in ("mean", "sum"):
        raise OptionError(f"reduction={reduction!r}: use 'mean' or 'sum'")
    if labels.shape != hidden.shape[:-1]:
        raise OptionError(f"labels of shape {tuple(labels.shape)} do not match hidden states of shape "
                          f"{tuple(hidden.shape)}: one label per token (shift a causal LM's labels first)")
    vocab, width = weight.shape
    flat_labels = labels.reshape(1, -1)
    n = flat_labels.shape[1]
    size = token_chunk(n, width, vocab) if chunk == "auto" else int(chunk)

    def loss_of(h, sl):
        z = F.linear(h, weight, bias)
        if softcap is not None:
            z = torch.tanh(z / softcap) * softcap
        z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z  # the upcast transformers does
        return F.cross_entropy(z.reshape(-1, vocab), flat_labels[0, sl], ignore_index=ignore_index,
                               label_smoothing=label_smoothing, reduction="sum")

    divisor = 1.0 if reduction == "sum" else (flat_labels != ignore_index).sum()
    params = [t for t in (weight, bias) if t is not None and t.requires_grad]
    return chunked_loss(loss_of, hidden, params=params, chunk=size, divisor=divisor)
