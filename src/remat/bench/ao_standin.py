"""The asynchronous copy ops, run for real on a CPU: only their stream, event and
pinned-memory parts are replaced. Two sets: PyTorch's ``ao`` ops and remat's own
(:mod:`remat.lower.copy_ops`).

``torch.ops.ao.offload`` / ``reload`` / ``wait_tensor``
(``torch._functorch._activation_offloading.offload_ops``) need an accelerator: a transfer
stream, events and pinned host buffers. :func:`install` swaps exactly those for CPU
stand-ins, so the ops' own code runs unchanged on this machine: the copies (synchronous here),
the wait registry keyed by ``data_ptr``, and ``wait_tensor`` freeing its ``keepalive``'s
storage with ``resize_(0)``. A freed buffer that a compiled kernel still reads or reuses then
shows as a crash or a wrong value, as it would on a GPU. It also makes remat lower offloads on
the CPU with these ops (:class:`remat.lower.offload.AsyncCopies`) instead of its own
synchronous ones, and PyTorch's activation offloading runs through the same ops.

For remat's own ops, :class:`CpuStreams` is a transport (:func:`remat.lower.copy_ops.use_transport`)
that models the side stream instead of stubbing it: a copy issued on it does not run when
issued but when an event recorded after it is waited for (or the stream is waited for), in
the order issued, and its destination reads NaN (integers: their largest value) until then.
A reader placed before its wait, or a source reused before the copy ran, therefore gives a
wrong value here as it would on a GPU. :func:`install` sets it process-wide (where this torch
lacks the ``ao`` ops, only it); :func:`standing_in` sets it for a block.

Process-wide and not undone: call it in a process of its own (a test's subprocess,
``benchmarks/gpu_check.sh --cpu``). :func:`pending` counts waits never consumed (each
``ao.offload`` / ``ao.reload`` / ``remat::offload_async`` / ``remat::reload_async`` must be
waited for exactly once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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


# -- remat's own ops: a side stream whose copies run late ---------------------------------------

class _LateEvent:
    """An event: marks how many of its stream's copies were issued when it was recorded."""

    def __init__(self) -> None:
        self.stream: _LateStream | None = None
        self.mark = 0

    def record(self, stream=None) -> None:
        if stream is None:
            raise RuntimeError("the stand-in's events are recorded on a stream they are given")
        self.stream, self.mark = stream, stream.issued

    def query(self) -> bool:
        return self.stream is None or self.stream.done >= self.mark

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run(self.mark)


class _LateStream:
    """A stream whose copies (``late=True``) wait in a queue until something waits for them;
    the compute stream (``late=False``) runs everything at once, as CPU kernels do."""

    def __init__(self, late: bool, device=None) -> None:
        self.late, self.device = late, device
        self.queue: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.issued = self.done = 0
        self.waits = 0

    def run(self, upto: int | None = None) -> None:
        """Run the queued copies, in order, up to the ``upto``-th issued (default: all)."""
        upto = self.issued if upto is None else upto
        while self.done < upto:
            dst, src = self.queue.pop(0)
            dst.copy_(src)
            self.done += 1

    def wait_stream(self, other) -> None:
        other.run()

    def wait_event(self, event) -> None:
        self.waits += 1
        event.synchronize()

    def record_event(self, event=None):
        event = _LateEvent() if event is None else event
        event.record(self)
        return event


def _poison(t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).max)


class CpuStreams:
    """A transport for remat's copy ops on a CPU (see the module docstring): one late side
    stream per device, a compute stream that runs at once, events that mark a point in the
    side stream, plain (unpinned) host buffers. ``copies`` counts copies issued on a side
    stream, ``ran_late`` those that ran at a wait rather than before it."""

    def __init__(self) -> None:
        self.compute = _LateStream(late=False)
        self._current = self.compute
        self._side: dict = {}
        self.copies = 0

    def side_stream(self, device):
        return self._side.setdefault(str(device), _LateStream(late=True, device=device))

    def current_stream(self, device):
        return self._current

    @contextlib.contextmanager
    def on(self, stream) -> Iterator[None]:
        before, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = before

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        stream = self._current
        if not stream.late:
            dst.copy_(src)
            return
        _poison(dst)
        stream.queue.append((dst, src))
        stream.issued += 1
        self.copies += 1

    def new_event(self, device) -> _LateEvent:
        return _LateEvent()

    def host_empty(self, numel: int, dtype: torch.dtype, *, pinned: bool = True) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, device="cpu")

    def synchronous(self, device) -> bool:
        return False

    def queued(self) -> int:
        """Copies issued and not yet run, on every side stream."""
        return sum(len(s.queue) for s in self._side.values())


@contextlib.contextmanager
def standing_in() -> Iterator[CpuStreams]:
    """Inside the block, remat lowers CPU offloads with asynchronous copy ops
    (:data:`remat.lower.offload.ASYNC_ON_CPU`) and remat's own ops run on a fresh
    :class:`CpuStreams`; both are restored after. (Which set of ops lowers them is
    :func:`remat.lower.offload.async_ops`'s choice: PyTorch's ``ao`` ops where this torch's
    fit, and those need :func:`install`.)"""
    from ..lower import copy_ops
    from ..lower import offload as lowering

    before = lowering.ASYNC_ON_CPU
    lowering.ASYNC_ON_CPU = True
    try:
        with copy_ops.use_transport(CpuStreams()) as t:
            yield t
    finally:
        lowering.ASYNC_ON_CPU = before


def install() -> None:
    """Replace the copy ops' stream, event and pinned-buffer parts with CPU stand-ins (the
    ``ao`` ops' where this torch has them, remat's own always), and have remat lower offloads
    with asynchronous ops on the CPU (see the module docstring)."""
    global _installed
    if _installed:
        return
    from ..lower import copy_ops
    from ..lower import offload as lowering

    copy_ops.set_transport(CpuStreams())
    lowering.ASYNC_ON_CPU = True
    _installed = True
    try:
        from torch._functorch._activation_offloading import offload_ops as ops
    except ImportError:  # torch 2.10-2.12: remat's own ops only
        return

    def register_wait(tensor: torch.Tensor, device: torch.device) -> _Event:
        event = _Event()
        ops._wait_registry[tensor.data_ptr()] = (event, device)
        return event

    ops._get_or_create_transfer_stream = lambda device: _STREAM
    ops._maybe_pool_alloc = lambda numel, dtype: torch.empty(numel, dtype=dtype, device="cpu")
    ops._register_wait = register_wait
    torch.accelerator.current_stream = lambda device=None: _STREAM
    torch.accelerator.set_stream = lambda stream: None


def _ao_registry() -> dict:
    try:
        from torch._functorch._activation_offloading import offload_ops as ops
    except ImportError:
        return {}
    return ops._wait_registry


def pending() -> int:
    """Transfers started and never waited for (PyTorch's ``ao`` ops' and remat's own)."""
    from ..lower import copy_ops
    return len(_ao_registry()) + copy_ops.pending()


def clear() -> None:
    """Forget pending transfers (after a step that failed)."""
    from ..lower import copy_ops
    _ao_registry().clear()
    copy_ops.forget_pending()
