"""remat's budgets against plain ``torch.compile`` and PyTorch's ``activation_memory_budget``
knob, model by model, in one run (``benchmarks/budgets_vs_torch.py``, issue 30).

Per model (:func:`remat.zoo.trials.budget_case`), every method on its own copy of the same
weights and inputs, through the same compiler:

- ``torch.compile``: the reference of every fraction and step-time ratio: plain
  ``torch.compile(model)`` (``compiler="inductor"``) or
  ``torch.compile(model, backend="aot_eager_decomp_partition")`` (``compiler="eager"``:
  AOTAutograd with inductor's decompositions and PyTorch's min-cut partition, no codegen);
- ``eager``: plain autograd, for scale;
- ``no-recompute``: ``remat.compile(model, solver="no-recompute")`` (PyTorch's
  ``default_partition`` in remat's pipeline): the gradient reference of remat's rows;
- ``remat`` at no budget, at each fraction asked for, at ``budget="min"`` and at
  ``max_overhead=0.1``: ``remat.compile(model, compiler=..., cache=False, ...)``. Warnings
  from remat (any category of remat's) are recorded in ``warned``; an exception gives a row
  with its status (``refused: InfeasibleBudgetError`` and the smallest feasible budget, or
  ``error: ...``), never a stop;
- ``knob``: the reference with ``torch._functorch.config.activation_memory_budget = B``
  (``activation_memory_budget_solver = "dp"``) while it compiles, at each fraction and at 0.0
  (its least memory).

Measured per row (:mod:`remat.bench.measure`): the peak above the step's start, as a
``fraction`` of the reference's; remat's ``predicted`` fraction, from its plans
(``(plan.peak_bytes - resident_bytes) / activation_bytes``, summed over graphs); the step-time
``ratio`` to the reference (one alternating loop over every method, median [min, max] of the
per-round ratios); planning seconds (``plan_s``: remat's ``plan.solve_seconds`` summed; the
knob's and the reference's time in ``min_cut_rematerialization_partition``, its dp solver
included); and two gradient checks after the first step (every step is seeded, so dropout
draws the same masks in every call of a method):

- ``grad_eager`` / ``grad_ref``: max |g - g_ref| over the parameters, divided by max |g_ref|,
  against plain eager autograd and against a reference that draws the same random masks
  (:func:`gradient_reference`: ``no-recompute`` for remat's rows, ``torch.compile`` for the
  others). Compiled code draws its dropout masks differently from eager autograd, and remat's
  pipeline differently from plain torch.compile: for models with dropout ``grad_eager`` is
  large for every compiled method and ``grad_ref`` is the comparison;
- ``fd``: the method's gradient against its own forward: for fixed random unit directions
  d (one generator for every method), |(L(θ+εd) - L(θ-εd))/2ε - g·d| / max(|that|, |g·d|),
  the largest over the directions, each the least over two steps ε (``fd_step`` and 4x it,
  times the norm of the parameters).
  L is the method's compiled forward (grad mode, same seed), so a backward that recomputes
  random ops with fresh randomness disagrees with it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import math
import statistics
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from remat.bench.harness import MiB, copy_inputs, fmt, held
from remat.bench.measure import error_status, free_memory, peak_memory, step_time
from remat.zoo.trials import Case, make_step

REFERENCE = "torch.compile"
NO_RECOMPUTE = "no-recompute"  # remat.compile(solver="no-recompute"): remat's rows' gradient reference
PEAK_TOL = 0.01  # a measured fraction within 1% of the one asked for counts as within it
FD_TOL = 0.01  # the directional check's error that counts as agreeing with the forward
SEED = 3  # every step's generator seed (dropout masks)

# -- clocks around PyTorch's partitioner -----------------------------------------------------------
# aot_eager_decomp_partition and inductor's compile_fx look min_cut_rematerialization_partition up
# in their module's globals at each call: wrapped there, its seconds are the knob's planning time.

CLOCK = {"torch_partition": 0.0}
_CLOCKED_MODULES = ("torch._functorch.partitioners", "torch._dynamo.backends.debugging",
                    "torch._inductor.compile_fx")


def _clocked(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK["torch_partition"] += time.perf_counter() - t0

    timed._remat_clocked = True
    return timed


def install_clocks() -> None:
    """Wrap PyTorch's min-cut partitioner where the compilers look it up (once per process)."""
    import importlib

    for name in _CLOCKED_MODULES:
        mod = importlib.import_module(name)
        fn = getattr(mod, "min_cut_rematerialization_partition", None)
        if fn is not None and not getattr(fn, "_remat_clocked", False):
            mod.min_cut_rematerialization_partition = _clocked(fn)


def checked_models(ap, names: str, size: str) -> list[str]:
    """The comma-separated ``names`` as a list, each a model of ``size`` in
    :data:`~remat.zoo.trials.BUDGET_SIZES` (``ap.error`` naming the choices otherwise)."""
    from remat.zoo.trials import BUDGET_SIZES

    models = [m.strip() for m in names.split(",") if m.strip()]
    for m in models:
        if m not in BUDGET_SIZES:
            ap.error(f"unknown model {m!r}; models: {', '.join(BUDGET_SIZES)}")
        if size not in BUDGET_SIZES[m]:
            ap.error(f"model {m!r} has no size {size!r}; its sizes: {', '.join(BUDGET_SIZES[m])}")
    return models


def fresh_compiles() -> None:
    """Every method compiles and partitions afresh (no FX-graph or AOTAutograd cache, room for
    every method's recompiles of the same forward), with PyTorch's partitioner clocked
    (:func:`install_clocks`)."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    dynamo_config.recompile_limit = 1024  # every method compiles the same forward again
    dynamo_config.accumulated_recompile_limit = 1 << 16
    inductor_config.fx_graph_cache = False  # every compile partitions afresh
    functorch_config.enable_autograd_cache = False
    install_clocks()


def row_writer(path) -> Callable:
    """A callback that appends each row to ``path`` (JSON lines, the file emptied now): a run
    cut short keeps what it measured."""
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")

    def on_row(r) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(asdict(r), default=str) + "\n")

    return on_row


# -- the methods ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    """One row's method: ``kind`` (``torch.compile``, ``eager``, ``no-recompute``, ``remat``,
    ``knob``), its
    budget label, the fraction asked for (None: no fraction) and remat's keyword arguments."""

    kind: str
    budget: str
    asked: float | None = None
    options: tuple = ()


def methods(budgets: list[float], knob_budgets: list[float], *, eager: bool = True, least: bool = True,
            max_overhead: float | None = 0.1) -> list[Method]:
    """The rows of one model, the reference first."""
    out = [Method(REFERENCE, "-")]
    if eager:
        out.append(Method("eager", "-"))
    out.append(Method(NO_RECOMPUTE, "-", None, (("solver", "no-recompute"),)))
    out.append(Method("remat", "none"))
    out += [Method("remat", f"{b:g}", b, (("budget", b),)) for b in budgets]
    if least:
        out.append(Method("remat", "min", None, (("budget", "min"),)))
    if max_overhead is not None:
        out.append(Method("remat", f"overhead {max_overhead:g}", None, (("max_overhead", max_overhead),)))
    out += [Method("knob", f"{b:g}", b) for b in knob_budgets]
    return out


def plain_compile(model: nn.Module, compiler: str) -> Callable:
    """Plain ``torch.compile`` through ``compiler`` (no remat): inductor's ``compile_fx`` or
    ``aot_eager_decomp_partition``, each call through a backend of its own: dynamo matches a
    compiled frame by its backend, and a copy of the model under the same backend would run the
    code compiled for the first copy (the knob's rows the reference's, never partitioned)."""
    if compiler == "inductor":
        from torch._inductor.compile_fx import compile_fx

        def backend(gm, example_inputs):
            return compile_fx(gm, example_inputs)
    else:
        from torch._dynamo.backends.debugging import aot_eager_decomp_partition

        def backend(gm, example_inputs):
            return aot_eager_decomp_partition(gm, example_inputs)

    return torch.compile(model, backend=backend, dynamic=False)


def knob(budget: float):
    """PyTorch's knob at ``budget`` (its dp solver) while a compile runs."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(activation_memory_budget=float(budget), activation_memory_budget_solver="dp")


# -- one row -------------------------------------------------------------------------------------

@dataclass
class Row:
    model: str
    method: str  # torch.compile, eager, no-recompute, remat, knob
    budget: str  # "-", "none", "min", "overhead 0.1", or the fraction asked for
    asked: float | None = None  # the fraction asked for
    status: str = "ok"  # ok, refused: ..., error: ...
    warned: str = ""  # remat's warnings (category: first line), "; "-joined
    peak_bytes: int | None = None  # measured peak above the step's start
    fraction: float | None = None  # peak_bytes / the reference's
    predicted: float | None = None  # remat's plans: predicted fraction of the activation memory
    smallest_feasible: float | None = None  # refused: the smallest feasible budget, as a fraction
    step_ms: float | None = None
    ratio: float | None = None  # step time / the reference's, median over rounds
    ratio_min: float | None = None
    ratio_max: float | None = None
    plan_s: float | None = None  # remat: sum of plan.solve_seconds; knob/reference: its partition
    compile_s: float | None = None  # the first step minus a steady one
    first_s: float | None = None  # the first call: compile (capture, planning, lowering) and the first step
    first_ratio: float | None = None  # first_s / the reference's first_s, both in this run
    predicted_time: float | None = None  # remat's plans: predicted step time / plain torch.compile's, by remat
    out_of_reach: bool = False  # remat: some plan runs its least memory, its share of the budget out of reach
    budget_warning: str = ""  # remat's RematBudgetWarning texts in full, " | "-joined
    graphs: int | None = None  # remat: graphs planned
    solvers: list[str] = field(default_factory=list)
    grad_eager: float | None = None  # max |g - g_eager| / max |g_eager|
    grad_ref: float | None = None  # max |g - g_ref| / max |g_ref|, g_ref: the same compiler's, same draws
    fd: float | None = None  # directional check against the method's own forward
    note: str = ""


@dataclass
class Settings:
    compiler: str = "eager"
    device: str = "cpu"
    time_limit: float | None = None
    fd_step: float = 1e-3  # ε as a share of the parameters' norm (and 4x that)
    fd_directions: int = 2
    seed: int = SEED


def grads_of(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters() if p.requires_grad]


def grad_rel_err(model: nn.Module, reference: list) -> float | None:
    """max |g - g_ref| over every parameter / max |g_ref| (a gradient one side lacks counts as
    zeros)."""
    if not reference:
        return None
    diff, scale = 0.0, 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    for p, r in zip(params, reference):
        g = p.grad
        if g is None and r is None:
            continue
        g = torch.zeros_like(p) if g is None else g
        r = torch.zeros_like(p) if r is None else r
        diff = max(diff, float((g.double() - r.double()).abs().max()))
        scale = max(scale, float(r.double().abs().max()))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def directions(model: nn.Module, n: int, seed: int = 7) -> list[list[torch.Tensor]]:
    """``n`` random unit directions in the space of the trainable parameters (float64, CPU)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        d = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in model.parameters() if p.requires_grad]
        norm = math.sqrt(sum(float((x * x).sum()) for x in d))
        out.append([x / norm for x in d])
    return out


FD_SCALES = (1.0, 4.0)  # the directional check's steps, in units of its ``step``


def directional_error(fn: Callable, model: nn.Module, inputs: tuple, dirs: list, step: float,
                      seed: int = SEED) -> float:
    """The gradient in ``p.grad`` against ``fn``'s own forward along each direction (central
    differences, every forward seeded): per direction the least over ε = ``step`` x
    :data:`FD_SCALES` x the parameters' norm of |fd - g·d| / max(|fd|, |g·d|), and the largest
    over the directions. Two steps: float32 rounding spoils a small one and curvature (a ReLU's
    kink, BatchNorm) a large one, model by model; a wrong gradient is off at both. The
    parameters are restored after."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]
    theta = [p.detach().clone() for p in params]
    norm = math.sqrt(sum(float((t.double() ** 2).sum()) for t in theta))
    errs = []
    try:
        for d in dirs:
            gd = sum(float((g.double() * x.to(g.device)).sum()) for g, x in zip(grads, d))
            best = math.inf
            for scale in FD_SCALES:
                eps = step * scale * norm
                values = []
                for sign in (1.0, -1.0):
                    with torch.no_grad():
                        for p, t, x in zip(params, theta, d):
                            p.copy_((t.double() + sign * eps * x.to(t.device)).to(t.dtype))
                    torch.manual_seed(seed)
                    values.append(float(fn(*inputs).detach()))
                fd = (values[0] - values[1]) / (2 * eps)
                best = min(best, abs(fd - gd) / max(abs(fd), abs(gd), 1e-30))
            errs.append(best)
    finally:
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)
    return max(errs)


def _budget_warnings(caught) -> str:
    """The full texts of remat's budget warnings (what the user reads: the fraction reached,
    why it cannot go lower, the predicted slowdown)."""
    texts = [str(w.message).strip() for w in caught if w.category.__name__ == "RematBudgetWarning"]
    return " | ".join(dict.fromkeys(texts))


def _remat_warnings(caught) -> str:
    seen = {}
    for w in caught:
        if w.category.__module__.split(".")[0] == "remat":
            seen.setdefault(f"{w.category.__name__}: {str(w.message).strip().splitlines()[0][:200]}", None)
    return "; ".join(seen)


@dataclass
class Measured:
    row: Row
    step: Callable | None = None
    model: Any = None


def measure(case: Case, m: Method, s: Settings, refs: dict, dirs: list) -> Measured:
    """Compile one method on a copy of ``case``, check its gradients, measure its peak.
    ``refs``: reference gradients by method (``eager``; the reference's and no-recompute's are
    added when their rows run)."""
    import remat

    row = Row(case.name, m.kind, m.budget, m.asked)
    out = Measured(row)
    model = copy.deepcopy(case.model)
    inputs = copy_inputs(case.inputs)
    out.model = model
    plans: list = []
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if m.kind == "eager":
        fn: Callable = model
    elif m.kind == REFERENCE:
        fn = plain_compile(model, s.compiler)
    elif m.kind == "knob":
        fn = plain_compile(model, s.compiler)
        ctx = knob(m.asked)
    else:
        kw: dict = dict(compiler=s.compiler, cache=False, dynamic=False, on_plan=lambda g, p: plans.append(p))
        if s.time_limit is not None:
            kw["time_limit"] = s.time_limit
        fn = remat.compile(model, **dict(m.options), **kw)
    step = make_step(fn, model, inputs, seed=s.seed)
    CLOCK["torch_partition"] = 0.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            t0 = time.perf_counter()
            with ctx:
                step()
            if str(s.device).startswith("cuda"):
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            row.first_s = first
            if m.kind != "eager":
                row.plan_s = float(sum(p.solve_seconds for p in plans)) if m.kind in ("remat", NO_RECOMPUTE) \
                    else CLOCK["torch_partition"]
            row.graphs = len(plans) if m.kind in ("remat", NO_RECOMPUTE) else None
            row.solvers = list(dict.fromkeys(p.solver for p in plans))
            row.predicted = predicted_fraction(plans)
            if m.kind in ("remat", NO_RECOMPUTE):
                row.predicted_time = predicted_time(plans)
                row.out_of_reach = any(p.out_of_reach is not None for p in plans)
            if m.kind in (REFERENCE, NO_RECOMPUTE):
                refs[m.kind] = grads_of(model)
            row.grad_eager = grad_rel_err(model, refs.get("eager", []))
            row.grad_ref = grad_rel_err(model, refs.get(gradient_reference(m.kind), []))
            if dirs:
                row.fd = directional_error(fn, model, inputs, dirs, s.fd_step, s.seed)
            n_plans = len(plans)
            row.peak_bytes = int(peak_memory(step, s.device, warmup=1, timeline=False,
                                             held=held(model, inputs)).peak_bytes)
            if len(plans) != n_plans:
                row.note = f"recompiled after the first step ({len(plans)} plans)"
            row.compile_s = first  # the steady step's time is taken off after the timing loop
            out.step = step
        except remat.InfeasibleBudgetError as e:
            row.status = "refused: InfeasibleBudgetError"
            row.smallest_feasible = _smallest_fraction(e)
            row.note = str(e).strip().splitlines()[0][:300]
        except Exception as e:  # noqa: BLE001 - recorded; the other methods go on
            row.status = error_status(e)
            row.note = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-1500:]
        row.warned = _remat_warnings(caught)
        row.budget_warning = _budget_warnings(caught)
    return out


def gradient_reference(kind: str) -> str:
    """Whose gradients a method's are compared with, beside eager autograd's: one that draws the
    same random masks. remat's pipeline draws them its own way (the same in every plan of
    remat's, no-recompute's included), plain torch.compile and the knob theirs."""
    if kind == REFERENCE:
        return REFERENCE
    return NO_RECOMPUTE if kind in ("remat", NO_RECOMPUTE) else REFERENCE


def predicted_fraction(plans: list) -> float | None:
    """The fraction of the activation memory remat's plans predict (summed over graphs)."""
    from remat.plans.budget import activation_bytes, resident_bytes

    if not plans or any(p.graph is None or p.peak_bytes is None for p in plans):
        return None
    above = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    return above / sum(activation_bytes(p.graph) for p in plans)


def predicted_time(plans: list) -> float | None:
    """remat's predicted step time of its plans over plain torch.compile's partition's (the
    reference schedule of each graph), summed over graphs; a staged schedule's time counted with
    its penalty, as the planner bounds it (:func:`remat.solvers.portfolio.bounded_seconds`)."""
    from remat.cost.model import default_cost_model
    from remat.plans.budget import reference_seconds
    from remat.solvers.portfolio import bounded_seconds

    if not plans or any(p.graph is None or p.predicted_seconds is None for p in plans):
        return None
    try:
        ref = sum(reference_seconds(p.graph, default_cost_model(p.graph)) for p in plans)
        return sum(bounded_seconds(p) for p in plans) / ref if ref > 0 else None
    except Exception:  # noqa: BLE001 - a column, not the row: no reference step to divide by
        return None


def _smallest_fraction(e) -> float | None:
    from remat.plans.budget import activation_bytes, resident_bytes

    g = getattr(getattr(e, "plan", None), "graph", None)
    if e.smallest_feasible is None or g is None:
        return None
    return (e.smallest_feasible - resident_bytes(g)) / activation_bytes(g)


# -- one model ------------------------------------------------------------------------------------

def run_model(case: Case, ms: list[Method], s: Settings, repeats: int = 5,
              on_row: Callable[[Row], None] | None = None, *, warm: bool = False) -> list[Row]:
    """Every method on ``case``, then one alternating timing loop; rows in ``ms``'s order.
    ``warm``: one plain torch.compile step of a copy first, thrown away, so that the first
    method's first call does not pay alone for what dynamo keeps across compiles of the same
    code (the first-call ratios: a Mixtral's first plain compile took 10.1 s, remat's first
    call after it 4.0 s)."""
    ref = copy.deepcopy(case.model)
    make_step(ref, ref, copy_inputs(case.inputs), seed=s.seed)()
    refs = {"eager": grads_of(ref)}
    if warm:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_step(plain_compile(ref, s.compiler), ref, copy_inputs(case.inputs), seed=s.seed)()
    del ref
    dirs = directions(case.model, s.fd_directions) if s.fd_directions else []
    done: list[Measured] = []
    for m in ms:
        t0 = time.perf_counter()
        v = measure(case, m, s, refs, dirs)
        done.append(v)
        r = v.row
        peak = f"{r.peak_bytes / MiB:.2f} MiB" if r.peak_bytes is not None else "-"
        print(f"  {r.method:>13} {r.budget:>12}: {r.status[:40]:<12} peak {peak:>11}"
              f"{'  warned' if r.warned else ''}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        if on_row is not None:
            on_row(r)
    ref_row = done[0].row if done and done[0].row.method == REFERENCE else None
    for v in done:
        if ref_row is not None and ref_row.peak_bytes and v.row.peak_bytes is not None:
            v.row.fraction = v.row.peak_bytes / ref_row.peak_bytes
        if ref_row is not None and ref_row.first_s and v.row.first_s is not None:
            v.row.first_ratio = v.row.first_s / ref_row.first_s
    steps = {str(i): v.step for i, v in enumerate(done) if v.step is not None}
    if steps and "0" in steps and ref_row is not None:
        times = step_time(steps, repeats=repeats, warmup=2, device=s.device)
        base = times["0"].samples
        for i, v in enumerate(done):
            t = times.get(str(i))
            if t is None:
                continue
            if t.error:
                v.row.status = t.error
                continue
            v.row.step_ms = t.median_s * 1e3
            n = min(len(t.samples), len(base))
            if n:
                ratios = [a / b for a, b in zip(t.samples[:n], base[:n])]
                v.row.ratio, v.row.ratio_min, v.row.ratio_max = statistics.median(ratios), min(ratios), max(ratios)
            if v.row.compile_s is not None:
                v.row.compile_s = max(0.0, v.row.compile_s - t.median_s)
    rows = [v.row for v in done]
    done.clear()
    steps.clear()
    free_memory(s.device)
    gc.collect()
    return rows


# -- report --------------------------------------------------------------------------------------

COLUMNS = ("method", "budget", "status", "warned", "peak MiB", "fraction", "predicted", "step ratio [min, max]",
           "plan s", "compile s", "grad vs eager", "grad vs ref", "fd check", "note")
LEGEND = ("fraction: measured peak above the step's start / torch.compile's; grad vs eager / vs ref: "
          "max |g - g_ref| / max |g_ref| after one seeded step, ref: remat.compile(solver='no-recompute') for "
          "remat's rows, torch.compile for the others (same random draws); fd check: the gradient against "
          "the method's own forward along random directions (central differences)")


def table(rows: list[Row]) -> str:
    """A Markdown table of one model's rows."""
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        status = r.status if r.status == "ok" or r.status.startswith("refused") else r.status[:80]
        if r.smallest_feasible is not None:
            status += f" (smallest {r.smallest_feasible:.3f})"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f} [{r.ratio_min:.2f}, {r.ratio_max:.2f}]"
        warned = ", ".join(dict.fromkeys(w.split(":")[0] for w in r.warned.split("; ") if w)) or ""
        note = ",".join(r.solvers) if r.method in ("remat", NO_RECOMPUTE) else ""
        if r.note and r.status == "ok":
            note = "; ".join(x for x in (note, r.note[:100]) if x)
        out.append("| " + " | ".join((
            r.method, r.budget, status, warned, fmt(None if r.peak_bytes is None else r.peak_bytes / MiB),
            fmt(r.fraction, "{:.3f}"), fmt(r.predicted, "{:.3f}"), ratio, fmt(r.plan_s), fmt(r.compile_s, "{:.1f}"),
            fmt(r.grad_eager, "{:.1e}"), fmt(r.grad_ref, "{:.1e}"), fmt(r.fd, "{:.1e}"), note)) + " |")
    return "\n".join(out)


def checks(rows: list[Row]) -> list[str]:
    """Issue 30's targets on one model's rows: no fraction refused; the measured fraction
    within the one asked wherever remat did not warn; remat's least memory at most the
    knob's; and the directional gradient check of every row."""
    lines = []
    remat_rows = [r for r in rows if r.method == "remat"]
    knob_rows = [r for r in rows if r.method == "knob"]
    refused = [f"{r.budget} ({r.status}{'' if r.smallest_feasible is None else f', smallest {r.smallest_feasible:.3f}'})"
               for r in remat_rows if r.status != "ok"]
    lines.append("- no fraction refused: " + ("yes" if not refused else "NO: " + "; ".join(refused)))
    over, warned = [], []
    for r in remat_rows:
        if r.asked is None or r.status != "ok" or r.fraction is None:
            continue
        if r.warned:
            warned.append(f"{r.budget} -> {r.fraction:.3f}")
        elif r.fraction > r.asked * (1 + PEAK_TOL):
            over.append(f"{r.budget} -> {r.fraction:.3f}")
    text = "yes" if not over else "NO: " + ", ".join(over)
    if warned:
        text += f" (warned, not judged: {', '.join(warned)})"
    lines.append(f"- measured fraction <= asked wherever remat did not warn ({PEAK_TOL:.0%} tolerance): {text}")
    ok = lambda rs: [r for r in rs if r.status == "ok" and r.peak_bytes is not None]  # noqa: E731
    rl, kl = ok(remat_rows), ok(knob_rows)
    if rl and kl:
        r = min(rl, key=lambda r: r.peak_bytes)
        k = min(kl, key=lambda r: r.peak_bytes)
        verdict = "yes" if r.peak_bytes <= k.peak_bytes * (1 + PEAK_TOL) else \
            f"NO: {r.peak_bytes / k.peak_bytes:.2f}x the knob's"
        lines.append(f"- remat's least <= the knob's least: {verdict} (remat {r.budget}: "
                     f"{fmt(r.fraction, '{:.3f}')}, {r.peak_bytes / MiB:.2f} MiB; knob {k.budget}: "
                     f"{fmt(k.fraction, '{:.3f}')}, {k.peak_bytes / MiB:.2f} MiB)")
    else:
        lines.append("- remat's least <= the knob's least: not measured")
    eager_fd = next((r.fd for r in rows if r.method == "eager" and r.fd is not None), None)
    bad = [f"{r.method} {r.budget} {r.fd:.2g}" for r in rows if r.fd is not None and r.fd > FD_TOL]
    verdict = "not measured" if all(r.fd is None for r in rows) else ("yes" if not bad else "NO: " + ", ".join(bad))
    lines.append(f"- gradient agrees with its own forward (directional check <= {FD_TOL}; eager "
                 f"{fmt(eager_fd, '{:.1e}')}): {verdict}")
    return lines


def as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


def capture(case: Case, budgets: list[float], out) -> None:
    """Write ``<name>_graph<k>.json`` (remat's graph JSON of each graph of ``case``'s step) and
    ``<name>_knob.json`` (the plans of PyTorch's partitioner under its knob at each budget,
    and at its default as ``none``) under ``out``, to plan offline (``--capture``)."""
    import json
    from pathlib import Path

    import remat
    from remat.graph.io import save_graph

    out = Path(out)
    plans_by_budget = {}
    for b in [None] + list(budgets):
        ctx = contextlib.nullcontext() if b is None else knob(b)
        with ctx:
            plans = remat.plan_all(copy.deepcopy(case.model), *case.inputs, solver="torch-mincut", cache=False)
        plans_by_budget["none" if b is None else f"{b:g}"] = [p.to_dict() for p in plans]
        if b is None:
            for k, p in enumerate(plans):
                save_graph(p.graph, out / f"{case.name}_graph{k}.json")
            print(f"{case.name}: {len(plans)} graph(s), {[len(p.graph) for p in plans]} nodes", flush=True)
    (out / f"{case.name}_knob.json").write_text(json.dumps(plans_by_budget, default=str))


# -- the budget range (benchmarks/budget_range.py, issue 39) ------------------------------------------

RANGE_PEAK_TOL = 0.02  # issue 39: a fraction is met at measured <= f x the reference's measured peak, plus 2%
RANGE_TIME_TOL = 0.05  # a measured step ratio within 5% of its bound (max_overhead; min's, out of reach)
RANGE_COLUMNS = ("budget", "status", "peak MiB", "fraction", "predicted", "step ratio [min, max]", "predicted time",
                 "warned", "first-call ratio", "first call s", "plan s", "grad vs ref", "fd check", "solvers")


def range_methods(fractions: list[float], max_overhead: float | None = 0.1, *, gradients: bool = True) -> list[Method]:
    """The rows of one model of the budget range: the reference, ``no-recompute`` (the gradient
    reference of remat's rows; ``gradients=False`` leaves it out), remat at no budget, at each
    fraction, at ``"min"`` and at ``max_overhead``; no knob, no eager row."""
    ms = methods(fractions, [], eager=False, least=True, max_overhead=max_overhead)
    return [m for m in ms if gradients or m.kind != NO_RECOMPUTE]


def _is_budget_warning(r: Row) -> bool:
    return bool(r.budget_warning) or "RematBudgetWarning" in r.warned


def range_table(rows: list[Row]) -> str:
    """A Markdown table of one model's rows of the budget range: measured fraction of plain
    torch.compile's peak, remat's predicted fraction, step ratio (measured and predicted),
    whether remat warned (``budget``: a RematBudgetWarning, ``out of reach``: a plan runs its
    least memory), and the first call over plain torch.compile's first call."""
    out = ["| " + " | ".join(RANGE_COLUMNS) + " |", "|" + "---|" * len(RANGE_COLUMNS)]
    for r in rows:
        label = r.budget if r.method == "remat" else r.method
        status = r.status if r.status == "ok" or r.status.startswith("refused") else r.status[:80]
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f} [{fmt(r.ratio_min)}, {fmt(r.ratio_max)}]"
        warned = ", ".join(x for x in ("budget" if _is_budget_warning(r) else "",
                                       "out of reach" if r.out_of_reach else "",
                                       ", ".join(dict.fromkeys(w.split(":")[0] for w in r.warned.split("; ")
                                                               if w and not w.startswith("RematBudgetWarning"))))
                           if x)
        out.append("| " + " | ".join((
            label, status, fmt(None if r.peak_bytes is None else r.peak_bytes / MiB), fmt(r.fraction, "{:.3f}"),
            fmt(r.predicted, "{:.3f}"), ratio, fmt(r.predicted_time), warned, fmt(r.first_ratio),
            fmt(r.first_s, "{:.1f}"), fmt(r.plan_s), fmt(r.grad_ref, "{:.1e}"), fmt(r.fd, "{:.1e}"),
            ",".join(r.solvers) if r.method in ("remat", NO_RECOMPUTE) else "")) + " |")
    return "\n".join(out)


def _dominates(a: Row, b: Row, tol: float = 1e-3) -> bool:
    """``a``'s plan beats ``b``'s on both predicted peak and predicted time (each by more than
    ``tol``, a share)."""
    return (a.predicted < b.predicted * (1 - tol) - 1e-9 and a.predicted_time < b.predicted_time * (1 - tol))


def range_checks(rows: list[Row], max_overhead: float | None = 0.1, *, peak_tol: float = RANGE_PEAK_TOL,
                 time_tol: float = RANGE_TIME_TOL) -> list[str]:
    """Issue 39's item 3 on one model's rows, one ``- <check>: yes`` or ``- <check>: NO: ...``
    line each:

    - every fraction is met (measured <= f x the reference's measured peak, plus ``peak_tol``)
      or warned, with the least and its slowdown (the warning names the fraction reached and
      the predicted step time);
    - ``"min"`` is the least measured peak among remat's rows (within ``peak_tol``);
    - ``max_overhead``'s measured step ratio within ``time_tol`` of its bound ``1 + max_overhead``;
    - no plan runs that another row's plan beats on both predicted peak and predicted time;
    - out of reach (a budget warning), the row's measured step no slower than ``"min"``'s
      (within ``time_tol``);
    - measured peaks monotone in the fraction (asking for less never gives more, within
      ``peak_tol``).

    A check with nothing to judge says ``not measured``.

    >>> rows = [Row("m", REFERENCE, "-", peak_bytes=100, fraction=1.0, ratio=1.0),
    ...         Row("m", "remat", "0.8", 0.8, peak_bytes=80, fraction=0.8, ratio=1.0, predicted=0.8,
    ...             predicted_time=1.0),
    ...         Row("m", "remat", "0.6", 0.6, peak_bytes=60, fraction=0.6, ratio=1.1, predicted=0.6,
    ...             predicted_time=1.1),
    ...         Row("m", "remat", "min", peak_bytes=50, fraction=0.5, ratio=1.2, predicted=0.5, predicted_time=1.2)]
    >>> [line.split(":")[1].strip()[:3] for line in range_checks(rows, None)]
    ['yes', 'yes', 'not', 'yes', 'not', 'yes']
    """
    ok = [r for r in rows if r.method == "remat" and r.status == "ok" and r.peak_bytes is not None]
    by_budget = {r.budget: r for r in ok}
    least = by_budget.get("min")
    lines = []

    missed, warned, bad_warning = [], [], []
    for r in rows:
        if r.method != "remat" or r.asked is None:
            continue
        if r.status != "ok" or r.fraction is None:
            missed.append(f"{r.budget}: {r.status}")
            continue
        if r.fraction <= r.asked * (1 + peak_tol):
            continue
        if _is_budget_warning(r) or r.out_of_reach:
            warned.append(f"{r.budget} -> {r.fraction:.3f} at {fmt(r.ratio)}x")
            text = r.budget_warning
            if not text:
                bad_warning.append(f"{r.budget} (out of reach, no warning recorded)")
            elif "least memory" not in text or "predicted" not in text:
                bad_warning.append(f"{r.budget} (the warning names no least or no slowdown)")
        else:
            missed.append(f"{r.budget} -> {r.fraction:.3f} (predicted {fmt(r.predicted, '{:.3f}')}), not warned")
    text = "yes" if not missed and not bad_warning else "NO: " + "; ".join(missed + bad_warning)
    if warned:
        text += f" (warned: {', '.join(warned)})"
    lines.append(f"- every fraction met (<= f x torch.compile's peak, +{peak_tol:.0%}) or warned: {text}")

    if least is None:
        lines.append("- min the least among remat's rows: not measured")
    else:
        below = [f"{r.budget} {r.fraction:.3f}" for r in ok
                 if r is not least and r.peak_bytes * (1 + peak_tol) < least.peak_bytes]
        lines.append(f"- min the least among remat's rows (min {fmt(least.fraction, '{:.3f}')}): "
                     + ("yes" if not below else "NO: less at " + ", ".join(below)))

    over = next((r for r in ok if r.budget.startswith("overhead")), None)
    if over is None or over.ratio is None or max_overhead is None:
        lines.append("- max_overhead's step within 5% of its bound: not measured")
    else:
        bound = 1 + max_overhead
        verdict = "yes" if over.ratio <= bound * (1 + time_tol) else "NO"
        lines.append(f"- max_overhead {max_overhead:g}'s measured step <= {bound:g} x (1 + {time_tol:.0%}): "
                     f"{verdict} ({over.ratio:.2f} [{fmt(over.ratio_min)}, {fmt(over.ratio_max)}], predicted "
                     f"{fmt(over.predicted_time)}, fraction {fmt(over.fraction, '{:.3f}')})")

    judged = [r for r in ok if r.predicted is not None and r.predicted_time is not None]
    dominated = []
    for r in judged:
        better = [o for o in judged if o is not r and _dominates(o, r)]
        if better:
            o = min(better, key=lambda o: o.predicted)
            dominated.append(f"{r.budget} ({r.predicted:.3f}, {r.predicted_time:.2f}x) by {o.budget} "
                             f"({o.predicted:.3f}, {o.predicted_time:.2f}x)")
    lines.append("- no plan run that another row's beats on predicted peak and time: "
                 + ("not measured" if len(judged) < 2 else "yes" if not dominated else "NO: " + "; ".join(dominated)))

    reach = [r for r in ok if r.asked is not None and (r.out_of_reach or _is_budget_warning(r))]
    if not reach or least is None or least.ratio is None:
        lines.append("- out of reach no slower than min: not measured" + ("" if reach else " (nothing out of reach)"))
    else:
        slow = [f"{r.budget} {r.ratio:.2f}x" + (" (min's plan by prediction: timing noise)"
                                                 if (r.predicted, r.predicted_time) == (least.predicted,
                                                                                        least.predicted_time) else "")
                for r in reach if r.ratio is not None and r.ratio > least.ratio * (1 + time_tol)]
        lines.append(f"- out of reach no slower than min ({least.ratio:.2f}x, +{time_tol:.0%}): "
                     + ("yes" if not slow else "NO: " + ", ".join(slow))
                     + f" ({', '.join(f'{r.budget} {fmt(r.ratio)}x' for r in reach)})")

    fr = sorted((r for r in ok if r.asked is not None), key=lambda r: -r.asked)
    rises = [f"{a.budget} {a.fraction:.3f} -> {b.budget} {b.fraction:.3f}" for a, b in zip(fr, fr[1:])
             if b.peak_bytes > a.peak_bytes * (1 + peak_tol)]
    lines.append(f"- measured peak monotone in the fraction (+{peak_tol:.0%}): "
                 + ("not measured" if len(fr) < 2 else "yes" if not rises else "NO: " + "; ".join(rises)))
    return lines


def range_summary(rows_by_model: dict[str, list[Row]], fractions: list[float]) -> str:
    """One Markdown row per model: each fraction's measured fraction (step ratio), ``*`` where
    remat warned, then ``min``, ``max_overhead``, and the first-call ratios (least, greatest)."""
    labels = [f"{f:g}" for f in fractions]
    head = ["model"] + labels + ["min", "max_overhead", "first-call ratio [least, greatest]"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in rows_by_model.items():
        remat_rows = {r.budget: r for r in rows if r.method == "remat"}

        def cell_of(r: Row | None) -> str:
            if r is None:
                return "-"
            if r.status != "ok" or r.fraction is None:
                return r.status[:30]
            star = "*" if r.asked is not None and (_is_budget_warning(r) or r.out_of_reach) else ""
            return f"{r.fraction:.2f}{star} ({fmt(r.ratio)}x)"

        over = next((r for b, r in remat_rows.items() if b.startswith("overhead")), None)
        firsts = [r.first_ratio for r in rows if r.method == "remat" and r.first_ratio is not None]
        first = f"{min(firsts):.2f} .. {max(firsts):.2f}" if firsts else "-"
        out.append("| " + " | ".join([name] + [cell_of(remat_rows.get(b)) for b in labels]
                                     + [cell_of(remat_rows.get("min")), cell_of(over), first]) + " |")
    return "\n".join(out)


def warm_up(compiler: str) -> None:
    """One plain torch.compile and one remat.compile of a tiny module, so that neither the first
    model's reference nor its remat rows pay the process's one-time imports in their first call."""
    import remat

    lin = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(4, 8)
    for fn in (plain_compile(copy.deepcopy(lin), compiler),
               remat.compile(copy.deepcopy(lin), compiler=compiler, cache=False, dynamic=False),
               remat.compile(copy.deepcopy(lin), compiler=compiler, cache=False, dynamic=False, budget=0.5)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(x).sum().backward()
