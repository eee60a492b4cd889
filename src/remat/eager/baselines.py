"""What eager users do today to save activation memory, as the benchmark's baselines
(``benchmarks/eager_checkpoint.py``). Each applies to a model in place, like
:func:`remat.checkpoint`:

- :func:`full_checkpoint`: every block under non-reentrant :func:`torch.utils.checkpoint.checkpoint`,
  recomputed whole in the backward (only its inputs are kept);
  :func:`hf_full_checkpoint`: the same through transformers' ``activation_checkpointing_enable``
  (``use_reentrant=False``), what ``Trainer(activation_checkpointing=True)`` does.
- :func:`op_sac`: torchtitan's "op" selective checkpointing, written here from its description:
  each block under checkpointing with a fixed policy that saves the outputs of the matmuls except
  every second one, of attention (the SDPA kernels) and of ``max`` (a reduction float8 training
  needs), and recomputes the rest. torchtitan lists ``aten.mm`` only (its Llama has no bias);
  here the compute-intensive ops that take its place in other models count as matmuls too:
  ``addmm`` (a linear layer with a bias: BERT), ``bmm`` (attention written with matmuls) and
  ``convolution`` (a CNN), so that the policy does on those models what it does on a Llama.
- :func:`offload_everything`: torchtune's and TRL's ``OffloadActivations`` design, written here:
  saved-tensor hooks around the model's forward that move every saved activation (parameters
  and tensors under 1 KiB excepted) to host memory; on CUDA through pinned buffers and a side
  stream, reloading ahead in the backward; on a CPU plain copies
  (:mod:`remat.eager.offload` with ``decisions=ALL``).

Blocks are the same-class children of the model's largest ``ModuleList`` unless ``blocks`` names
them (module names, as ``named_modules`` spells them, or the modules).
"""

from __future__ import annotations

import functools
from typing import Iterable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .blocks import enable_transformers_checkpointing
from .blocks import find_blocks as _remat_blocks
from .offload import ALL, Offloader, offload_hooks

aten = torch.ops.aten

MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default})
"""The ops the "op" policy counts as matmuls (saved except every second one)."""


def _attention_ops() -> set:
    ops = set()
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        op = getattr(aten, name, None)
        if op is not None:
            ops.add(op.default)
    return ops


ALWAYS_SAVED = frozenset(_attention_ops() | {aten.max.default})
"""The ops the "op" policy always saves: the SDPA kernels (flash, efficient, cuDNN, and the CPU's
flash kernel) and ``max``."""


def find_blocks(model: nn.Module, blocks=None) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the blocks to wrap: the blocks ``remat.checkpoint`` plans
    (:func:`remat.eager.blocks.find_blocks`, same ``blocks=``), so that every method of a
    comparison wraps the same modules. Raises ValueError where there are none."""
    found = _remat_blocks(model, blocks)
    if not found:
        raise ValueError(f"no repeated blocks found in {type(model).__name__}: pass blocks=[...]")
    return found


def _wrap(block: nn.Module, context_fn=None) -> None:
    """Run ``block``'s forward under non-reentrant checkpointing (in place)."""
    if getattr(block, "_remat_baseline", None):
        raise ValueError(f"{type(block).__name__} is wrapped already ({block._remat_baseline})")
    inner = block.forward
    kwargs = {} if context_fn is None else {"context_fn": context_fn}

    @functools.wraps(inner)
    def forward(*args, **kw):
        if not torch.is_grad_enabled():
            return inner(*args, **kw)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs, **kw)

    block.forward = forward
    block._remat_baseline = "op-sac" if context_fn else "full"


def full_checkpoint(model: nn.Module, blocks=None) -> nn.Module:
    """Every block recomputed whole in the backward (non-reentrant checkpointing); returns
    ``model``."""
    for _, b in find_blocks(model, blocks):
        _wrap(b)
    return model


def hf_full_checkpoint(model: nn.Module) -> nn.Module:
    """transformers' own full checkpointing (``activation_checkpointing_enable``, or
    ``gradient_checkpointing_enable`` before transformers 5, with ``use_reentrant=False``);
    returns ``model``."""
    enable_transformers_checkpointing(model, use_reentrant=False)
    return model


def op_sac_policy():
    """A fresh torchtitan-style "op" policy for one checkpointed region (module docstring): it
    counts the region's matmuls and saves every one but the second, fourth, ..."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func in MATMULS:
            mode = "recompute" if getattr(ctx, "is_recompute", False) else "forward"
            counts[mode] += 1
            return CheckpointPolicy.PREFER_RECOMPUTE if counts[mode] % 2 == 0 else CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if func in ALWAYS_SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_sac_context() -> tuple:
    """A ``context_fn`` for :func:`torch.utils.checkpoint.checkpoint`: the "op" policy's contexts."""
    return create_selective_checkpoint_contexts(op_sac_policy())


def op_sac(model: nn.Module, blocks=None) -> nn.Module:
    """torchtitan-style "op" selective checkpointing on every block; returns ``model``."""
    for _, b in find_blocks(model, blocks):
        _wrap(b, op_sac_context)
    return model


def offload_everything(model: nn.Module, *, device=None, prefetch: int | None = None,
                       min_bytes: int = 1024) -> Offloader:
    """Every saved activation of ``model``'s forward moved to host memory (torchtune's
    ``OffloadActivations`` design); returns the :class:`~remat.eager.offload.Offloader` (its
    ``stats`` and ``host_peak_bytes``). The model's forward is wrapped in place."""
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else None
    off = Offloader(device, prefetch=prefetch, min_bytes=min_bytes)
    inner = model.forward

    @functools.wraps(inner)
    def forward(*args, **kw):
        if not torch.is_grad_enabled():
            return inner(*args, **kw)
        with offload_hooks(ALL, offloader=off):
            return inner(*args, **kw)

    model.forward = forward
    model._remat_offloader = off
    return off


def wrapped_blocks(model: nn.Module) -> list[str]:
    """Names of the modules this module wrapped, with how (``"name: full"``)."""
    return [f"{n}: {m._remat_baseline}" for n, m in model.named_modules() if getattr(m, "_remat_baseline", None)]


BASELINES = {"full": full_checkpoint, "op-sac": op_sac}
"""Block-wrapping baselines by name (offloading wraps the whole model: :func:`offload_everything`)."""


def names(blocks: Iterable[tuple[str, nn.Module]]) -> list[str]:
    return [n for n, _ in blocks]
