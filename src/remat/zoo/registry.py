"""The zoo's registry: entries, sizes, and :func:`build` (see :mod:`remat.zoo`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

SIZES = ("tiny", "small", "full")
KINDS = ("pattern", "model")


@dataclass
class Case:
    """One benchmark case: a model, its inputs, and how to turn its output into a loss."""

    name: str
    size: str
    kind: str  # "pattern" | "model"
    model: torch.nn.Module  # forward(*inputs) -> output
    inputs: tuple  # positional args, on the device; those needing grads have requires_grad=True
    loss: Callable[[Any], torch.Tensor]  # output -> scalar loss
    blocks: list[str]  # qualified submodule names full checkpointing wraps; [""] = the whole model
    batch: int | None  # the batch size used (None: no batch dimension)
    description: str
    info: dict = field(default_factory=dict)  # entry-specific facts (e.g. qEHVI's q, cells)

    def params_and_inputs(self) -> list[torch.Tensor]:
        """Everything that receives a gradient: parameters, then inputs with requires_grad."""
        return list(self.model.parameters()) + [
            x for x in self.inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(x.shape) for x in self.inputs if isinstance(x, torch.Tensor)]

    def __repr__(self) -> str:
        return (f"Case({self.name!r}, {self.size!r}, kind={self.kind!r}, batch={self.batch}, "
                f"inputs={self.input_shapes()}, params={self.num_params})")


@dataclass(frozen=True)
class _Entry:
    name: str
    kind: str
    builder: Callable[..., dict]
    description: str
    has_batch: bool


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, kind: str, description: str, *, has_batch: bool = True):
    """Decorator: ``builder(size, batch) -> dict(model=, inputs=, loss=, blocks=, batch=[, info=])``.
    ``batch`` is None unless overridden; the builder picks its size's default then. The
    builder runs under ``torch.manual_seed(seed)`` and builds on the CPU in float32;
    :func:`build` moves the model and floating inputs to the device and dtype."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {KINDS}")

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"zoo entry {name!r} registered twice")
        _REGISTRY[name] = _Entry(name, kind, fn, description, has_batch)
        return fn

    return deco


def names(kind: str | None = None) -> list[str]:
    """Entry names in registration order; ``kind``: ``"pattern"``, ``"model"`` or None (all)."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; use one of {KINDS} or None")
    return [n for n, e in _REGISTRY.items() if kind is None or e.kind == kind]


def describe(name: str) -> str:
    return _entry(name).description


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown zoo entry {name!r}; valid names: {', '.join(_REGISTRY)}") from None


def build(name: str, size: str = "tiny", *, batch: int | None = None, device: str | torch.device = "cpu",
          dtype: torch.dtype = torch.float32, seed: int = 0) -> Case:
    """Build entry ``name`` at ``size`` (``tiny``, ``small``, ``full``). Deterministic in ``seed``
    (the global RNG is left as it was)."""
    entry = _entry(name)
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid sizes: {', '.join(SIZES)}")
    if batch is not None:
        if not entry.has_batch:
            raise ValueError(f"zoo entry {name!r} has no batch dimension; pass batch=None")
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        batch = int(batch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        spec = entry.builder(size, batch)
    model: torch.nn.Module = spec["model"].to(device=device, dtype=dtype).train()
    inputs = tuple(_to(x, device, dtype) for x in spec["inputs"])
    return Case(name=name, size=size, kind=entry.kind, model=model, inputs=inputs, loss=spec["loss"],
                blocks=list(spec["blocks"]), batch=spec["batch"], description=entry.description,
                info=dict(spec.get("info", {})))


def _to(x, device, dtype):
    if not isinstance(x, torch.Tensor):
        return x
    grad = x.requires_grad
    x = x.detach().to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
    return x.requires_grad_(grad)


def _to_device_loss(fn: Callable, *tensors: torch.Tensor) -> Callable:
    """A loss closure over ``tensors`` (targets) that moves them to the output's device once."""
    cache: dict = {}

    def loss(out):
        dev = _first_tensor(out).device
        if dev not in cache:
            cache[dev] = tuple(t.to(dev) for t in tensors)
        return fn(out, *cache[dev])

    return loss


def _first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    raise TypeError(f"expected a tensor output, got {type(out).__name__}")


__all__ = ["Case", "SIZES", "KINDS", "names", "build", "describe", "register"]
