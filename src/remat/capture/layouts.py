"""The layouts inductor gives values of a channels-last graph, and the views it must copy.

Under inductor's layout optimization (:func:`remat.capture.workspace.inductor_channels_last`)
a convolution's output is channels-last, and a kernel reading it lays its own output out in
the same order (a ReLU, a batch norm, a max pool and its indices). A view of such a value that
merges the batch with the channels (a max-pool backward's scatter over ``(N*C, H*W)``) is no
view of that storage: inductor's ``ExternKernel.realize_input`` writes the value, then copies
it for a library call that reads the view. ResNet-18's least-memory plan on two threads (where
the max-pool backward's scatter-add is ATen's, not a kernel) measured 14% above its
prediction: the scatter's index and source were each written twice.

:func:`copied_views` finds those views from the traced shapes, running each view on a meta
tensor with the strides inductor gives its base (:func:`layouts`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

import torch
from torch import fx

from .joint import size_hint
from .workspace import channels_last_strides

aten = torch.ops.aten

_CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)
_NOT_A_VIEW = ("view size is not compatible", "Cannot view a tensor")
"""ATen's and its meta implementation's words for a view no strides express."""


def _tensor(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _hinted(x):
    """An argument with symbolic sizes at their hints (no guards added)."""
    if isinstance(x, torch.SymInt):
        return size_hint(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_hinted(y) for y in x)
    if isinstance(x, dict):
        return {k: _hinted(v) for k, v in x.items()}
    return x


def _channels_last(val: torch.Tensor) -> tuple[int, ...]:
    return channels_last_strides(_hinted(tuple(val.shape)))


def layouts(nodes: Iterable[fx.Node], copied: set[str] | None = None) -> dict[str, tuple[int, ...]]:
    """``{node name: strides}`` for the values of a channels-last graph that inductor lays out
    channels-last (or as a view of such a value): the graph's 4-d and 5-d inputs of
    convolutions (it copies them), convolutions' outputs and gradients, and a value of the
    same rank computed from one of those. Views follow their base's strides; a view no strides
    can express goes into ``copied`` (inductor copies it, contiguous)."""
    nodes = list(nodes)
    out: dict[str, tuple[int, ...]] = {}
    for n in nodes:
        if n.op == "call_function" and n.target is aten.convolution.default:
            for a in n.args[:2]:
                val = _tensor(a)
                if val is not None and a.op == "placeholder" and val.dim() in (4, 5):
                    out.setdefault(a.name, _channels_last(val))
    for n in nodes:
        val = _tensor(n)
        if n.op != "call_function" or val is None:
            continue
        src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        spatial = val.dim() in (4, 5)
        if spatial and (n.target in _CONVOLUTIONS or (
                n.target is operator.getitem and src is not None and src.target in _CONVOLUTIONS)):
            out[n.name] = _channels_last(val)
        elif views_first_input(n):
            if src is None or src.name not in out:
                continue
            known, strides = _view_strides(n, src, out[src.name])
            if known and strides is None and copied is not None:
                copied.add(n.name)
            elif strides is not None:
                out[n.name] = strides
        elif spatial:
            inputs = src.all_input_nodes if n.target is operator.getitem and src is not None else n.all_input_nodes
            if any(a.name in out and _tensor(a) is not None and _tensor(a).dim() == val.dim() for a in inputs):
                out[n.name] = _channels_last(val)
    return out


def views_first_input(n: fx.Node) -> bool:
    """Whether ``n``'s op returns a view of its first argument (its schema's alias sets:
    ``view``, ``permute``, ``t``...). Capture's ``alias_of`` and the layouts here both ask."""
    schema = getattr(n.target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    ret, arg = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return ret is not None and arg is not None and not ret.is_write \
        and bool(set(ret.before_set) & set(arg.before_set))


def _view_strides(n: fx.Node, base: fx.Node, strides: tuple[int, ...]) -> tuple[bool, tuple[int, ...] | None]:
    """``(known, strides)``: the strides ``n`` (a view of ``base``) has when ``base`` has
    ``strides``, None when no strides express it (a ``view`` across channels-last's
    subspaces); ``known`` is False when running the view failed otherwise."""
    val = _tensor(base)
    if val is None or not isinstance(n.target, torch._ops.OpOverload):
        return False, None
    meta = torch.empty_strided(_hinted(tuple(val.shape)), strides, dtype=val.dtype, device="meta")
    try:
        result = n.target(meta, *_hinted(tuple(n.args[1:])), **_hinted(dict(n.kwargs)))
    except Exception as e:  # noqa: BLE001 - another failure: the view's layout is unknown
        return any(m in str(e) for m in _NOT_A_VIEW), None
    return (True, tuple(result.stride())) if isinstance(result, torch.Tensor) else (False, None)


def copied_views(nodes: Iterable[fx.Node], channels_last: bool,
                 library: Callable[[fx.Node], bool]) -> set[str]:
    """Names of the views a library call (``library(node)``) reads that inductor copies out of
    their base's channels-last storage: a copy beside the base, which inductor writes too."""
    if not channels_last:
        return set()
    nodes = list(nodes)
    copied: set[str] = set()
    layouts(nodes, copied)
    return {n.name for n in nodes if n.name in copied and any(library(u) for u in n.users)}
