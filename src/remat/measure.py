"""Measuring a training step: what autograd really saves, and how long a step takes.

Saved tensors are counted with ``torch.autograd.graph.saved_tensors_hooks``, which sees
eager autograd's saves and the compiled graphs' ``save_for_backward`` alike, so every method
is measured the same way. Tensors are deduplicated by storage; inputs and parameters are
reported apart from activations.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch


@dataclass(frozen=True)
class SavedTensors:
    count: int  # distinct saved activation tensors (inputs and params excluded)
    activation_bytes: int
    input_bytes: int  # saved tensors that are inputs or parameters


def _storage_key(t: torch.Tensor):
    try:
        return (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape), t.storage_offset())
    except (RuntimeError, NotImplementedError):
        return id(t)


def saved_tensors(step: Callable[[], torch.Tensor], held: Iterable[torch.Tensor] = ()) -> SavedTensors:
    """Run ``step()`` (a forward returning something to call ``.sum().backward()`` on) and
    count what autograd saved for the backward. ``held``: inputs and parameters."""
    held_ptrs = {t.untyped_storage().data_ptr() for t in held if isinstance(t, torch.Tensor)}
    seen: dict = {}

    def pack(t):
        if isinstance(t, torch.Tensor):
            seen.setdefault(_storage_key(t), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step()
    _backward(out)
    act = [t for t in seen.values() if t.untyped_storage().data_ptr() not in held_ptrs]
    inp = [t for t in seen.values() if t.untyped_storage().data_ptr() in held_ptrs]
    return SavedTensors(len(act), sum(t.numel() * t.element_size() for t in act),
                        sum(t.numel() * t.element_size() for t in inp))


def _backward(out) -> None:
    loss = out if out.dim() == 0 else out.float().sum()
    loss.backward()


def step_times(steps: dict[str, Callable[[], torch.Tensor]], repeats: int = 20, warmup: int = 3,
               zero: Sequence[torch.Tensor] = ()) -> dict[str, float]:
    """Median seconds of a forward+backward for each named step, alternating the methods
    in one loop so that machine noise hits them alike."""
    for _ in range(warmup):
        for fn in steps.values():
            _backward(fn())
    samples: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            for t in zero:
                t.grad = None
            t0 = time.perf_counter()
            _backward(fn())
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}
