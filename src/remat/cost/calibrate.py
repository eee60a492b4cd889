"""Calibrate the cost model: measure this machine's per-op fixed cost, matmul and convolution
FLOP/s at several sizes (the efficiency curves), and memory bandwidth, and return them as a
:class:`~remat.cost.model.DeviceProfile`.

The profiles in :data:`remat.cost.model.PROFILES` are settings; the simulator's time
predictions are only as good as the numbers behind them, so benchmarks use measured ones.
Each function measures once per process (a few seconds) and caches the result. What is
measured, in order:

- the fixed cost of one op (``op_seconds``, also ``launch_seconds``): a 16-element ATen
  ``add`` in a loop, as remat's eager compiler calls ops; a view's (``view_seconds``);
- the matmul curve: n x n times n x n for n in :data:`MATMUL_SIZES`, each point the FLOP/s
  of the time above an op's fixed cost; ``peak_flops`` is the largest's;
- the convolution curve: 3x3 convolutions of :data:`CONV_SHAPES`;
- bandwidth: a large copy (reads and writes every byte).

On a GPU, :func:`cuda_profile` measures the same with CUDA events (the fixed cost is then
the launch and the dispatch of a kernel, about 5 us; a small matmul's rate is far below the
tensor cores' peak until about 2048^3). Use it as ``remat.cost.CostModel(cuda_profile())``
where predicted times matter; the datasheet defaults of :data:`remat.cost.model.GPU_PROFILES`
carry the same fields with curves derived from the datasheet (see there).

torch is imported when a device is measured, not before: the cost model stays torch-free.

>>> from remat.cost.calibrate import cpu_profile
>>> p = cpu_profile()
>>> p.peak_flops > 1e8 and p.bandwidth > 1e8
True
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import time
from pathlib import Path

from . import probes
from .model import PROFILES, DeviceProfile


def _best(fn, repeats: int, warmup: int = 2, timer=None) -> float:
    """Minimum seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    timer = timer or _perf_counter_time
    return min(timer(fn) for _ in range(repeats))


def _perf_counter_time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cuda_time(fn) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


MATMUL_SIZES = {"cpu": (16, 32, 64, 128, 256, 512, 1024), "cuda": (64, 128, 256, 512, 1024, 2048, 4096)}
"""The square matmuls (n x n times n x n) whose FLOP/s make the efficiency curve."""

CONV_SHAPES = {"cpu": ((1, 8, 8), (1, 16, 16), (2, 32, 16), (4, 64, 16), (8, 64, 32)),
               "cuda": ((1, 16, 16), (4, 32, 32), (8, 64, 32), (16, 128, 32), (32, 256, 32))}
"""(batch, channels, image side) of the 3x3 convolutions (channels in = out, padding 1) whose
FLOP/s make the convolution's curve."""

TIMED_SECONDS = {"cpu": 2e-3, "cuda": 2e-4}
"""Each timing loops a call until it takes about this long, so small calls are timed in bulk."""


def _per_call(fn, timer, target: float, repeats: int = 3) -> float:
    """Seconds of one ``fn()``: the least over ``repeats`` timings of a loop of calls long enough
    to take about ``target`` seconds."""
    one = _best(fn, repeats=1, warmup=1, timer=timer)
    reps = max(1, min(2000, int(target / max(one, 1e-7))))

    def loop():
        for _ in range(reps):
            fn()

    return _best(loop, repeats=repeats, warmup=0, timer=timer) / reps


def _fixed_seconds(device: str, timer, target: float) -> tuple[float, float]:
    """(an op's, a view's) fixed seconds: a tiny ATen add, a tiny ATen view, called as the
    generated code of remat's eager compiler calls them (``torch.ops.aten``)."""
    import torch

    aten = torch.ops.aten
    x = torch.ones(16, device=device)
    op = _per_call(lambda: aten.add.Tensor(x, x), timer, target, repeats=5)
    view = _per_call(lambda: aten.view.default(x, [4, 4]), timer, target, repeats=5)
    return op, view


def _curve(calls, timer, target: float, fixed: float) -> tuple[tuple[float, float], ...]:
    """``((flops, FLOP/s), ...)`` of ``calls`` (``(flops, fn)`` ascending): the rate of each
    call's time above the fixed cost of an op (at least a tenth of its time), made
    non-decreasing in size (a larger call is never priced at a lower rate: timing noise)."""
    points = []
    for flops, fn in calls:
        t = _per_call(fn, timer, target)
        points.append((float(flops), flops / max(t - fixed, 0.1 * t)))
    out, best = [], 0.0
    for flops, rate in points:
        best = max(best, rate)
        out.append((flops, best))
    return tuple(out)


def _measure(device: str, n_matmul: int, copy_bytes: int, dtype=None) -> DeviceProfile:
    """The profile of ``device``, measured on random operands drawn from a forked generator:
    a training step that calibrates on its first call draws the same dropout masks as one
    that does not."""
    import torch

    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        return _measured(device, n_matmul, copy_bytes, dtype)


def _measured(device: str, n_matmul: int, copy_bytes: int, dtype=None) -> DeviceProfile:
    import torch

    dtype = dtype or torch.float32
    kind = "cuda" if device.startswith("cuda") else "cpu"
    timer = _cuda_time if kind == "cuda" else _perf_counter_time
    target = TIMED_SECONDS[kind]
    op, view = _fixed_seconds(device, timer, target)

    def mm(n):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        return 2.0 * n ** 3, lambda: torch.ops.aten.mm.default(a, b)

    sizes = [n for n in MATMUL_SIZES[kind] if n <= n_matmul]
    matmul = _curve([mm(n) for n in sizes], timer, target, op)

    def conv(batch, c, side):
        x = torch.randn(batch, c, side, side, device=device, dtype=dtype)
        w = torch.randn(c, c, 3, 3, device=device, dtype=dtype)
        return 2.0 * batch * c * c * 9 * side * side, lambda: torch.ops.aten.convolution.default(
            x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    convs = _curve([conv(*shape) for shape in CONV_SHAPES[kind]], timer, target, op)
    element = _element_seconds(device, timer, target, op)
    src = torch.empty(copy_bytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best(lambda: dst.copy_(src), repeats=7, timer=timer)
    bandwidth = 2.0 * src.nbytes / t  # a copy reads and writes every byte
    src = dst = None
    moved = _moved_curve(device, timer, target, op, copy_bytes, bandwidth)
    name = "cpu" if device == "cpu" else torch.cuda.get_device_name(torch.device(device))
    # the transient memory of a CPU convolution is the cpu profile's (benchmarks/conv_workspace.py)
    work = PROFILES["cpu"].conv_workspace if device == "cpu" else 0.0
    # one kernel of a fusing compiler: on a GPU a launch, about a tiny op's time; on a CPU the
    # call of a generated kernel or a library call, priced as a tiny ATen op too
    return DeviceProfile(f"{name} (measured)", matmul[-1][1], bandwidth, op, conv_workspace=work,
                         op_seconds=op, view_seconds=view, matmul_curve=matmul, conv_curve=convs,
                         bandwidth_curve=moved, element_seconds=element)


ELEMENT_OPS = ("mul", "exp", "erf", "tanh")
"""The pointwise ops whose mean time per element, on operands in cache, is ``element_seconds``
(a multiply is 20x cheaper than an ``erf`` here: a mix)."""


def _element_seconds(device: str, timer, target: float, fixed: float, numel: int = 1 << 16) -> float:
    """Mean seconds per element of :data:`ELEMENT_OPS` on ``numel`` cache-resident elements
    (written into a preallocated output), above an op's fixed cost."""
    import torch

    x, y, out = (torch.randn(numel, device=device) for _ in range(3))
    calls = {"mul": lambda: torch.mul(x, y, out=out), "exp": lambda: torch.exp(x, out=out),
             "erf": lambda: torch.erf(x, out=out), "tanh": lambda: torch.tanh(x, out=out)}
    per = [max(_per_call(calls[k], timer, target) - fixed, 0.0) / numel for k in ELEMENT_OPS]
    return sum(per) / len(per)


COPY_SIZES = (1 << 16, 1 << 19, 1 << 22, 1 << 24, 1 << 26)
COLD_BYTES = 1 << 26  # the pool the operands of each size are taken from
"""Bytes of each operand of the ATen ``mul`` calls whose rates make the bandwidth curve."""


def _moved_curve(device: str, timer, target: float, fixed: float, large: int, bandwidth: float):
    """``((bytes moved, bytes/s), ...)``: out-of-place ``mul`` of two tensors of each of
    :data:`COPY_SIZES` bytes up to ``large`` (it reads two and writes one, its output
    allocated: an op-by-op pointwise kernel), each rate of its time above an op's fixed cost;
    made non-increasing in size (data that fits a cache moves faster, never slower)."""
    import torch

    points = []
    for size in COPY_SIZES:
        if size > large:
            break
        # operands taken in turn from a pool larger than the caches: in a step, an op's
        # inputs were mostly written several ops before it (a hot loop on two tensors would
        # price every small op at the first cache's rate)
        pool = [torch.ones(size // 4, device=device) for _ in range(max(2, COLD_BYTES // size))]
        turn = iter(range(1 << 62))

        def mul(pool=pool, turn=turn):
            k = next(turn) % (len(pool) - 1)
            torch.ops.aten.mul.Tensor(pool[k], pool[k + 1])

        t = _per_call(mul, timer, target)
        points.append((3.0 * size, 3.0 * size / max(t - fixed, 0.1 * t)))
        pool = mul = None
    if not points:
        return ()
    out, best = [], 0.0
    for nbytes, rate in reversed(points):  # each point at least the rate of every larger one
        best = max(best, rate)
        out.append((nbytes, best))
    return tuple(reversed(out))


_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _torch_dtype(dtype: str | None):
    import torch

    return None if dtype is None else getattr(torch, _DTYPES.get(dtype, dtype))


@functools.cache
def cpu_profile(dtype: str | None = None) -> DeviceProfile:
    """This CPU's per-op fixed cost, matmul curve (16^3 to 1024^3 in ``dtype``: ``"bf16"``,
    ``"fp16"``, ``"fp32"``, default float32; ``peak_flops`` the largest's), convolution curve,
    pointwise transfer curve and copy bandwidth (64 MiB copy), at torch's current thread count
    (about 3 s). Measured once per CPU, thread count, dtype and torch version: stored on disk
    (:mod:`remat.cost.probes`) and cached per process."""
    return _stored_profile("cpu", dtype, lambda: _measure("cpu", 1024, 64 << 20, _torch_dtype(dtype)))


@functools.cache
def cuda_profile(device: str = "cuda", dtype: str | None = None) -> DeviceProfile:
    """The GPU's per-kernel launch time, matmul curve (64^3 to 4096^3 in ``dtype``, default
    float32 at torch's current matmul precision), convolution curve, transfer curve, copy
    bandwidth (512 MiB copy) and memory, timed with CUDA events. Measured once per GPU model,
    dtype, matmul precision and torch version (stored on disk: :mod:`remat.cost.probes`);
    cached per process and device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_profile() needs a CUDA GPU; use cpu_profile() on this machine")

    def measure() -> DeviceProfile:
        with torch.cuda.device(torch.device(device)):
            p = _measure(device, 4096, 512 << 20, _torch_dtype(dtype))
        return dataclasses.replace(p, memory=int(torch.cuda.get_device_properties(torch.device(device)).total_memory))

    return _stored_profile(device, dtype, measure)


def profile_for(device, dtype: str | None = None) -> DeviceProfile:
    """The measured profile of ``device`` ("cpu", "cuda", "cuda:1", ...), its matmuls timed in
    ``dtype`` (``"bf16"``, ``"fp16"``, ``"fp32"``; default float32)."""
    device = str(device)
    if device.startswith("cuda"):
        return cuda_profile(device) if dtype is None else cuda_profile(device, dtype)
    if device == "cpu":
        return cpu_profile() if dtype is None else cpu_profile(dtype)
    raise ValueError(f"cannot calibrate device {device!r}; use 'cpu' or 'cuda'")


@functools.cache
def sac_overhead() -> float:
    """Seconds selective checkpointing adds per op call over plain checkpointing on this machine
    (its dispatch modes run Python for every op in the forward and in the replay), on a chain
    of 100 small ops. Measured once per CPU, thread count and torch version (stored on disk:
    :mod:`remat.cost.probes`); cached per process."""
    def decode(v) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise ValueError(f"{v!r} is not a number of seconds per op")
        return float(v)

    return probes.stored("sac", identity("cpu", None), _measure_sac, float, decode)


def _measure_sac() -> float:
    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )

    x = torch.ones(8, 8, requires_grad=True)  # no random draw: the step's masks stay

    def chain(t):
        for _ in range(100):
            t = t * 1.0001
        return t

    def recompute_all(ctx, func, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    def run(sac: bool) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            kw = {"context_fn": lambda: create_selective_checkpoint_contexts(recompute_all)} if sac else {}
            torch.utils.checkpoint.checkpoint(chain, x, use_reentrant=False, **kw).sum().backward()
            best = min(best, time.perf_counter() - t0)
        return best / 100

    with torch.random.fork_rng(devices=[]):
        run(False), run(True)
        return max(run(True) - run(False), 0.0)


def _stored_profile(device: str, dtype: str | None, measure) -> DeviceProfile:
    from .profile_json import profile_entry, profile_from_entry

    ident = identity(device, dtype)
    return probes.stored("profile", ident, measure,
                         lambda p: profile_entry(p, device=ident["device"], torch_version=ident["torch"]),
                         lambda v: profile_from_entry(v, "a stored device measurement"))


def identity(device: str, dtype: str | None) -> dict:
    """What a measurement on ``device`` depends on (:mod:`remat.cost.probes` keys on it): the
    device (a CPU's model, cores and torch's threads; a GPU's name, compute capability, memory,
    CUDA version and float32 matmul precision), torch's version, the dtype and this module's
    code."""
    import torch

    out = {"torch": torch.__version__, "dtype": dtype or "fp32", "code": _code_hash()}
    if str(device).startswith("cuda"):
        d = torch.device(device)
        props = torch.cuda.get_device_properties(d)
        out.update(device=torch.cuda.get_device_name(d), capability=list(torch.cuda.get_device_capability(d)),
                   memory=int(props.total_memory), cuda=torch.version.cuda,
                   matmul_precision=torch.get_float32_matmul_precision(),
                   tf32=bool(torch.backends.cuda.matmul.allow_tf32))
    else:
        out.update(device="cpu", cpu=_cpu_model(), cores=os.cpu_count(), threads=torch.get_num_threads())
    return out


@functools.cache
def _code_hash() -> str:
    """A hash of this module's source: changed probing code never reads an old measurement."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
