"""Planned activation offloading in eager PyTorch: only the saved values a plan marks go to host
memory, and they come back ahead of the backward that reads them.

Two entry points, for the two places a value can be saved in an eager step:

- :func:`offload_hooks` — a context manager around a region run *without* checkpointing (an
  unwrapped block, or a whole model). It installs
  :func:`torch.autograd.graph.saved_tensors_hooks` whose pack hook moves a saved tensor to host
  memory when the plan marks it, and leaves every other saved tensor where it is. A plan marks a
  value by the ATen op call that produced it (``decisions``, below); the hooks learn which call
  produced each saved tensor from a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that
  watches the region's forward. ``decisions=ALL`` offloads every saved activation (what
  torchtune's and TRL's ``OffloadActivations`` do; :mod:`remat.eager.baselines` uses it).
- :func:`selective_offload_contexts` — a ``context_fn`` for a block under non-reentrant
  :func:`torch.utils.checkpoint.checkpoint` with a selective-checkpointing policy. Inside such a
  block autograd's saved tensors never reach saved-tensor hooks (checkpoint replaces them with
  recomputation); what crosses to the backward are the op outputs the policy saves
  (``MUST_SAVE``), kept in SAC's cache. The contexts run PyTorch's own SAC
  (:func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`) and, as the block's
  forward ends, move the cached outputs the plan marks to host memory; the block's recomputation
  in the backward brings them back (and starts the previous block's, which the backward reaches
  next).

Which to use where: hooks entered *around* a call of ``torch.utils.checkpoint.checkpoint`` see
nothing saved inside it (checkpointing's own saved-tensor hooks are the innermost; SAC's cache
bypasses hooks altogether), so a checkpointed block offloads through its ``context_fn``
(:func:`selective_offload_contexts`, or :func:`wrap_sac_contexts` over SAC contexts built
elsewhere), and :func:`offload_hooks` serves blocks left unwrapped and code outside the blocks.

``decisions`` (both entry points) says which op calls' outputs to offload:

- :data:`ALL` (or ``True``): every saved tensor (hooks) / every saved output (SAC);
- a collection of keys, each ``(op, k)``: the ``k``-th call (from 0, counted per op from the
  region's start, the counter SAC's own cache uses) of ``op``, an ``OpOverload`` such as
  ``torch.ops.aten.mm.default`` or its name ``"aten.mm.default"``; or a bare ``op``: every call
  of it;
- a mapping from such keys to a decision, as :func:`remat.eager.plan.decisions` writes them
  (``{("aten.mm.default", 1): "offload", ...}``): the keys whose value is ``"offload"``;
- a callable ``(op, k, tensor) -> bool``.

Copies (:class:`Offloader`):

- **CUDA**: one side stream carries every copy, both ways. An offload waits for the compute
  stream (the value is ready), copies into a pinned host buffer from a pool
  (:class:`HostPool`), records an event, and calls ``record_stream`` on the device tensor so that
  the caching allocator does not hand its memory to the compute stream before the copy has read
  it; the device memory goes when the last reference does. A reload allocates on the compute
  stream, copies on the side stream (``record_stream`` again), and the compute stream waits on
  its event only when the value is read. Host buffers go back to the pool once their reload is
  queued: every later copy into them is on the same side stream, so it runs after it.
- **CPU** (tests, and the benchmark on this machine): plain synchronous copies. The host copies
  live in numpy-owned buffers, outside torch's allocator, so that remat's measurement
  (:func:`remat.bench.measure.peak_memory`, the profiler's allocation records) counts them apart
  from the step's memory, as a GPU's allocator statistics do not count pinned host memory.
  ``Offloader.host_peak_bytes`` says how much host memory they took.

Reloading ahead ("prefetch"): under :func:`offload_hooks` the values are kept in forward order,
and reading one in the backward starts the reload of the next ``prefetch`` values before it (the
backward reads roughly in reverse); under :func:`selective_offload_contexts` a block's
recomputation starts its own reloads and those of the ``prefetch`` blocks run before it (a block
reads its values from its recomputation's start, so its own cannot start earlier without a hook
in the block after it). The default is 2 on CUDA and 0 on a CPU (where a reload ahead only holds
memory longer).

What is never offloaded: tensors under ``min_bytes`` (1 KiB), parameters, tensor subclasses
(DTensor, fake tensors), tensors on another device, under op-call decisions the tensors made
outside the region (its inputs: no op of it produced them), and values
whose elements are not dense in memory in some order of their dimensions (an expanded view):
copies keep a value's strides, since code reading it may depend on them (SAC's recomputation
does: a ``.contiguous()`` that was free in the forward and copies after a reload is an op SAC
never cached). A value saved by several autograd nodes is copied once.

Whether to offload a value or recompute it depends on the link: :func:`eager_link` is the link
the plan should price copies with (measured once per GPU by :mod:`remat.capture.link`, a memcpy on
a CPU), and :func:`choose_offloads` picks, among values the plan would otherwise recompute, those
whose copies cost less than their recomputation.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .capture import storage_key

ALL = "all"
"""``decisions`` that offload every saved activation."""

MIN_BYTES = 1024
"""Saved tensors smaller than this stay where they are (a copy's fixed cost is not worth it)."""

try:  # the ops SAC neither counts nor caches: counted the same way here, the keys line up
    from torch.utils.checkpoint import SAC_IGNORED_OPS as _IGNORED
except ImportError:  # pragma: no cover - older torch
    _IGNORED = {torch.ops.aten.detach.default}


# -- which op call produced a value -----------------------------------------------------------

def op_name(op) -> str:
    """``"aten.mm.default"`` for ``torch.ops.aten.mm.default`` (its ``str``; a string is
    returned as is)."""
    return op if isinstance(op, str) else str(op)


Decider = Callable[[Any, int, "torch.Tensor | None"], bool]


def decider(decisions) -> Decider:
    """``decisions`` (see the module docstring) as a function ``(op, k, tensor) -> bool``."""
    if decisions is True or decisions == ALL:
        return lambda op, k, t: True
    if decisions is None or decisions is False:
        return lambda op, k, t: False
    if callable(decisions):
        return decisions
    if isinstance(decisions, Mapping):  # a plan's {(op, k): "save" | "recompute" | "offload"}
        decisions = [k for k, v in decisions.items() if v == "offload" or v is True]
    calls: set[tuple[str, int]] = set()
    ops: set[str] = set()
    for d in decisions:
        if isinstance(d, tuple) and len(d) == 2 and isinstance(d[1], int):
            calls.add((op_name(d[0]), int(d[1])))
        else:
            ops.add(op_name(d))
    return lambda op, k, t: (op_name(op) in ops) or ((op_name(op), k) in calls)


class _Producers(TorchDispatchMode):
    """Records, for each storage an op call writes, which call it was: ``(op, k)``, ``k``
    counted per op from the mode's entry."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Any, int] = defaultdict(int)
        self.by_storage: dict[Any, tuple[Any, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _IGNORED:
            return out
        k = self.counts[func]
        self.counts[func] += 1
        if func._schema.is_mutable or any(r.alias_info is not None for r in func._schema.returns):
            return out  # a view or an in-place op: the storage keeps its producer

        def note(x):
            if isinstance(x, torch.Tensor):
                key = storage_key(x)
                if key is not None:
                    self.by_storage[key] = (func, k)
            return x

        tree_map(note, out)
        return out


# -- host buffers and copies ------------------------------------------------------------------

def dense_strides(shape, stride) -> bool:
    """Whether a tensor of ``shape`` and ``stride`` covers exactly ``numel`` elements with no
    overlap (contiguous in some order of its dimensions, as a transpose or a permute of a
    contiguous tensor is): then its copy can keep its strides in a buffer of its own size. A
    copy that made such a tensor contiguous would change what the code reading it does (a
    ``.contiguous()`` that was a no-op in the forward copies in the recomputation, and SAC finds
    an op it never cached).

    >>> dense_strides((2, 3), (3, 1)), dense_strides((3, 2), (1, 3)), dense_strides((2, 3), (6, 1))
    (True, True, False)
    """
    expected = 1
    for size, st in sorted(((n, s) for n, s in zip(shape, stride) if n != 1), key=lambda d: d[1]):
        if st != expected:
            return False
        expected *= size
    return True


class HostPool:
    """Host buffers for offloaded values, reused by size: pinned memory for a CUDA device,
    numpy-owned memory for a CPU one (outside torch's allocator, see the module docstring).
    ``bytes`` are those handed out now, ``peak_bytes`` the most at once, ``reserved_bytes`` all
    the pool holds."""

    ALIGN = 512

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.bytes = 0
        self.peak_bytes = 0
        self.reserved_bytes = 0

    def _size(self, nbytes: int) -> int:
        return max(self.ALIGN, -(-nbytes // self.ALIGN) * self.ALIGN)

    def get(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of at least ``nbytes``."""
        size = self._size(nbytes)
        free = self._free[size]
        if free:
            buf = free.pop()
        else:
            if self.pinned:
                buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            else:
                import numpy as np
                buf = torch.from_numpy(np.empty(size, dtype=np.uint8))
            self.reserved_bytes += size
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return buf

    def put(self, buf: torch.Tensor) -> None:
        self.bytes -= buf.numel()
        self._free[buf.numel()].append(buf)

    def clear(self) -> None:
        """Drop the buffers not handed out."""
        for size, bufs in self._free.items():
            self.reserved_bytes -= size * len(bufs)
        self._free.clear()


@dataclass(eq=False)
class Handle:
    """One offloaded value: its host copy and what is needed to bring it back."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    nbytes: int
    requires_grad: bool
    stride: tuple = ()  # the value's strides, kept by its copies (a reader may depend on them)
    host: torch.Tensor | None = None  # the pool's buffer
    event: Any = None  # CUDA: the offload's event
    reloaded: torch.Tensor | None = None  # the device copy, once reloaded
    reload_event: Any = None
    key: Any = None
    index: int = -1  # position among its Offloader session's values (forward order)
    release: Any = None  # gives the host buffer back if the handle goes unread


@dataclass
class OffloadStats:
    offloaded: int = 0  # values moved to host
    offloaded_bytes: int = 0
    kept: int = 0  # saved values seen and not offloaded (unmarked, small, parameters)
    reloaded: int = 0
    prefetched: int = 0  # reloads started ahead of their read
    ops: dict[str, int] = field(default_factory=dict)  # offloaded values by producing op


class Offloader:
    """Moves tensors to host memory and back (see the module docstring for CUDA and CPU).

    ``device``: where the values live (default: CUDA's current device when available, else the
    CPU); ``prefetch``: values reloaded ahead (default 2 on CUDA, 0 on a CPU); ``min_bytes``:
    smaller tensors are not offloaded; ``stream``: the side stream (CUDA; default a new one);
    ``pool``: a :class:`HostPool` to share."""

    def __init__(self, device=None, *, prefetch: int | None = None, min_bytes: int = MIN_BYTES,
                 stream=None, pool: HostPool | None = None) -> None:
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.prefetch = (2 if self.cuda else 0) if prefetch is None else int(prefetch)
        self.min_bytes = int(min_bytes)
        self.pool = pool or HostPool(pinned=self.cuda)
        self.stream = (stream or torch.cuda.Stream(self.device)) if self.cuda else None
        self.stats = OffloadStats()

    @property
    def host_peak_bytes(self) -> int:
        return self.pool.peak_bytes

    def eligible(self, t: torch.Tensor) -> bool:
        """Whether ``t`` may be offloaded: at least ``min_bytes``, its elements dense in memory
        in some order of its dimensions (:func:`dense_strides`: its copy keeps its strides), not a
        tensor subclass (a DTensor, a fake tensor), on this offloader's device."""
        if type(t) is not torch.Tensor or t.layout is not torch.strided or t.is_meta:
            return False
        if t.device.type != self.device.type:
            return False
        return t.numel() * t.element_size() >= self.min_bytes and dense_strides(t.shape, t.stride())

    def offload(self, t: torch.Tensor, op=None) -> Handle:
        """Start copying ``t`` to host memory; returns its :class:`Handle`."""
        nbytes = t.numel() * t.element_size()
        h = Handle(t.shape, t.dtype, t.device, nbytes, t.requires_grad, stride=tuple(t.stride()))
        buf = self.pool.get(nbytes)
        h.host = buf
        # a value never read back (a forward without its backward) gives its buffer back when
        # its handle goes; later copies into it queue behind this one on the same stream
        h.release = weakref.finalize(h, self.pool.put, buf)
        host = buf[:nbytes].view(t.dtype).as_strided(t.shape, h.stride)  # the same layout
        if self.cuda:
            current = torch.cuda.current_stream(t.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                host.copy_(t, non_blocking=True)
                h.event = torch.cuda.Event()
                h.event.record(self.stream)
            t.record_stream(self.stream)  # the allocator keeps t's memory until the copy has read it
        else:
            with torch.no_grad():
                host.copy_(t)
        self.stats.offloaded += 1
        self.stats.offloaded_bytes += nbytes
        if op is not None:
            name = op_name(op)
            self.stats.ops[name] = self.stats.ops.get(name, 0) + 1
        return h

    def start_reload(self, h: Handle, *, ahead: bool = False) -> None:
        """Start copying ``h`` back to its device (nothing if already started)."""
        if h.reloaded is not None or h.host is None:
            return
        host = h.host[:h.nbytes].view(h.dtype).as_strided(h.shape, h.stride)
        if self.cuda:
            current = torch.cuda.current_stream(h.device)
            out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)  # on the compute stream
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                out.copy_(host, non_blocking=True)
                h.reload_event = torch.cuda.Event()
                h.reload_event.record(self.stream)
            out.record_stream(self.stream)
        else:
            with torch.no_grad():
                out = torch.empty_strided(h.shape, h.stride, dtype=h.dtype, device=h.device)
                out.copy_(host)
        h.reloaded = out
        if h.release is not None:
            h.release.detach()
        self.pool.put(h.host)  # later copies into it are queued behind this one (same stream)
        h.host = None
        self.stats.reloaded += 1
        self.stats.prefetched += bool(ahead)

    def get(self, h: Handle) -> torch.Tensor:
        """The value of ``h`` on its device, ready for the compute stream."""
        self.start_reload(h)
        if self.cuda and h.reload_event is not None:
            torch.cuda.current_stream(h.device).wait_event(h.reload_event)
            h.reload_event = None
        return h.reloaded


def _device_of(device):
    return torch.device(device) if device is not None else None


# -- saved-tensor hooks -----------------------------------------------------------------------

class _HookSession:
    """One :func:`offload_hooks` region: the pack and unpack hooks and their values."""

    def __init__(self, offloader: Offloader, decide: Decider, producers: _Producers | None) -> None:
        self.off = offloader
        self.decide = decide
        self.producers = producers
        self.values: list[weakref.ref] = []  # handles in forward order
        self.by_key: dict[int, tuple] = {}  # id(tensor) -> (weakref, Handle): one copy per saved tensor

    def pack(self, t):
        off = self.off
        if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter) or not off.eligible(t):
            off.stats.kept += 1
            return t
        op, k = None, -1
        if self.producers is not None:
            producer = self.producers.by_storage.get(storage_key(t))
            if producer is None:  # an input of the region, or made outside the mode
                off.stats.kept += 1
                return t
            op, k = producer
        if not self.decide(op, k, t):
            off.stats.kept += 1
            return t
        # the same tensor saved by several nodes is copied once; identity by a weak reference,
        # since once copied its memory may go and its address serve another tensor
        key = id(t)
        seen = self.by_key.get(key)
        if seen is not None and seen[0]() is t and seen[1].host is not None:
            return seen[1]
        h = off.offload(t, op)
        h.key = key
        h.index = len(self.values)
        self.by_key[key] = (weakref.ref(t), h)
        self.values.append(weakref.ref(h))
        return h

    def unpack(self, h):
        if not isinstance(h, Handle):
            return h
        off = self.off
        out = off.get(h)
        if off.prefetch > 0:
            started = 0
            i = h.index - 1
            while i >= 0 and started < off.prefetch:
                other = self.values[i]()
                if other is not None and other.reloaded is None and other.host is not None:
                    off.start_reload(other, ahead=True)
                    started += 1
                i -= 1
        seen = self.by_key.get(h.key)
        if seen is not None and seen[1] is h:
            del self.by_key[h.key]
        return out


@contextlib.contextmanager
def offload_hooks(decisions=ALL, *, offloader: Offloader | None = None, device=None,
                  prefetch: int | None = None, min_bytes: int = MIN_BYTES):
    """Offload the saved activations of the code run inside it that ``decisions`` marks.

    ``decisions``: :data:`ALL`, op-call keys ``(op, k)`` / ops, or a callable ``(op, k, tensor)
    -> bool`` (module docstring); ``k`` counts each op's calls from this context's entry, in the
    order SAC's cache counts them, so the keys a plan made from one captured forward of a
    region mark the same values in every later forward of it. ``offloader``: an
    :class:`Offloader` to share between regions (its pool, stream and stats); else one is made
    from ``device``, ``prefetch`` and ``min_bytes``. Yields the offloader.

    Parameters, tensors under ``min_bytes``, tensor subclasses and the region's own inputs are
    never offloaded. A value saved by several autograd nodes is copied once. The backward may
    run after the context has exited: the hooks stay with the saved values.

    >>> import torch
    >>> w = torch.randn(64, 64, requires_grad=True)
    >>> x = torch.randn(32, 64)
    >>> with offload_hooks({("aten.tanh.default", 0)}) as off:  # tanh's output only
    ...     y = (x @ w).tanh() @ w      # tanh and the second mm both save it: one copy
    >>> y.sum().backward()
    >>> off.stats.offloaded, off.stats.ops
    (1, {'aten.tanh.default': 1})
    """
    off = offloader or Offloader(device, prefetch=prefetch, min_bytes=min_bytes)
    every = decisions is True or decisions == ALL
    producers = None if every else _Producers()
    session = _HookSession(off, decider(decisions), producers)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(session.pack, session.unpack))
        if producers is not None:
            stack.enter_context(producers)
        yield off


# -- inside selective checkpointing -----------------------------------------------------------

class _Group:
    """The offloaded outputs of one block's forward under SAC."""

    def __init__(self) -> None:
        self.wrappers: list[_OffloadedEntry] = []
        self.started = False


class _OffloadedEntry:
    """Stands in SAC's cache for an offloaded output (duck-types SAC's ``_VersionWrapper``:
    ``get_val(allow_cache_entry_mutation)``)."""

    def __init__(self, off: Offloader, handle: Handle) -> None:
        self.off = off
        self.handle = handle

    def get_val(self, allow_cache_entry_mutation=False):
        return self.off.get(self.handle)


class _SelectiveOffload:
    """Shared state of the :func:`selective_offload_contexts` calls that use one offloader: the
    blocks' groups in forward order, for reloading the blocks before a block ahead."""

    def __init__(self, off: Offloader) -> None:
        self.off = off
        self.groups: list[weakref.ref] = []

    def offload(self, storage, marked: list[tuple[Any, int, int]], group: _Group) -> None:
        """Replace SAC's cached entries of the ``marked`` calls (``(op, k among all its calls,
        k among its saved calls)``) by host copies."""
        for func, k_all, k_saved in marked:
            per_op = storage.get(func) if hasattr(storage, "get") else None
            if isinstance(per_op, dict) and k_all in per_op:  # torch 2.13: every call's index
                per_op[k_all] = self._replace(per_op[k_all], group, func)
            elif isinstance(per_op, list) and k_saved < len(per_op):  # older: saved calls only
                per_op[k_saved] = self._replace(per_op[k_saved], group, func)
        if group.wrappers:
            self.groups = [g for g in self.groups if g() is not None]
            self.groups.append(weakref.ref(group))

    def _replace(self, entry, group: _Group, func):
        def one(w):
            val = getattr(w, "val", None)
            if isinstance(val, torch.Tensor) and hasattr(w, "get_val") and self.off.eligible(val):
                if getattr(w, "version", None) is not None and val._version != w.version:
                    return w  # mutated already: left to SAC's own check
                new = _OffloadedEntry(self.off, self.off.offload(val, func))
                group.wrappers.append(new)
                return new
            return w

        if isinstance(entry, (tuple, list)):
            return type(entry)(one(w) for w in entry)
        return one(entry)

    def reload(self, group: _Group) -> None:
        """A block's recomputation begins: its values come back, and those of the
        ``prefetch`` blocks before it start to."""
        for w in group.wrappers:
            self.off.start_reload(w.handle)
        group.started = True
        if self.off.prefetch <= 0:
            return
        live = [g() for g in self.groups]
        live = [g for g in live if g is not None]
        if group in live:
            i = live.index(group)
            for prev in live[max(0, i - self.off.prefetch):i][::-1]:
                if not prev.started:
                    for w in prev.wrappers:
                        self.off.start_reload(w.handle, ahead=True)
                    prev.started = True


class _ForwardContext:
    def __init__(self, state: _SelectiveOffload, mode, marked: list, group: _Group, reset) -> None:
        self.state, self.mode, self.marked, self.group, self.reset = state, mode, marked, group, reset

    def __enter__(self):
        self.reset()
        return self.mode.__enter__()

    def __exit__(self, *exc):
        r = self.mode.__exit__(*exc)
        if exc[0] is None and self.marked:
            self.state.offload(self.mode.storage, self.marked, self.group)
        return r


class _RecomputeContext:
    def __init__(self, state: _SelectiveOffload, mode, group: _Group) -> None:
        self.state, self.mode, self.group = state, mode, group

    def __enter__(self):
        self.state.reload(self.group)
        return self.mode.__enter__()

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


_STATES: "weakref.WeakKeyDictionary[Offloader, _SelectiveOffload]" = weakref.WeakKeyDictionary()


def selective_offload_contexts(policy_fn, decisions=ALL, *, offloader: Offloader | None = None,
                               allow_cache_entry_mutation: bool = False):
    """``(forward_context, recompute_context)`` for a block under non-reentrant checkpointing:
    PyTorch's selective checkpointing with ``policy_fn`` (``(ctx, op, *args, **kwargs) ->
    CheckpointPolicy``), and the saved outputs that ``decisions`` marks (module docstring;
    ``k`` counts each op's calls in the block's forward, as SAC's cache does) moved to host
    memory as the block's forward ends. Outputs the policy does not save are not offloaded: the
    policy decides what crosses to the backward, ``decisions`` where it waits. Use it as a
    ``context_fn``::

        ctx = functools.partial(selective_offload_contexts, policy, {("aten.mm.default", 1)},
                                offloader=off)
        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=ctx)

    (:func:`offload_context_fn` builds that partial; :func:`wrap_sac_contexts` does the same to
    a pair of SAC contexts made elsewhere). Blocks sharing one ``offloader`` reload ahead: a
    block's recomputation starts the reloads of the ``offloader.prefetch`` blocks run before it.
    """
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return wrap_sac_contexts(create_selective_checkpoint_contexts(policy_fn, allow_cache_entry_mutation),
                             decisions, offloader=offloader)


def wrap_sac_contexts(contexts, decisions=ALL, *, offloader: Offloader | None = None):
    """The pair ``contexts`` that :func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`
    returned, made to offload the saved outputs ``decisions`` marks (see
    :func:`selective_offload_contexts`). For a planner that builds its own SAC contexts::

        context_fn = lambda: wrap_sac_contexts(create_selective_checkpoint_contexts(policy),
                                               plan_decisions, offloader=off)

    It reads the forward context's ``policy_fn`` and ``storage`` (SAC's cache: a dict of dicts
    by op and call index on torch 2.13, of lists of the saved calls on older versions); where
    they are missing the contexts are returned unchanged and nothing is offloaded."""
    from torch.utils.checkpoint import CheckpointPolicy

    caching, cached = contexts
    if not hasattr(caching, "policy_fn") or not hasattr(caching, "storage"):
        return contexts
    off = offloader or Offloader()
    state = _STATES.get(off)
    if state is None:
        state = _STATES[off] = _SelectiveOffload(off)
    decide = decider(decisions)
    all_calls: dict[Any, int] = defaultdict(int)
    saved_calls: dict[Any, int] = defaultdict(int)
    marked: list[tuple[Any, int, int]] = []
    saves = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
    policy_fn = caching.policy_fn

    def policy(ctx, func, *args, **kwargs):
        p = policy_fn(ctx, func, *args, **kwargs)
        if getattr(ctx, "is_recompute", False):  # older torch asks again while recomputing
            return p
        save = p if isinstance(p, bool) else p in saves
        k_all, k_saved = all_calls[func], saved_calls[func]
        all_calls[func] += 1
        if save:
            saved_calls[func] += 1
            if decide(func, k_all, getattr(ctx, "op_output", None)):
                marked.append((func, k_all, k_saved))
        return p

    caching.policy_fn = policy
    if getattr(cached, "policy_fn", None) is policy_fn:  # older torch's cached mode asks the policy too
        cached.policy_fn = policy

    def reset():
        all_calls.clear()
        saved_calls.clear()
        marked.clear()

    group = _Group()
    return (_ForwardContext(state, caching, marked, group, reset), _RecomputeContext(state, cached, group))


def offload_context_fn(policy_fn, decisions=ALL, *, offloader: Offloader | None = None):
    """A ``context_fn`` for :func:`torch.utils.checkpoint.checkpoint` (or transformers'
    ``activation_checkpointing_kwargs``): :func:`selective_offload_contexts` with these
    arguments."""
    off = offloader or Offloader()
    return functools.partial(selective_offload_contexts, policy_fn, decisions, offloader=off)


# -- offload or recompute ---------------------------------------------------------------------

def eager_link(device=None):
    """The link (:class:`remat.cost.transfer.Link`) an eager plan should price copies with: on a
    CUDA device the host link measured once per GPU and torch version
    (:func:`remat.capture.link.link_for_device`, kept in ``links.json``), asynchronous (copies on
    the side stream); on a CPU a synchronous memcpy at half the CPU profile's memory bandwidth
    (a copy reads and writes)."""
    from ..cost.transfer import COPY_LATENCY, Link, link_for_graph
    from ..graph.graph import Graph

    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    g = Graph([], name="eager-link")
    if device.type == "cuda":
        from ..capture.link import link_for_device
        g.meta["device"] = {"type": "cuda", "name": torch.cuda.get_device_name(device),
                            "link": link_for_device(device) or {}}
        link = link_for_graph(g)
        return link if link.latency else Link(link.bandwidth, True, COPY_LATENCY, link.source)
    g.meta["device"] = {"type": "cpu"}
    return link_for_graph(g)


@dataclass(frozen=True)
class Candidate:
    """A value the plan would recompute to meet its budget: ``key`` (an op-call key),
    ``nbytes`` and the seconds recomputing it costs in the backward."""

    key: Any
    nbytes: int
    recompute_seconds: float


def choose_offloads(candidates: Iterable[Candidate], link, overlap_seconds: float = 0.0) -> set:
    """The keys of the candidates to offload instead of recomputing, with copies over ``link``
    (:func:`eager_link`): each value costs two copies (out and back). On an asynchronous link
    (a GPU's side stream) the copies are free while they fit in ``overlap_seconds`` (the compute
    they run beside: the forward after the value, the backward before its read); the values
    whose recomputation is dearest per byte moved go first. On a synchronous link (a CPU) a
    value is offloaded when its two copies cost less than its recomputation.

    >>> from remat.cost.transfer import Link
    >>> c = [Candidate("a", 10**6, 1e-3), Candidate("b", 10**6, 1e-5)]
    >>> sorted(choose_offloads(c, Link(1e9, asynchronous=False)))   # 2 ms of copies each
    []
    >>> sorted(choose_offloads(c, Link(1e9, asynchronous=True), overlap_seconds=2.5e-3))
    ['a']
    """
    chosen: set = set()
    ordered = sorted(candidates, key=lambda c: c.recompute_seconds / max(c.nbytes, 1), reverse=True)
    if not getattr(link, "asynchronous", False):
        return {c.key for c in ordered if 2 * link.seconds(c.nbytes) < c.recompute_seconds}
    left = float(overlap_seconds)
    for c in ordered:
        cost = 2 * link.seconds(c.nbytes)
        if cost <= left:
            chosen.add(c.key)
            left -= cost
    return chosen
