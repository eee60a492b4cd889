"""Measurements of one training step, the same way for every method, on CPU or CUDA.

- :func:`saved_activation_bytes`: what autograd really keeps for the backward
  (``saved_tensors_hooks``; sees eager autograd, checkpointing and compiled graphs alike).
- :func:`peak_memory`: peak bytes of a step above what was resident before it. CUDA: the
  caching allocator's statistics. CPU: the profiler's allocation records
  (``profile_memory=True``), summed in time order; this also gives the memory timeline.
- :func:`step_time`: median seconds per step, methods alternating in one loop.
- :func:`max_batch_size`: the largest batch that runs (GPU: until out of memory; CPU or
  any device given a budget: until the measured peak exceeds the budget).
- :func:`predicted`: the simulator's peak memory and time for a compiled method's plans.

A *step* is a callable that runs one whole training step (zero the gradients, forward,
loss, backward) and returns the loss, as :func:`remat.bench.methods.prepare` builds them.

>>> import torch
>>> x = torch.randn(1024, requires_grad=True)
>>> def step():
...     x.grad = None
...     x.cos().cos().sum().backward()
>>> peak_memory(step).peak_bytes >= 4096
True
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..capture.workspace import quiet_stderr as _quiet_stderr
from ..cost.model import CostModel, storage
from ..plans.simulator import simulate

Step = Callable[[], Any]


# -- saved activations ----------------------------------------------------------------------

@dataclass(frozen=True)
class SavedBytes:
    activation_bytes: int  # distinct storages saved for the backward, inputs and params excluded
    count: int  # how many such storages
    held_bytes: int  # saved storages that are inputs or parameters (resident anyway)


def _storage(t: torch.Tensor):
    """(key, nbytes) of the storage a tensor lives in; a view counts its whole storage,
    which is what it keeps alive."""
    try:
        s = t.untyped_storage()
        return (t.device, s.data_ptr()), s.nbytes()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
        return ("id", id(t)), t.numel() * t.element_size()


def saved_activation_bytes(prepared_or_step, held: Iterable[torch.Tensor] = ()) -> SavedBytes:
    """Run one step and count the bytes autograd saves for its backward.

    ``prepared_or_step``: a ``Prepared`` (its ``step`` is run) or a step callable. ``held``:
    the inputs and parameters; saved tensors that share their storage are reported apart
    (``held_bytes``), not as activations. Saved tensors are kept alive until the step ends,
    so storages are never confused by address reuse.

    >>> import torch
    >>> x = torch.randn(256, requires_grad=True)
    >>> def step():
    ...     x.grad = None
    ...     x.exp().exp().sum().backward()    # each exp saves its output
    >>> saved_activation_bytes(step, held=[x]).activation_bytes
    2048
    """
    step = getattr(prepared_or_step, "step", prepared_or_step)
    held_keys = {_storage(t)[0] for t in held if isinstance(t, torch.Tensor)}
    seen: dict = {}
    refs: list = []

    def pack(t):
        if isinstance(t, torch.Tensor):
            key, nbytes = _storage(t)
            if key not in seen:
                seen[key] = nbytes
                refs.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    refs.clear()
    act = [b for k, b in seen.items() if k not in held_keys]
    return SavedBytes(sum(act), len(act), sum(b for k, b in seen.items() if k in held_keys))


def plans_saved_activation_bytes(prepared) -> int | None:
    """The saved activation bytes the plans of a compiled method report (None without plans)."""
    plans = getattr(prepared, "plans", None) or []
    return sum(p.saved_activation_bytes for p in plans) if plans else None


# -- peak memory ----------------------------------------------------------------------------

@dataclass
class PeakMemory:
    peak_bytes: int  # max bytes resident above the bytes resident before the step
    end_bytes: int  # bytes resident after the step, relative to before
    timeline: list[tuple[float, int]]  # (seconds since the first allocation, bytes above before)
    source: str  # "cuda-allocator" or "profiler"
    allocations: int = 0  # allocation events seen (profiler)
    resident_before: int | None = None  # bytes resident before the step, where known


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def _sync(device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


_MARK = "remat.bench.measured_step"


def memory_events(step: Step, device="cpu", *, lead_in: bool = True) -> list[tuple[int, int]]:
    """``(time_ns, bytes)`` of every allocation (positive) and free (negative) on ``device``
    while ``step()`` runs, in time order, from the profiler's memory records.

    The profiler records no free of a block allocated before it started, so with
    ``lead_in`` one more step runs under the profiler first: the measured step then sees
    the frees of what the step before it left (gradients set to None), as the CUDA
    allocator's statistics do."""
    return [(e.start_ns(), int(e.nbytes())) for e in _step_events(step, device, lead_in)
            if e.name() == "[memory]" and _on(e, device)]


def call_totals(step: Step, names: Iterable[str], device="cpu") -> list[tuple[str, int]]:
    """``(op, bytes)`` for each top-level call of an op in ``names`` (``"aten::mm"``) while
    ``step()`` runs: the bytes allocated on ``device`` above the step's start when the call
    begins (its output, preallocated by inductor's wrapper, included). Lines up with the
    simulator's timeline at each library call (``benchmarks/peak_trace.py --calls``)."""
    names = set(names)
    out, total, until = [], 0, -1
    for e in _step_events(step, device, lead_in=True):
        if e.name() == "[memory]":
            total += int(e.nbytes()) if _on(e, device) else 0
        elif e.name() in names and e.start_ns() >= until:
            out.append((e.name(), total))
            until = e.end_ns()
    return out


def _step_events(step: Step, device, lead_in: bool) -> list:
    """The profiler's events (ops and memory records) of one ``step()``, in time order (an op
    before the ops it calls), after a lead-in step when ``lead_in``."""
    activities = [ProfilerActivity.CPU]
    if _is_cuda(device):
        activities.append(ProfilerActivity.CUDA)
    with _quiet_stderr(), profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        if lead_in:
            step()
            _sync(device)
        with record_function(_MARK):
            step()
            _sync(device)
    events = prof.profiler.kineto_results.events()
    marks = [e for e in events if e.name() == _MARK]
    lo, hi = (marks[0].start_ns(), marks[0].end_ns()) if marks else (-1, 1 << 62)
    return sorted((e for e in events if lo <= e.start_ns() <= hi), key=lambda e: (e.start_ns(), -e.end_ns()))


def _on(event, device) -> bool:
    """Whether a memory record is of ``device``."""
    if ("CUDA" if _is_cuda(device) else "CPU") not in str(event.device_type()):
        return False
    index = torch.device(device).index if _is_cuda(device) else None
    return index is None or event.device_index() in (index, -1)


def _running(events: Sequence[tuple[int, int]]) -> tuple[int, int, list[tuple[float, int]]]:
    total, peak = 0, 0
    tl: list[tuple[float, int]] = [(0.0, 0)]
    t0 = events[0][0] if events else 0
    for t, b in events:
        total += b
        peak = max(peak, total)
        tl.append(((t - t0) / 1e9, total))
    return peak, total, tl


def peak_memory(step: Step, device="cpu", *, warmup: int = 1, timeline: bool = True,
                held: Iterable[torch.Tensor] = ()) -> PeakMemory:
    """Peak bytes of one ``step()`` above the bytes resident before it.

    ``warmup`` steps run first, so gradients (and compiled code) already exist and the
    measured step is a steady-state one. On CUDA the peak comes from the allocator
    (``max_memory_allocated`` minus ``memory_allocated`` before) and the timeline, when
    asked for, from a second step under the profiler. On CPU both come from one step under
    the profiler: the running sum of its allocation and free records, in time order.
    ``held``: tensors resident before the step (params, inputs); their bytes and those of
    their gradients are reported as ``resident_before`` (without ``held``, on CUDA, the
    allocator's count of everything allocated).
    """
    for _ in range(warmup):
        step()
    _sync(device)
    gc.collect()
    resident = _resident_bytes(held) if held else None
    if _is_cuda(device):
        dev = torch.device(device)
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        step()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
        end = torch.cuda.memory_allocated(dev) - before
        tl: list[tuple[float, int]] = []
        n = 0
        if timeline:
            events = memory_events(step, device)
            n = len(events)
            tl = _running(events)[2]
        return PeakMemory(int(peak), int(end), tl, "cuda-allocator", n,
                          resident if resident is not None else int(before))
    events = memory_events(step, device)
    peak, end, tl = _running(events)
    return PeakMemory(peak, end, tl if timeline else [], "profiler", len(events), resident)


def _resident_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        for x in (t, t.grad):
            if isinstance(x, torch.Tensor):
                k, b = _storage(x)
                seen[k] = b
    return sum(seen.values())


# -- step time ------------------------------------------------------------------------------

@dataclass
class Timing:
    median_s: float
    first_s: float  # the first call's seconds (the compile time when the step is still lazy)
    samples: list[float] = field(default_factory=list)
    error: str | None = None  # set when the step raised; it left the loop then


def _timed(fn: Step, device) -> float:
    if _is_cuda(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(torch.device(device))
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(torch.device(device))
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_time(steps: dict[str, Step], repeats: int = 10, warmup: int = 2, device="cpu") -> dict[str, Timing]:
    """Median seconds per step of each named step, alternating the methods in one loop
    (every round runs each method once, in a rotating order, so that drifts in clock speed
    or background load hit them alike). A step that raises leaves the loop; its
    :class:`Timing` carries the error and the others go on.

    >>> import torch
    >>> x = torch.randn(64, requires_grad=True)
    >>> t = step_time({"a": lambda: x.exp().sum().backward(), "b": lambda: x.cos().sum().backward()},
    ...               repeats=3, warmup=1)
    >>> sorted(t), t["a"].median_s > 0
    (['a', 'b'], True)
    """
    names = list(steps)
    first: dict[str, float] = {}
    samples: dict[str, list[float]] = {k: [] for k in names}
    errors: dict[str, str] = {}

    def run(name: str) -> float | None:
        if name in errors:
            return None
        try:
            return _timed(steps[name], device)
        except Exception as e:  # noqa: BLE001 - recorded, the other methods go on
            errors[name] = error_status(e)
            _free_after_error(device)
            return None

    for w in range(max(warmup, 1)):
        for name in names:
            t = run(name)
            if w == 0 and t is not None:
                first[name] = t
    for r in range(repeats):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            t = run(name)
            if t is not None:
                samples[name].append(t)
    out = {}
    for name in names:
        s = samples[name]
        out[name] = Timing(statistics.median(s) if s else math.nan, first.get(name, math.nan), s,
                           errors.get(name))
    return out


# -- errors and out-of-memory ---------------------------------------------------------------

def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, (RuntimeError, MemoryError)) and (
        isinstance(e, MemoryError) or "out of memory" in str(e).lower())


def error_status(e: BaseException) -> str:
    """``"oom"`` for out-of-memory errors, else ``"error: <type>: <first line>"``."""
    if is_oom(e):
        return "oom"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"error: {type(e).__name__}: {msg[:300]}"


def _free_after_error(device) -> None:
    gc.collect()
    if _is_cuda(device) and torch.cuda.is_available():
        torch.cuda.empty_cache()


def free_memory(device="cpu", reset_dynamo: bool = True) -> None:
    """Release what a finished case held: garbage, the CUDA cache, dynamo's compiled code."""
    if reset_dynamo:
        torch._dynamo.reset()
    gc.collect()
    if _is_cuda(device) and torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- maximum batch size ---------------------------------------------------------------------

@dataclass
class Probe:
    batch: int
    fits: bool
    peak_bytes: int | None = None  # measured total (resident before + peak of the step)
    error: str | None = None


@dataclass
class BatchSearch:
    batch: int  # the largest batch that fits (0: not even the first probe)
    probes: list[Probe]
    budget_bytes: int | None
    device: str


def max_batch_size(build_fn: Callable[[int], Any], budget_bytes: int | None = None, device="cpu",
                   *, start: int = 1, limit: int = 1 << 16) -> BatchSearch:
    """The largest batch size whose training step fits: doubling from ``start`` until a
    probe fails (or ``limit``), then bisection between the last fit and the first failure.

    ``build_fn(batch)`` returns a step, a ``Prepared``, or ``(step, held)`` where ``held``
    are the tensors resident before the step (params and inputs). Without a budget (GPU
    only) a batch fits when two steps run without ``torch.cuda.OutOfMemoryError``. With
    ``budget_bytes`` (any device) it fits when the bytes resident before the step (``held``
    and their gradients; on CUDA the allocator's count) plus the step's measured peak stay
    within the budget. Every probe is recorded; memory is freed after each.

    >>> import torch
    >>> def build(b):
    ...     x = torch.randn(b, 1024, requires_grad=True)
    ...     def step():
    ...         x.grad = None
    ...         x.exp().sum().backward()
    ...     return step, [x]
    >>> max_batch_size(build, budget_bytes=64 * 4096).batch  # 12 KiB a row: x, exp(x), x.grad
    21
    """
    device = str(device)
    if budget_bytes is None and not _is_cuda(device):
        raise ValueError("max_batch_size on a CPU needs budget_bytes (the CPU has no out-of-memory "
                         "signal to search for); pass a byte budget")
    probes: list[Probe] = []
    known: dict[int, bool] = {}

    def probe(b: int) -> Probe:
        p = Probe(b, False)
        try:
            built = build_fn(b)
            step, held = (built if isinstance(built, tuple) else (built, ()))
            step = getattr(step, "step", step)
            if budget_bytes is None:
                step()
                step()
                _sync(device)
                p.fits = True
            else:
                pm = peak_memory(step, device, warmup=1, timeline=False, held=held)
                before = pm.resident_before or 0
                p.peak_bytes = before + pm.peak_bytes
                p.fits = p.peak_bytes <= budget_bytes
        except Exception as e:  # noqa: BLE001 - an OOM is the answer; other errors are recorded
            p.error = error_status(e)
            p.fits = False
        return p

    def fits(b: int) -> bool:
        if b not in known:
            p = probe(b)  # its frame, and every tensor the probe built, is gone now
            free_memory(device)
            probes.append(p)
            known[b] = p.fits
        return known[b]

    lo, hi = 0, None  # lo fits (0: nothing yet), hi fails
    b = max(1, start)
    while b <= limit:
        if fits(b):
            lo = b
            b *= 2
        else:
            hi = b
            break
    if hi is None:
        return BatchSearch(lo, probes, budget_bytes, device)
    if lo == 0 and hi > 1:  # start itself failed: search below it
        lo_fail = hi
        b = hi // 2
        while b >= 1 and not fits(b):
            lo_fail = b
            b //= 2
        if b < 1:
            return BatchSearch(0, probes, budget_bytes, device)
        lo, hi = b, lo_fail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return BatchSearch(lo, probes, budget_bytes, device)


# -- the simulator's prediction -------------------------------------------------------------

@dataclass
class Prediction:
    peak_bytes: int  # predicted peak above the bytes resident before the step
    seconds: float  # predicted step time (sum over graphs)
    saved_activation_bytes: int
    per_graph: list[dict]
    timeline: list[int]  # bytes above the start, per statement, graphs one after another
    note: str = ""


def predicted(prepared, profile=None, *, fallback=None,
              released_bytes: int | None = None) -> Prediction | None:
    """The simulator's prediction for a method's step, comparable to :func:`peak_memory`.

    Each plan's schedule is simulated with the cost model on ``profile`` (a measured
    :class:`~remat.cost.model.DeviceProfile`; the built-in CPU profile if None). The peak is
    taken above the bytes resident before the step, as :func:`peak_memory` measures it: the
    simulator's constant bytes (inputs, params) are subtracted, and so are the bytes the
    step releases when it starts: the previous step's gradients, freed when it sets
    ``grad = None``. ``released_bytes`` gives that amount (measure it: see
    :func:`released_gradient_bytes`); by default it is the gradients the graph returns.
    With several graphs (graph breaks) the peak is the largest graph's and
    the time the sum; ``note`` says so. Methods without plans (eager autograd, checkpointing)
    get ``fallback``'s prediction (pass the no-recompute method's ``Prepared`` for eager) or None.
    """
    plans = list(getattr(prepared, "plans", None) or [])
    if not plans:
        if fallback is None:
            return None
        return predicted(fallback, profile, released_bytes=released_bytes)
    graphs = list(getattr(prepared, "graphs", None) or [])
    cm = CostModel(profile) if profile is not None else CostModel()
    per_graph, peak, seconds, saved, tl = [], 0, 0.0, 0, []
    for k, plan in enumerate(plans):
        g = plan.graph if plan.graph is not None else (graphs[k] if k < len(graphs) else None)
        if g is None:
            raise ValueError(f"plan {k} of {getattr(prepared, 'method', '?')!r} has no graph to simulate")
        sim = simulate(plan.schedule(g), cm)
        grads = gradient_bytes(g) if released_bytes is None else released_bytes
        base = sim.constant_bytes + grads
        rel = sim.peak_bytes - base
        per_graph.append({"graph": g.name, "nodes": len(g), "valid": sim.valid, "peak_bytes": int(rel),
                          "simulated_peak_bytes": sim.peak_bytes, "constant_bytes": sim.constant_bytes,
                          "released_bytes": grads, "seconds": sim.predicted_seconds,
                          "recomputes": sim.recomputes})
        peak = max(peak, rel)
        seconds += sim.predicted_seconds
        saved += plan.saved_activation_bytes
        tl.extend(int(b - base) for b in sim.timeline)
    note = f"{len(plans)} graphs: peak of the largest, time summed" if len(plans) > 1 else ""
    if any(not p["valid"] for p in per_graph):
        note = (note + "; " if note else "") + "a schedule was invalid"
    return Prediction(int(peak), seconds, saved, per_graph, tl, note)


def gradient_bytes(g) -> int:
    """Bytes of the gradients a joint graph's backward returns (outputs of backward nodes)."""
    owner, sizes = storage(g)
    own = {owner[i] for i, n in enumerate(g.nodes) if n.role == "backward" and n.is_output}
    return int(sum(sizes[i] for i in own))


def released_gradient_bytes(step: Step, params: Iterable[torch.Tensor]) -> int:
    """Bytes of gradients that ``step()`` releases: run one step and sum the gradients whose
    storage it replaced (a step that sets ``grad = None`` replaces them all; one that zeroes
    them in place replaces none). Run a step first so that gradients exist."""
    params = [p for p in params if isinstance(p, torch.Tensor)]
    old = [p.grad for p in params]  # held, so a new gradient cannot reuse the old address
    step()
    seen, total = set(), 0
    for p, g in zip(params, old):
        if g is None:
            continue
        key, nbytes = _storage(g)
        if key in seen:
            continue
        if p.grad is None or _storage(p.grad)[0] != key:
            seen.add(key)
            total += nbytes
    del old
    return total


@contextlib.contextmanager
def graph_caches_off(kernel_cache: bool = True):
    """Turn off the caches that would load a compiled step without partitioning it (inductor's
    FX graph cache, AOTAutograd's): a step loaded from them is not planned, so no plan reaches
    ``on_plan``. Keep the kernel binaries' cache if ``kernel_cache``."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    if not kernel_cache:
        with inductor_config.patch(force_disable_caches=True):
            yield
        return
    with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            functorch_config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False):
        yield
