"""Capture one block's forward as the ATen op calls that SAC's policy sees.

:func:`capture_block` runs the block's forward once more, eagerly, under a
``TorchDispatchMode`` that records every op call the way
``torch.utils.checkpoint``'s selective checkpointing numbers them: ops in ``SAC_IGNORED_OPS``
are skipped, and each call is keyed by ``(func, index of this call among the calls of func)``
(SAC's storage key). At the same time ``saved_tensors_hooks`` record which storages autograd
saves for the backward: what eager (no checkpointing) holds from this block until its backward.

The extra forward leaves no trace: the random generators are forked (the real forward draws
the same dropout masks as without remat), buffers changed in place (BatchNorm's running
statistics) are restored, and its outputs are dropped. It runs under the caller's autocast
and grad state, so the ops are the ones the real call runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import SAC_IGNORED_OPS
from torch.utils.flop_counter import flop_registry

_COMPUTE = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm,
            torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.linear,
            torch.ops.aten.matmul, torch.ops.aten.einsum,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu,
            torch.ops.aten._scaled_dot_product_efficient_attention,
            torch.ops.aten._scaled_dot_product_flash_attention,
            torch.ops.aten._scaled_dot_product_cudnn_attention}
_REDUCTIONS = {torch.ops.aten.sum, torch.ops.aten.mean, torch.ops.aten.amax, torch.ops.aten.var,
               torch.ops.aten.var_mean, torch.ops.aten._softmax, torch.ops.aten._log_softmax,
               torch.ops.aten.native_layer_norm, torch.ops.aten.native_batch_norm,
               torch.ops.aten._native_batch_norm_legit, torch.ops.aten._native_batch_norm_legit_functional,
               torch.ops.aten.linalg_vector_norm, torch.ops.aten.logsumexp}
_DATA_DEPENDENT = {torch.ops.aten._local_scalar_dense, torch.ops.aten.is_nonzero, torch.ops.aten.item,
                   torch.ops.aten.equal}
"""Ops whose result reaches Python (``if x.sum() > 0``, ``x.item()``): the block's op sequence may
depend on its data, so decisions keyed by call index would not fit another call."""


_CACHES = ("past_key_values", "past_key_value", "layer_past", "cache")


def storage_key(t: torch.Tensor):
    """The identity of a tensor's storage (views share it)."""
    try:
        return (t.device.type, t.device.index, t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return ("id", id(t))


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return int(t.numel() * t.element_size())


@dataclass
class OpCall:
    """One op call of a block's forward, as SAC's policy sees it."""

    func: object  # the OpOverload
    name: str  # "aten.mm.default"
    index: int  # this call's index among the calls of ``func`` in the block
    inputs: tuple  # producers of the tensor arguments: ("op", i) / ("input", k) / ("const", key)
    bytes: int  # bytes of the fresh storage it allocates (0 for views, in-place ops)
    out_bytes: int  # bytes of its outputs as tensors (a view's too)
    out_shapes: tuple
    dtype: str | None
    flops: float
    category: str  # compute, pointwise, reduction, view, random, other
    fresh: bool  # its outputs are new storages (not views of, or writes into, another)
    mutates: bool  # writes into one of its arguments
    needed: bool = False  # autograd saves (a view of) its output for the backward
    mutated_later: bool = False  # a later op writes into its output
    side_effect: bool = False  # writes into state outside the block's values (a buffer, an input):
    # a replay writes it again (remat restores the block's buffers around its replay)


@dataclass
class BlockCapture:
    """The op calls of one block call and what eager holds of them."""

    ops: list[OpCall]
    input_bytes: int  # bytes of the block's inputs that need grad (its own activations)
    eager_bytes: int  # bytes autograd holds from this block until its backward, without checkpointing
    output_bytes: int
    supported: bool = True
    reason: str = ""
    device: str = "cpu"
    autocast: tuple = ()
    replayed: int = -1  # op calls a recomputation runs before it has every saved value (early stop)
    meta: dict = field(default_factory=dict)


def _flops(func, args, kwargs, out) -> float:
    packet = func.overloadpacket
    if packet in flop_registry:
        try:
            return float(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:
            return 0.0
    return 0.0


_ATTENTION = ("_scaled_dot_product",)


def _draws_random(func, args, kwargs) -> bool:
    """Whether a call draws random numbers: ops tagged ``nondeterministic_seeded``, except an
    attention whose ``dropout_p`` is 0."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    if str(func.overloadpacket.__name__).startswith(_ATTENTION):
        for k, sa in enumerate(func._schema.arguments):
            if sa.name == "dropout_p":
                p = args[k] if k < len(args) else kwargs.get("dropout_p", 0.0)
                return bool(p)
    return True


def _attention_flops(func, args, out) -> float:
    """4 * B * H * L * S * D for an attention op the flop counter does not know."""
    if not str(func.overloadpacket.__name__).startswith(_ATTENTION) or len(args) < 3:
        return 0.0
    q, k = args[0], args[1]
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dim() < 3:
        return 0.0
    return 4.0 * q.numel() * k.shape[-2]


def _category(func, fresh: bool, mutates: bool, random: bool = False) -> str:
    if random:
        return "random"
    if str(func.overloadpacket.__name__).startswith(_ATTENTION):
        return "compute"
    packet = func.overloadpacket
    if packet in _COMPUTE or (packet in flop_registry and packet not in _REDUCTIONS):
        return "compute"
    if func.is_view or (not fresh and not mutates):
        return "view"
    if packet in _REDUCTIONS:
        return "reduction"
    if torch.Tag.pointwise in getattr(func, "tags", ()):
        return "pointwise"
    return "other"


_UNDECLARED_STATE = {torch.ops.aten.native_batch_norm, torch.ops.aten.cudnn_batch_norm,
                     torch.ops.aten.miopen_batch_norm}
"""Ops that write into arguments (running statistics) without saying so in their schema."""


def _written(func, args, kwargs):
    """(schema argument, tensor) for each argument ``func`` writes into."""
    out = []
    for k, sa in enumerate(func._schema.arguments):
        a = args[k] if k < len(args) else kwargs.get(sa.name)
        if isinstance(a, torch.Tensor) and sa.alias_info is not None and sa.alias_info.is_write:
            out.append((sa, a))
    return out


class _Recorder(TorchDispatchMode):
    def __init__(self, known: dict) -> None:
        super().__init__()
        self.known = known  # storage key -> ("input", k) | ("const", key) | ("op", i)
        self.ops: list[OpCall] = []
        self.counts: dict = {}
        self.keep: list = []  # outputs stay alive so that no storage address is reused
        self.data_dependent: str | None = None
        self.written: set = set()  # storages outside the block's values that ops write into

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if func.overloadpacket in _DATA_DEPENDENT and self.data_dependent is None:
            self.data_dependent = str(func)
        index = self.counts.get(func, 0)
        self.counts[func] = index + 1
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        ins = []
        for a in flat_in:
            k = storage_key(a)
            src = self.known.get(k)
            if src is None:
                src = self.known[k] = ("const", k)
            ins.append(src)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        mutates = bool(getattr(func._schema, "is_mutable", False))
        in_keys = {storage_key(a) for a in flat_in}
        fresh, nbytes = bool(outs), 0
        for o in outs:
            k = storage_key(o)
            if k in self.known or k in in_keys:
                fresh = False
            else:
                nbytes += storage_bytes(o)
        i = len(self.ops)
        side_effect = False
        if mutates:
            for sa, a in _written(func, args, kwargs):
                src = self.known.get(storage_key(a))
                if src is not None and src[0] == "op":
                    self.ops[src[1]].mutated_later = True
                else:  # writes into a buffer or an input (BatchNorm's running statistics)
                    side_effect = True
                    self.written.add(storage_key(a))
            # SAC can cache only fresh outputs: an in-place op's output is the tensor it wrote, whose
            # version changes after the cache took it (x.add_(1) stays recomputed)
            side_effect = side_effect and bool(outs) and not any(storage_key(o) in in_keys for o in outs)
        elif func.overloadpacket in _UNDECLARED_STATE and len(args) > 5 and args[5] is True and \
                any(isinstance(a, torch.Tensor) for a in args[3:5]):
            side_effect = True  # batch norm in training updates running statistics its schema does not declare
            self.written.update(storage_key(a) for a in args[3:5] if isinstance(a, torch.Tensor))
        for o in outs:
            self.known.setdefault(storage_key(o), ("op", i))
        self.keep.append(out)
        fresh = fresh and not mutates and not func.is_view
        shapes = tuple(tuple(o.shape) for o in outs)
        dtype = str(outs[0].dtype).replace("torch.", "") if outs else None
        flops = _flops(func, args, kwargs, out) or _attention_flops(func, args, out)
        category = _category(func, fresh, mutates, _draws_random(func, args, kwargs))
        logical = sum(o.numel() * o.element_size() for o in outs)
        self.ops.append(OpCall(func, str(func), index, tuple(ins), nbytes if fresh else 0, logical,
                               shapes, dtype, flops, category, fresh, mutates, side_effect=side_effect))
        return out


def _autocast_state() -> tuple:
    out = []
    for dev in ("cpu", "cuda"):
        try:
            on = torch.is_autocast_enabled(dev)
        except TypeError:  # pragma: no cover - old torch
            on = False
        if on:
            out.append((dev, str(torch.get_autocast_dtype(dev))))
    return tuple(out)


@contextlib.contextmanager
def _submodule_hooks_off(module):
    """The forward hooks of ``module``'s submodules off while the capture runs it: the capture is
    not a step, and a hook that records outputs (transformers' recorder of an MoE's router
    logits, which its load-balancing loss reads) would count the capture's as the step's."""
    saved = []
    if isinstance(module, torch.nn.Module):
        for m in module.modules():
            if m is module or not (m._forward_hooks or m._forward_pre_hooks):
                continue
            saved.append((m, m._forward_hooks, m._forward_pre_hooks))
            m._forward_hooks, m._forward_pre_hooks = type(m._forward_hooks)(), type(m._forward_pre_hooks)()
    try:
        yield
    finally:
        for m, hooks, pre in saved:
            m._forward_hooks, m._forward_pre_hooks = hooks, pre


@contextlib.contextmanager
def _autocast_cache_off():
    was = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(was)


def capture_block(forward, args: tuple, kwargs: dict, module: torch.nn.Module) -> BlockCapture:
    """Run ``forward(*args, **kwargs)`` (the block's own forward, without its hooks or wrappers)
    once under the recorder and return its op calls. Never raises for the block's own errors:
    a failed capture is returned with ``supported=False`` and the reason."""
    # a KV cache would be written a second time: drop it, as transformers does under checkpointing
    kwargs = {k: (None if k in _CACHES else v) for k, v in kwargs.items()}
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    flat = tree_flatten((args, kwargs))[0]
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    known: dict = {}
    for p in list(module.parameters()) + list(module.buffers()):
        known[storage_key(p)] = ("const", "param")
    input_keys, input_bytes = set(), 0
    for k, t in enumerate(tensors):
        key = storage_key(t)
        known.setdefault(key, ("input", k))
        if t.requires_grad and key not in input_keys and known[key][0] == "input":
            input_keys.add(key)
            input_bytes += storage_bytes(t)
    # detached leaves on the same storages: the capture's graph hangs off nothing of the caller's
    def leaf(a):
        if isinstance(a, torch.Tensor):
            return a.detach().requires_grad_(a.requires_grad and a.is_floating_point())
        return a
    from torch.utils._pytree import tree_map
    args_c, kwargs_c = tree_map(leaf, (tuple(args), dict(kwargs)))
    devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    packed: dict = {}

    replayed = [0]

    def pack(t):
        if isinstance(t, torch.Tensor):
            packed[storage_key(t)] = storage_bytes(t)
            replayed[0] = len(recorder.ops)
        return t

    recorder = _Recorder(known)
    device = tensors[0].device.type if tensors else "cpu"
    out = None
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_disable_current_modes())
            stack.enter_context(torch.random.fork_rng(devices=devices, device_type="cuda" if devices else "cpu"))
            stack.enter_context(torch.enable_grad())
            # autocast caches a weight's cast while it is on: the capture must not fill that cache,
            # or the real forward would find the casts made and run fewer ops than its replay
            stack.enter_context(_autocast_cache_off())
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
            stack.enter_context(recorder)
            stack.enter_context(_submodule_hooks_off(module))
            out = forward(*args_c, **kwargs_c)
    except Exception as e:  # the block cannot be captured: run it unwrapped
        return BlockCapture([], input_bytes, 0, 0, supported=False,
                            reason=f"capture failed: {type(e).__name__}: {e}"[:300], device=device)
    finally:
        with torch.no_grad():
            for n, b in module.named_buffers():
                if n in buffers and b.shape == buffers[n].shape:
                    b.copy_(buffers[n])
    ops = recorder.ops
    eager = 0
    for key, nbytes in packed.items():
        src = known.get(key)
        if src is None or src[0] == "const":
            continue  # parameters, buffers, shared inputs (masks, position embeddings)
        if src[0] == "input" and key not in input_keys:
            continue
        eager += nbytes
        if src[0] == "op":
            ops[src[1]].needed = True
    out_bytes = sum(storage_bytes(o) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor))
    cap = BlockCapture(ops, input_bytes, eager, out_bytes, device=device, autocast=_autocast_state(),
                       replayed=replayed[0])
    cap.meta["written_buffers"] = [n for n, b in module.named_buffers() if storage_key(b) in recorder.written]
    if recorder.data_dependent:
        cap.supported = False
        cap.reason = (f"data-dependent control flow: {recorder.data_dependent} passes a tensor's value "
                      "to Python, so the op sequence may change between calls")
    elif not ops:
        cap.supported = False
        cap.reason = "the block runs no ATen op"
    return cap
