"""PyTorch's ``ao`` offload ops, run for real on a CPU: only their stream, event and
pinned-memory parts are replaced.

``torch.ops.ao.offload`` / ``reload`` / ``wait_tensor``
(``torch._functorch._activation_offloading.offload_ops``) need an accelerator: a transfer
stream, events and pinned host buffers. :func:`install` swaps exactly those for CPU
stand-ins, so the ops' own code runs unchanged on this machine: the copies (synchronous here),
the wait registry keyed by ``data_ptr``, and ``wait_tensor`` freeing its ``keepalive``'s
storage with ``resize_(0)``. A freed buffer that a compiled kernel still reads or reuses then
shows as a crash or a wrong value, as it would on a GPU. It also makes remat lower offloads on
the CPU with these ops (:class:`remat.lower.offload.AsyncCopies`) instead of its own
synchronous ones, and PyTorch's activation offloading runs through the same ops.

Process-wide and not undone: call it in a process of its own (a test's subprocess,
``benchmarks/gpu_check.sh --cpu``). :func:`pending` lists waits never consumed (each
``ao.offload`` / ``ao.reload`` must be waited for exactly once).
"""

from __future__ import annotations

import torch


class _Event:
    """``torch.Event``: CPU copies are done when the op returns."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    """``torch.Stream``: one CPU stream, nothing to wait for."""

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()


_STREAM = _Stream()
_installed = False


def install() -> None:
    """Replace the ``ao`` ops' stream, event and pinned-buffer parts with CPU stand-ins, and
    have remat lower offloads with the ``ao`` ops on the CPU (see the module docstring)."""
    global _installed
    if _installed:
        return
    from torch._functorch._activation_offloading import offload_ops as ops

    from ..lower import offload as lowering

    def register_wait(tensor: torch.Tensor, device: torch.device) -> _Event:
        event = _Event()
        ops._wait_registry[tensor.data_ptr()] = (event, device)
        return event

    ops._get_or_create_transfer_stream = lambda device: _STREAM
    ops._maybe_pool_alloc = lambda numel, dtype: torch.empty(numel, dtype=dtype, device="cpu")
    ops._register_wait = register_wait
    torch.accelerator.current_stream = lambda device=None: _STREAM
    torch.accelerator.set_stream = lambda stream: None
    lowering.ASYNC_ON_CPU = True
    _installed = True


def pending() -> int:
    """Transfers started and never waited for."""
    from torch._functorch._activation_offloading import offload_ops as ops
    return len(ops._wait_registry)


def clear() -> None:
    """Forget pending transfers (after a step that failed)."""
    from torch._functorch._activation_offloading import offload_ops as ops
    ops._wait_registry.clear()
