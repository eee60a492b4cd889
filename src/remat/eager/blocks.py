"""Find the repeated blocks of a model: the units remat checkpoints.

Without ``blocks=``: transformers' own layers (subclasses of ``GradientCheckpointingLayer``)
when the model has them, else the children of every ``nn.ModuleList`` (or ``nn.Sequential``)
whose children are at least two of one class; outermost first (a block inside a block is not
a block). ``blocks=`` names them: a module class (or tuple of classes), a list of module
names (``"model.layers.0"``), or a predicate ``f(name, module) -> bool``.
"""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Callable

from torch import nn

from ..errors import OptionError


def _hf_layer_class():
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except Exception:  # transformers missing or too old
        return None
    return GradientCheckpointingLayer


def _outermost(found: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for name, m in found:
        if any(name.startswith(p + ".") for p, _ in out):
            continue
        out.append((name, m))
    return out


def find_blocks(model: nn.Module, blocks=None) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of each block, in registration order (for a sequential
    model, the forward order)."""
    named = list(model.named_modules())
    if blocks is None:
        hf = _hf_layer_class()
        if hf is not None:
            found = [(n, m) for n, m in named if n and isinstance(m, hf)]
            if found:
                return _outermost(found)
        found = []
        for n, m in named:
            # a ModuleDict too: torchtitan keeps its layers in one ({"0": block, "1": ...})
            if isinstance(m, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) and len(m) >= 2:
                counts = Counter(type(c) for c in m.children())
                cls, count = counts.most_common(1)[0]
                if count >= 2:
                    prefix = f"{n}." if n else ""
                    found += [(f"{prefix}{k}", c) for k, c in m.named_children() if type(c) is cls]
        return _outermost(found)
    if isinstance(blocks, type) or (isinstance(blocks, tuple) and all(isinstance(b, type) for b in blocks)):
        return _outermost([(n, m) for n, m in named if n and isinstance(m, blocks)])
    if isinstance(blocks, (list, tuple)) and all(isinstance(b, str) for b in blocks):
        out = []
        for b in blocks:
            try:
                out.append((b, model.get_submodule(b)))
            except AttributeError:
                raise OptionError(f"blocks names {b!r}, which is not a submodule of "
                                  f"{type(model).__name__}: name modules as model.named_modules() does") from None
        return out
    if callable(blocks):
        pred: Callable = blocks
        return _outermost([(n, m) for n, m in named if n and pred(n, m)])
    raise OptionError(f"blocks={blocks!r} is not understood: give a module class, a list of module names, "
                      "or a predicate f(name, module) -> bool")


def enable_transformers_checkpointing(model: nn.Module, **kwargs) -> None:
    """transformers' own checkpointing of every layer of ``model``, with ``kwargs`` for
    ``torch.utils.checkpoint`` (``use_reentrant``, ``context_fn``): by its transformers 5 name,
    ``model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)``, or on an
    older transformers, where only that exists, ``gradient_checkpointing_enable`` (5.x keeps the
    old name as a deprecated alias, with a FutureWarning remat's users should not see)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return
    with warnings.catch_warnings():
        # a model that overrides the old name is still entered through it, which warns
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        enable(activation_checkpointing_kwargs=kwargs)
