"""Capturing a training step that is never allocated: a model built on the meta device or
under ``FakeTensorMode``, and inputs given as shapes.

A model too large for this machine is built without memory (``with torch.device("meta"):``,
or under ``torch._subclasses.FakeTensorMode``) and its inputs are written as shapes
(:func:`shapes`). :func:`fake_step` then captures its step as the same step on real CPU
tensors would be captured: every meta or fake parameter, buffer and input is swapped, for
the capture only, for a fake CPU tensor of its shape, dtype and stride in one fresh
``FakeTensorMode``, and the step runs in that mode. The joint graph is then the one a real CPU
capture gives (the same decompositions: ``scaled_dot_product_attention`` becomes CPU flash
attention, which saves what CUDA's flash attention saves, where on the meta device PyTorch
takes the math path and materializes the attention matrix), and inductor's joint-graph passes
run on it as on a real one (on meta tensors its constant folding replaces the whole backward
by empty tensors: "Argument 'empty_strided_default_1' ... used before it has been defined").
The originals are put back when the capture ends, whatever happens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from ..errors import OptionError

CAPTURE_DEVICE = torch.device("cpu")
"""The device an abstract step is captured on (as fake tensors): this machine's."""


@dataclass(frozen=True)
class TensorSpec:
    """One input given by its shape: ``shape``, ``dtype`` and whether it requires grad."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    requires_grad: bool = False

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"TensorSpec({self.shape}, {self.dtype}{grad})"


@dataclass(frozen=True)
class Shapes:
    """A step's inputs as shapes (:func:`shapes`): ``args`` and ``kwargs`` hold a
    :class:`TensorSpec` where a tensor goes and any other value as it is."""

    args: tuple
    kwargs: Mapping[str, Any]

    def tensors(self, device: torch.device | str = "meta") -> tuple[tuple, dict]:
        """The inputs as tensors on ``device`` (zeros: valid token ids and labels), as
        ``(args, kwargs)``."""
        def make(v):
            if not isinstance(v, TensorSpec):
                return v
            t = torch.zeros(v.shape, dtype=v.dtype, device=device)
            return t.requires_grad_() if v.requires_grad else t

        return tuple(make(a) for a in self.args), {k: make(v) for k, v in self.kwargs.items()}


def shapes(*args: Any, **kwargs: Any) -> Shapes:
    """A step's inputs by their shapes, for :func:`remat.plan` and :func:`remat.plan_all`'s
    ``inputs=`` (positional inputs for the model's positional arguments, keywords for its
    keywords). Each tensor is ``(shape, dtype)``, ``(shape, dtype, requires_grad)`` or a bare
    shape (``torch.float32``); a tensor (meta, fake or real) is taken as it is, and any other
    value (an int, None, a flag) is passed to the model unchanged.

    >>> import torch, remat
    >>> s = remat.shapes(input_ids=((8, 4096), torch.long), labels=((8, 4096), torch.long))
    >>> s.kwargs["input_ids"]
    TensorSpec((8, 4096), torch.int64)
    >>> remat.shapes(((2, 16), torch.float32, True)).args[0].requires_grad
    True
    """
    return Shapes(tuple(_spec(a, f"input {i}") for i, a in enumerate(args)),
                  {k: _spec(v, repr(k)) for k, v in kwargs.items()})


def _spec(v: Any, what: str) -> Any:
    """``v`` as a :class:`TensorSpec` where it describes a tensor, else ``v``."""
    if isinstance(v, (TensorSpec, torch.Tensor)) or v is None or isinstance(v, (bool, str, float)):
        return v
    if isinstance(v, torch.Size) or _is_shape(v):
        return TensorSpec(_shape(v, what))
    if isinstance(v, (tuple, list)) and 2 <= len(v) <= 3 and isinstance(v[1], torch.dtype):
        grad = bool(v[2]) if len(v) == 3 else False
        if grad and not (v[1].is_floating_point or v[1].is_complex):
            raise OptionError(f"{what}: a {v[1]} tensor cannot require grad; only floating ones can")
        return TensorSpec(_shape(v[0], what), v[1], grad)
    if isinstance(v, int):
        return v
    raise OptionError(f"{what}: {v!r} is not a shape; write a tensor as (shape, dtype), e.g. "
                      f"((8, 4096), torch.long), or (shape, dtype, True) for one that requires grad")


def _is_shape(v: Any) -> bool:
    return isinstance(v, (tuple, list)) and all(isinstance(d, int) and not isinstance(d, bool) for d in v)


def _shape(v: Any, what: str) -> tuple[int, ...]:
    if not (isinstance(v, torch.Size) or _is_shape(v)) or any(d < 0 for d in v):
        raise OptionError(f"{what}: the shape {v!r} must be a tuple of sizes >= 0, e.g. (8, 4096)")
    return tuple(int(d) for d in v)


def is_abstract(t: Any) -> bool:
    """A tensor with no data here: on the meta device, or a FakeTensor."""
    return isinstance(t, torch.Tensor) and (isinstance(t, FakeTensor) or t.device.type == "meta")


def abstract_model(model: Any) -> bool:
    """Whether ``model`` (a module) holds a parameter or buffer on the meta device or fake."""
    if not isinstance(model, torch.nn.Module):
        return False
    return any(is_abstract(t) for t in _tensors(model))


def _tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


@contextlib.contextmanager
def fake_step(model: Any, args: tuple, kwargs: dict) -> Iterator[tuple[tuple, dict]]:
    """Run inside: the model's meta or fake parameters and buffers swapped for fake CPU ones in a
    fresh ``FakeTensorMode`` (tied weights stay tied), and ``(args, kwargs)`` with their meta or
    fake tensors swapped likewise, the mode active. The model's own tensors come back after.
    Real tensors are left as they are (the mode lets them in)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if not is_abstract(t):
            return t
        out = memo.get(id(t))
        if out is None:
            with mode:  # made by the mode itself, as a model built under it would be
                out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=CAPTURE_DEVICE)
            if isinstance(t, torch.nn.Parameter):
                out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
            elif t.requires_grad:
                out.requires_grad_()
            memo[id(t)] = out
        return out

    swapped: list[tuple[dict, str, torch.Tensor]] = []
    try:
        if isinstance(model, torch.nn.Module):
            for module in model.modules():
                for table in (module._parameters, module._buffers):
                    for name, t in table.items():
                        if t is not None and is_abstract(t):
                            swapped.append((table, name, t))
                            table[name] = fake(t)
        args = torch.utils._pytree.tree_map_only(torch.Tensor, fake, args)
        kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, fake, kwargs)
        with mode:  # what the step creates is fake too: nothing of the model's size is allocated
            yield args, kwargs
    finally:
        for table, name, t in reversed(swapped):
            table[name] = t


def inputs_for(model: Any, args: tuple, kwargs: dict, inputs: Shapes | None) -> tuple[tuple, dict, bool]:
    """The step's ``(args, kwargs)`` with ``inputs`` (a :class:`Shapes`) among them, and whether
    the step is abstract (a meta or fake model or input: captured by :func:`fake_step`).
    Shapes become meta tensors for an abstract step, zeros on the model's device otherwise."""
    if inputs is not None and not isinstance(inputs, Shapes):
        raise OptionError(f"inputs must be remat.shapes(...) (e.g. remat.shapes(input_ids=((8, 4096), "
                          f"torch.long))), not {type(inputs).__name__}; pass tensors as the model's own "
                          "arguments instead: remat.plan(model, x) or remat.plan(model, input_ids=ids)")
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    abstract = abstract_model(model) or any(is_abstract(t) for t in leaves)
    if inputs is None:
        return args, kwargs, abstract
    clash = sorted(set(kwargs) & set(inputs.kwargs))
    if clash:
        raise OptionError(f"{', '.join(map(repr, clash))} given twice: as a keyword and in inputs=")
    device = torch.device("meta") if abstract else _device_of(model)
    more_args, more_kwargs = inputs.tensors(device)
    return (*args, *more_args), {**kwargs, **more_kwargs}, device.type == "meta"


def _device_of(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for t in _tensors(model):
            return t.device
    return torch.device("meta")  # a function of its inputs alone: nothing to allocate
