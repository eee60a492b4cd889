"""Calibrate the cost model: measure this machine's matmul FLOP/s, memory bandwidth and
per-op overhead, and return them as a :class:`~remat.cost.model.DeviceProfile`.

The datasheet profiles in :data:`remat.cost.model.PROFILES` are settings; the simulator's
time predictions are only as good as the numbers behind them, so benchmarks use measured
ones. Each function measures once per process (a second or two) and caches the result.

torch is imported when a device is measured, not before: the cost model stays torch-free.

>>> from remat.cost.calibrate import cpu_profile
>>> p = cpu_profile()
>>> p.peak_flops > 1e8 and p.bandwidth > 1e8
True
"""

from __future__ import annotations

import functools
import time

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


def _measure(device: str, n_matmul: int, copy_bytes: int, dtype=None) -> DeviceProfile:
    import torch

    dtype = dtype or torch.float32
    timer = _cuda_time if device.startswith("cuda") else _perf_counter_time
    a = torch.randn(n_matmul, n_matmul, device=device, dtype=dtype)
    b = torch.randn(n_matmul, n_matmul, device=device, dtype=dtype)
    t = _best(lambda: torch.mm(a, b), repeats=5, timer=timer)
    flops = 2.0 * n_matmul ** 3 / t
    a = b = None  # free them before the copy
    src = torch.empty(copy_bytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best(lambda: dst.copy_(src), repeats=7, timer=timer)
    bandwidth = 2.0 * src.nbytes / t  # a copy reads and writes every byte
    src = dst = None
    # fixed cost of one small op: what a tiny kernel costs whatever its size
    x = torch.ones(16, device=device)
    reps = 200

    def tiny():
        for _ in range(reps):
            torch.add(x, x)

    launch = _best(tiny, repeats=5, timer=timer) / reps
    name = "cpu" if device == "cpu" else torch.cuda.get_device_name(torch.device(device))
    # the transient memory of a CPU convolution is the cpu profile's (benchmarks/conv_workspace.py)
    work = PROFILES["cpu"].conv_workspace if device == "cpu" else 0.0
    return DeviceProfile(f"{name} (measured)", flops, bandwidth, launch, conv_workspace=work)


@functools.cache
def cpu_profile() -> DeviceProfile:
    """This CPU's fp32 matmul FLOP/s (1024x1024 matmul), copy bandwidth (64 MiB copy) and
    per-op overhead, at torch's current thread count. Cached per process."""
    return _measure("cpu", 1024, 64 << 20)


@functools.cache
def cuda_profile(device: str = "cuda") -> DeviceProfile:
    """The GPU's matmul FLOP/s (4096x4096 in fp32 at torch's current matmul precision),
    copy bandwidth (512 MiB copy) and per-kernel launch time, timed with CUDA events.
    Cached per process and device."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_profile() needs a CUDA GPU; use cpu_profile() on this machine")
    with torch.cuda.device(torch.device(device)):
        return _measure(device, 4096, 512 << 20)


def profile_for(device) -> DeviceProfile:
    """The measured profile of ``device`` ("cpu", "cuda", "cuda:1", ...)."""
    device = str(device)
    if device.startswith("cuda"):
        return cuda_profile(device)
    if device == "cpu":
        return cpu_profile()
    raise ValueError(f"cannot calibrate device {device!r}; use 'cpu' or 'cuda'")
