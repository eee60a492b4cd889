"""Measure, on the device the graph runs on, the transient memory of ops whose buffers the
cost model cannot see.

A convolution or a fused attention allocates scratch while it runs: oneDNN reorders its operands to blocked
layouts and keeps per-thread partial weight gradients on a CPU, cuDNN takes a workspace on a
GPU. How much depends on the shape, the thread count and the library's choice of algorithm
(``benchmarks/conv_workspace.py``: from 1x to 8x the cost model's formula at small spatial
sizes), so no formula bounds it. At capture, :func:`measure_workspaces` runs each such op of
the joint graph once on random inputs of its shapes and records the transient (the peak
during the call less what the call leaves allocated) in the node's ``meta["workspace"]``,
which :meth:`remat.cost.model.CostModel.workspace` uses instead of its formula. Each shape is
measured once per process.

On a CPU the profiler's allocation records give the transient, on CUDA the allocator's peak
statistics. The operands take the layout the compiler will give them: inductor runs a graph's
convolutions on channels-last tensors when its layout optimization applies (always on a CPU
with oneDNN; the graph's inputs are copied, :func:`layout_copies`), and oneDNN's scratch
depends on it both ways: the ConvBN CNN's backward convolutions take far less channels-last
(no reorders), ResNet-18 tiny's narrow ones more (``tests/test_inductor_memory.py``). Inductor
decides the layout per graph, and a backward graph holds no convolution unless it recomputes
one: left to itself, it runs ``convolution_backward`` on whatever layouts its kernels leave,
and oneDNN reorders them (a MobileNetV2-like CNN's 4 MB depthwise input took 12.6 MB of
scratch, 4.6 KB channels-last). remat therefore compiles the backward of a plan of its own
channels-last whenever the forward is (:func:`remat.lower.backend._compile_graph`), so the
layout measured here is the one that runs. Nothing
is measured (the cost model's formula stands) when a profiler is already running (it cannot be
nested), for ops on other devices, or with ``REMAT_MEASURE_WORKSPACE=0``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterable

import torch
from torch import fx

from .joint import size_hint

_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_efficient_attention", "_flash_attention")
MEASURED_OPS = ("aten.convolution.default", "aten.convolution_backward.default") + tuple(
    f"aten.{op}{part}.default" for op in _ATTENTION for part in ("", "_backward", "_forward"))
"""The ops whose transient memory is measured (by ``str(node.target)``): library calls whatever
the compiler, whose scratch no formula bounds: convolutions, and fused attention, whose kernels
allocate buffers of their own (16.5 KB beside 384 KB of gradients in GPT-2 quick's CPU backward;
cuDNN's and flash attention's backward keep float32 accumulators)."""

EAGER_MEASURED_OPS = MEASURED_OPS + ("prims._low_memory_max_pool_with_offsets.default",
                                     "prims._low_memory_max_pool_offsets_to_indices.default")
"""With remat's eager compiler, also inductor's own prims, which inductor turns into kernels but
which run op by op through their reference implementation there: a max pool's unfolds (45 KB
around a 5 KB output on ResNet-18 tiny, where a byte budget was 4% over until measured)."""

_CACHE: dict[tuple, int] = {}


def _enabled() -> bool:
    return os.environ.get("REMAT_MEASURE_WORKSPACE", "1").lower() not in ("0", "off", "false", "no")


def _hint(x):
    """A symbolic size at its hint (no guard added); anything else as it is."""
    return size_hint(x) if isinstance(x, torch.SymInt) else x


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a channels-last tensor of ``shape`` (batch, channels, spatial...):
    channels innermost, then the spatial dimensions, then the batch."""
    order = [1, *range(len(shape) - 1, 1, -1), 0]  # innermost first
    strides = [0] * len(shape)
    step = 1
    for d in order:
        strides[d] = step
        step *= max(int(shape[d]), 1)
    return tuple(strides)


def inductor_channels_last(gm: fx.GraphModule | None) -> bool:
    """Whether inductor will run the convolutions of ``gm`` (a joint graph: its forward holds
    the convolutions) on channels-last operands: its own layout-optimization decision."""
    if gm is None:
        return False
    try:
        from torch._inductor.graph import GraphLowering

        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))
    except Exception:  # noqa: BLE001 - a private API: when it changes, operands stay as traced
        return False


def _spec(a, channels_last: bool = False):
    """What an argument is, hashable: a tensor's shape, strides, dtype and device, else itself;
    with ``channels_last``, 4-d and 5-d tensors take channels-last strides."""
    if isinstance(a, fx.Node):
        val = a.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape = tuple(_hint(s) for s in val.shape)
            stride = channels_last_strides(shape) if channels_last and len(shape) in (4, 5) \
                else tuple(_hint(s) for s in val.stride())
            return ("T", shape, stride, val.dtype, str(val.device))
        return ("V", _hint(val))
    if isinstance(a, (list, tuple)):
        return ("L", tuple(_spec(x, channels_last) for x in a))
    return _hint(a)


def _real(spec):
    """A random tensor for a ``("T", ...)`` spec; other specs as they are."""
    if isinstance(spec, tuple) and spec and spec[0] == "T":
        _, shape, stride, dtype, device = spec
        # filled through a flat storage: the strides may overlap (an expanded view, stride 0),
        # where writing in place through the view itself is refused
        size = 0 if 0 in shape else 1 + sum((n - 1) * abs(st) for n, st in zip(shape, stride))
        base = torch.empty(size, dtype=dtype, device=device)
        base = base.normal_() if dtype.is_floating_point else base.zero_()
        return base.as_strided(shape, stride)
    if isinstance(spec, tuple) and spec and spec[0] == "V":
        return spec[1]
    if isinstance(spec, tuple) and spec and spec[0] == "L":
        return [_real(x) for x in spec[1]]
    return spec


def _device(node: fx.Node) -> str | None:
    """The device of a node's (first tensor) output: a convolution's backward that computes no
    input gradient returns None first."""
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    return next((v.device.type for v in vals if isinstance(v, torch.Tensor)), None)


def _channels_last(val: torch.Tensor) -> bool:
    fmt = torch.channels_last if val.dim() == 4 else torch.channels_last_3d
    return bool(val.is_contiguous(memory_format=fmt))


def layout_copies(nodes: Iterable[fx.Node], channels_last: bool) -> dict[str, int]:
    """``{placeholder name: bytes}``: the graph inputs inductor copies to channels-last for a
    graph's convolutions when its layout optimization applies (``channels_last``:
    :func:`inductor_channels_last`). Inductor makes the copies when the forward starts and
    hands the backward the copies in place of the inputs, so each lives until the input's last
    reader (an image until its convolution's weight gradient, a weight until its input
    gradient) beside the original."""
    convs = [n for n in nodes if n.op == "call_function" and n.target is torch.ops.aten.convolution.default]
    if not channels_last:
        return {}
    out: dict[str, int] = {}
    for n in convs:
        for a in n.args[:2]:
            val = a.meta.get("val") if isinstance(a, fx.Node) else None
            if isinstance(a, fx.Node) and a.op == "placeholder" and isinstance(val, torch.Tensor) \
                    and val.dim() in (4, 5) and not _channels_last(val):
                out[a.name] = int(_hint(val.numel())) * val.element_size()
    return out


def measure_workspaces(nodes: Iterable[fx.Node], compiler: str = "inductor",
                       channels_last: bool = False) -> dict[str, int]:
    """``{node name: transient bytes}`` for the nodes among ``nodes`` that run an op of
    :data:`MEASURED_OPS` (:data:`EAGER_MEASURED_OPS` when ``compiler="eager"``) on a CPU or
    CUDA device (see the module docstring); convolutions on channels-last operands when
    ``channels_last`` (:func:`inductor_channels_last`)."""
    ops = EAGER_MEASURED_OPS if compiler == "eager" else MEASURED_OPS
    todo = [n for n in nodes if n.op == "call_function" and str(n.target) in ops
            and _device(n) in ("cpu", "cuda")]
    if not todo or not _enabled() or torch.autograd.profiler._is_profiler_enabled:
        return {}
    keys = {n.name: (n.target, _spec(list(n.args), channels_last and "convolution" in str(n.target))[1],
                     tuple((k, _spec(v)) for k, v in n.kwargs.items()))
            for n in todo}
    missing = {k: n for n in todo if (k := keys[n.name]) not in _CACHE}
    if missing:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily(), torch.no_grad():
            _measure(missing)
    return {n.name: _CACHE[keys[n.name]] for n in todo if keys[n.name] in _CACHE}


def _measure(missing: dict[tuple, fx.Node]) -> None:
    cpu = [k for k, n in missing.items() if _device(n) == "cpu"]
    cuda = [k for k, n in missing.items() if _device(n) == "cuda"]
    if cpu:
        _measure_cpu(cpu)
    for key in cuda:
        _CACHE[key] = _measure_cuda(key)


def _inputs(key):
    target, args, kwargs = key
    return target, [_real(a) for a in args], {k: _real(v) for k, v in kwargs}


def _measure_cpu(keys: list[tuple]) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    ranges = []
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i, key in enumerate(keys):
            target, args, kwargs = _inputs(key)
            target(*args, **kwargs)  # once before: the library's first call allocates caches
            with record_function(f"remat_workspace_{i}"):
                out = target(*args, **kwargs)  # kept until the range ends: not transient
            del out, args, kwargs
            ranges.append(f"remat_workspace_{i}")
    events = list(prof.profiler.kineto_results.events())
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in ranges}
    memory = sorted((e.start_ns(), int(e.nbytes())) for e in events if e.name() == "[memory]")
    for name, key in zip(ranges, keys):
        if name not in spans:
            continue
        start, end = spans[name]
        total = peak = 0
        for t, b in memory:
            if start <= t <= end:
                total += b
                peak = max(peak, total)
        _CACHE[key] = max(0, peak - total)


def _measure_cuda(key: tuple) -> int:
    target, args, kwargs = _inputs(key)
    target(*args, **kwargs)  # once before: cuDNN's benchmark and handles allocate once
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = target(*args, **kwargs)
    torch.cuda.synchronize()
    transient = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    del out
    return max(0, int(transient))


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 (kineto prints a line at every profiler start and stop);
    Python exceptions still propagate. ``REMAT_BENCH_VERBOSE=1`` keeps it."""
    if os.environ.get("REMAT_BENCH_VERBOSE") == "1":
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
