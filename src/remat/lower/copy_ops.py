"""remat's own asynchronous copy ops: offload to host memory, reload, and wait, on a side stream.

They serve torch releases whose PyTorch ``ao`` offload ops are missing or lack an argument the
lowering passes (torch 2.10-2.12; :func:`remat.lower.offload.ao_problem`), and are built on
APIs torch 2.10 has: ``torch.library.custom_op``, ``torch.Stream``, ``torch.Event``,
``torch.accelerator``. Three ops, in the ``remat`` namespace::

    host = torch.ops.remat.offload_async(x)             # device -> pinned host, side stream
    host = torch.ops.remat.wait_copy(host, source=x)     # compute stream waits; x may go
    dev = torch.ops.remat.reload_async(host, device, size, stride)   # host -> device
    dev = torch.ops.remat.wait_copy(dev, source=host)

- ``offload_async(x)``: the side (transfer) stream of ``x``'s device first waits for the
  compute stream, so ``x`` is complete; then it copies ``x`` into a contiguous host buffer from
  :data:`POOL` (pinned, reused across steps) and records an event. Returns the host buffer.
- ``reload_async(host, device, size, stride)``: allocates the device tensor on the compute
  stream (in the layout ``size`` / ``stride`` name, else ``host``'s), has the side stream wait
  for the compute stream (the allocation may reuse a block that compute kernels still use),
  copies on the side stream and records an event.
- ``wait_copy(t, source)``: the compute stream waits on ``t``'s event (the host never does)
  and returns ``t`` itself (an aliasing schema, as a view would be). ``source`` is the copy's
  source: passing it makes the wait its last reader, so the lowering and inductor keep it alive,
  and never hand its buffer to another kernel, until the copy is done. Freeing is left to
  whoever holds it: where the wait is the source's last use, its device memory goes back to the
  caching allocator as the graph drops it, after the compute stream has waited, so a later
  allocation on that stream cannot overwrite it while the copy reads it. The wait does not
  ``resize_`` storage that the graph still names (a free inductor could not see: it would reuse
  that buffer for a kernel after the wait). No ``record_stream`` is needed: every tensor a copy
  touches is allocated on the compute stream and is held until the copy is done or the
  compute stream has waited for it.

Until its wait, each copy is pending (:func:`pending`), keyed by its destination's address;
while it runs, the registry holds its source and destination, so neither can be freed or
reused mid-copy, even by a caller that dropped them (a step that failed). A copy done, never
waited for and whose destination is gone is dropped (``abandoned``). :func:`counts` tells
copies issued, waited and abandoned.

The stream, event and host-memory parts go through a transport (:class:`Streams`, the real
one); :func:`use_transport` swaps in another, such as the CPU stand-in of
:mod:`remat.bench.ao_standin`, whose copies run late, when their event is waited for, so a
read before its wait or a buffer reused mid-copy shows as a wrong value. On a CPU without a
stand-in the copies are synchronous (CPU streams have no events).

Under inductor the ops are fallback (extern) kernels; ordering rests on data dependencies
alone: the wait reads the copy's result (and the source), every reader of a reloaded value
reads the wait's result, and ``wait_copy`` is marked side-effecting so no pass drops it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.node import has_side_effect
from torch.multiprocessing.reductions import StorageWeakRef

# -- the host pool ------------------------------------------------------------------------------


@dataclass
class _Buffer:
    tensor: torch.Tensor  # the pool's own reference: 1-D, numel elements
    ref: StorageWeakRef
    baseline: int  # the storage's use count when only the pool holds it


class HostPool:
    """Host buffers for offloaded copies, kept and reused across steps: a buffer is handed out
    only when nothing but the pool refers to its storage (no tensor, view or pending copy),
    so it is never handed out twice while in use. Buffers are keyed by element count, dtype,
    device and whether they are pinned; ``alloc(numel, dtype)`` makes a new one (default: the
    transport's pinned allocation).

    >>> pool = HostPool(alloc=lambda n, dt: torch.empty(n, dtype=dt))
    >>> a = pool.take(6, torch.float32, "cuda:0").view(2, 3)
    >>> b = pool.take(6, torch.float32, "cuda:0")   # a is in use: a new buffer
    >>> del a
    >>> c = pool.take(6, torch.float32, "cuda:0")   # a's buffer again
    >>> pool.stats()["buffers"], pool.stats()["reused"]
    (2, 1)
    """

    def __init__(self, alloc=None) -> None:
        self._alloc = alloc
        self._buffers: dict[tuple, list[_Buffer]] = {}
        self._by_ptr: dict[int, _Buffer] = {}
        self.taken = 0
        self.reused = 0

    def take(self, numel: int, dtype: torch.dtype, device: str, *, pinned: bool = True) -> torch.Tensor:
        """A 1-D host buffer of ``numel`` elements of ``dtype`` for copies from ``device``
        (its own key: buffers are not shared across devices, whose side streams are not
        ordered with each other): a free one of the pool's, else a new one."""
        key = (int(numel), dtype, str(device), bool(pinned))
        bucket = self._buffers.setdefault(key, [])
        self.taken += 1
        for buf in bucket:
            if self._free(buf):
                self.reused += 1
                return buf.tensor.view(-1)  # a view: the handed-out tensor is not the pool's
        alloc = self._alloc or (lambda n, dt: _transport.host_empty(n, dt, pinned=pinned))
        tensor = alloc(int(numel), dtype)
        if tensor.dim() != 1 or tensor.numel() != numel or tensor.dtype != dtype:
            raise ValueError(f"the pool's allocator returned {tuple(tensor.shape)} {tensor.dtype} "
                             f"for {numel} elements of {dtype}")
        ref = StorageWeakRef(tensor.untyped_storage())
        buf = _Buffer(tensor, ref, torch._C._storage_Use_Count(ref.cdata))
        bucket.append(buf)
        self._by_ptr[tensor.data_ptr()] = buf
        return tensor.view(-1)

    def own_uses(self, t: torch.Tensor) -> int:
        """How many uses of ``t``'s storage are the pool's own (0 for a tensor not from it)."""
        buf = self._by_ptr.get(t.untyped_storage().data_ptr())
        return 0 if buf is None else buf.baseline

    @staticmethod
    def _free(buf: _Buffer) -> bool:
        return torch._C._storage_Use_Count(buf.ref.cdata) <= buf.baseline

    def in_use(self) -> int:
        """How many of the pool's buffers someone holds now."""
        return sum(not self._free(b) for bs in self._buffers.values() for b in bs)

    def stats(self) -> dict[str, int]:
        """``buffers`` and ``bytes`` the pool keeps, how many are ``in_use``, how many buffers
        were ``taken`` and how many of those ``reused`` one already kept."""
        bufs = [b for bs in self._buffers.values() for b in bs]
        return {"buffers": len(bufs), "bytes": sum(b.tensor.numel() * b.tensor.element_size() for b in bufs),
                "in_use": self.in_use(), "taken": self.taken, "reused": self.reused}

    def clear(self) -> int:
        """Drop the buffers nobody holds (their host memory is released); returns how many."""
        dropped = 0
        for key, bucket in list(self._buffers.items()):
            keep = [b for b in bucket if not self._free(b)]
            dropped += len(bucket) - len(keep)
            self._buffers[key] = keep
            for b in bucket:
                if b not in keep:
                    self._by_ptr.pop(b.tensor.data_ptr(), None)
        return dropped


POOL = HostPool()
"""The pool :func:`offload_async` takes its host buffers from."""

# -- the transport: streams, events, host memory ------------------------------------------------


class Streams:
    """The device's own streams and events (``torch.Stream`` / ``torch.Event`` /
    ``torch.accelerator``) and pinned host memory: one side stream per device, created on
    first use. On a CPU, whose streams have no events, copies run at once."""

    def __init__(self) -> None:
        self._side: dict[torch.device, Any] = {}

    def side_stream(self, device: torch.device):
        if device not in self._side:
            self._side[device] = torch.Stream(device=device)
        return self._side[device]

    def current_stream(self, device: torch.device):
        return torch.accelerator.current_stream(device)

    def on(self, stream):
        """A block whose work runs on ``stream`` (``torch.Stream``'s own context: it restores
        the current stream and device after)."""
        return stream

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def new_event(self, device: torch.device):
        return torch.Event(device=device)

    def host_empty(self, numel: int, dtype: torch.dtype, *, pinned: bool = True) -> torch.Tensor:
        return torch.empty(numel, dtype=dtype, device="cpu", pin_memory=pinned and torch.accelerator.is_available())

    def synchronous(self, device: torch.device) -> bool:
        """Whether copies on ``device`` run at once, with no stream or event (a CPU)."""
        return device.type == "cpu"


_transport: Any = Streams()


def transport():
    """The transport the ops use now (:class:`Streams` unless :func:`use_transport` says)."""
    return _transport


@contextlib.contextmanager
def use_transport(t) -> Iterator[Any]:
    """Run the ops on transport ``t`` inside the block (a stand-in with :class:`Streams`'
    methods), then on the one before; any copy still pending is the caller's to wait for."""
    global _transport
    before, _transport = _transport, t
    try:
        yield t
    finally:
        _transport = before


def set_transport(t) -> Any:
    """Run the ops on transport ``t`` from now on (a process-wide stand-in); returns the one
    before."""
    global _transport
    before, _transport = _transport, t
    return before


# -- pending copies ------------------------------------------------------------------------------


@dataclass
class _Copy:
    event: Any  # None: the copy is already done (a synchronous transport)
    device: torch.device
    dst: StorageWeakRef  # the destination's storage: once nobody holds it, no wait can come
    own_uses: int  # the uses of it that are not a caller's (a pooled buffer's pool)
    held: tuple | None = field(repr=False)  # the source and the destination, until the copy is done

    def done(self) -> bool:
        return self.event is None or bool(self.event.query())

    def orphaned(self) -> bool:
        return torch._C._storage_Use_Count(self.dst.cdata) <= self.own_uses


_pending: dict[tuple[str, int], list[_Copy]] = {}
_counts = {"issued": 0, "waited": 0, "abandoned": 0}


def _key(t: torch.Tensor) -> tuple[str, int]:
    return (t.device.type, t.data_ptr())


def _tidy() -> None:
    """Let go of what finished copies hold, and drop copies nobody can wait for any more (their
    destination freed: a step that failed, a forward whose backward never ran). A copy still
    running keeps its source and destination, so neither is reused mid-copy; once done, they
    are freed when their last user drops them, waited for or not."""
    for key in list(_pending):
        keep = []
        for c in _pending[key]:
            if c.held is not None and c.done():
                c.held = None
            if c.held is None and c.orphaned():
                _counts["abandoned"] += 1
                continue
            keep.append(c)
        if keep:
            _pending[key] = keep
        else:
            del _pending[key]


def _start(dst: torch.Tensor, src: torch.Tensor, device: torch.device) -> None:
    """Copy ``src`` into ``dst`` on ``device``'s side stream, after the compute stream's work
    so far, and register the copy for its wait."""
    t = _transport
    event = None
    if t.synchronous(device):
        dst.copy_(src)
    else:
        side = t.side_stream(device)
        side.wait_stream(t.current_stream(device))
        with t.on(side):
            t.copy(dst, src)
        event = t.new_event(device)
        event.record(side)
    copy = _Copy(event, device, StorageWeakRef(dst.untyped_storage()), POOL.own_uses(dst), (src, dst))
    _pending.setdefault(_key(dst), []).append(copy)
    _counts["issued"] += 1


def pending() -> int:
    """Copies started and not yet waited for (0 at the end of every step), less those nobody
    can wait for any more."""
    _tidy()
    return sum(len(v) for v in _pending.values())


def counts() -> dict[str, int]:
    """Copies ``issued``, ``waited`` and ``abandoned`` (done, never waited for, their
    destination freed) in this process so far."""
    return dict(_counts)


def forget_pending() -> int:
    """Drop the copies a failed step left pending (the compute stream does not wait for them);
    returns how many."""
    n = pending()
    _pending.clear()
    return n


# -- the ops ---------------------------------------------------------------------------------------


@torch.library.custom_op("remat::offload_async", mutates_args=())
def offload_async(x: torch.Tensor) -> torch.Tensor:
    """Start copying ``x`` to a contiguous host buffer of :data:`POOL` (see the module
    docstring); wait for it with ``wait_copy(host, source=x)``."""
    _tidy()  # first: a pooled buffer an abandoned copy wrote may be handed out now
    host = POOL.take(x.numel(), x.dtype, str(x.device), pinned=not _transport.synchronous(x.device))
    host = host.view(x.shape)
    _start(host, x, x.device)
    return host


@offload_async.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device="cpu")


@torch.library.custom_op("remat::reload_async", mutates_args=())
def reload_async(host: torch.Tensor, device: torch.device, size: list[int] | None = None,
                 stride: list[int] | None = None) -> torch.Tensor:
    """Start copying the host tensor ``host`` to ``device``, into a new tensor of ``size`` and
    ``stride`` (the original layout; default ``host``'s); wait for it with
    ``wait_copy(out, source=host)``."""
    _tidy()
    out = _reload_out(host, device, size, stride)
    _start(out, host, out.device)
    return out


def _reload_out(host, device, size, stride) -> torch.Tensor:
    size = list(host.shape) if size is None else size
    stride = list(host.stride()) if stride is None else stride
    return torch.empty_strided(size, stride, dtype=host.dtype, device=device)


@reload_async.register_fake
def _(host: torch.Tensor, device: torch.device, size: list[int] | None = None,
      stride: list[int] | None = None) -> torch.Tensor:
    return _reload_out(host, device, size, stride)


# wait_copy returns its input (an alias, which torch.library.custom_op does not allow): defined
# with a schema. CompositeExplicitAutograd: one implementation for every device, as the offload's
# wait mixes a host tensor with a device source.
_lib = torch.library.Library("remat", "FRAGMENT")
_lib.define("wait_copy(Tensor(a) tensor, Tensor? source=None) -> Tensor(a)")


def _wait_copy(tensor: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
    queue = _pending.get(_key(tensor))
    if not queue:
        raise RuntimeError(
            f"remat::wait_copy: no copy into this {tensor.device} tensor ({tuple(tensor.shape)}, "
            f"{tensor.dtype}) is pending: every wait_copy follows one remat::offload_async or "
            "remat::reload_async of that tensor, and waits for it once")
    copy = queue.pop(0)
    if not queue:
        del _pending[_key(tensor)]
    if copy.event is not None:
        _transport.current_stream(copy.device).wait_event(copy.event)
    _counts["waited"] += 1
    return tensor  # copy.held goes here: the source is freed where the graph no longer names it


torch.library.impl("remat::wait_copy", "CompositeExplicitAutograd", _wait_copy, lib=_lib)


@torch.library.register_fake("remat::wait_copy", lib=_lib)
def _(tensor: torch.Tensor, source: torch.Tensor | None = None) -> torch.Tensor:
    return tensor


has_side_effect(torch.ops.remat.wait_copy.default)

OFFLOAD = torch.ops.remat.offload_async.default
RELOAD = torch.ops.remat.reload_async.default
WAIT = torch.ops.remat.wait_copy.default
