"""remat's budgets against PyTorch's knob (``activation_memory_budget``, its ``dp`` solver), side by side.

Issue 10, "What it must show": on GPT-2, Llama, T5 (transformers configs, small sizes) and a
CNN with BatchNorm, for budgets 1.0, 0.8, 0.6, 0.4, 0.2: measured peak, predicted peak,
step-time ratio to no-recompute and planning time, for remat and for PyTorch's knob.

Every method runs on its own copy of the same model and inputs, through the same compiler
(``--compiler eager``: AOTAutograd with inductor's decompositions and partitioner hook, no
kernel codegen; ``inductor``: real kernels):

- ``no-recompute``: ``remat.compile(model, solver="no-recompute")`` (PyTorch's
  ``default_partition``), the reference of every ratio and fraction;
- ``eager``: plain autograd, no compile (for scale);
- ``remat`` at budget ``none``: ``remat.compile(model)`` (no budget), and at each budget B:
  ``remat.compile(model, budget=B)`` (solver ``auto``); at ``min``: ``budget="min"``;
- ``knob``: PyTorch's own partitioner (``min_cut_rematerialization_partition``, what
  ``torch.compile`` runs; here through ``remat.compile(model, solver="torch-mincut")`` so that
  it uses the same compiler) with ``torch._functorch.config.activation_memory_budget = B`` and
  ``activation_memory_budget_solver = "dp"`` while it compiles. B = 1.0 is ``torch.compile``'s
  default;
- ``remat @ torch's peak``: remat at the fraction the knob *measured* at budget B (the issue:
  "at a fraction equal to the peak PyTorch's knob reaches, remat is always feasible").

Measurement (``remat.bench.measure``): gradients stay allocated between steps (each step zeroes
them in place, as ``opt.zero_grad(set_to_none=False)``; ``--grads none`` sets them to None
instead); the peak is the step's peak above the memory resident at its start (profiler
allocation records on a CPU, the CUDA allocator on a GPU). The *measured activation fraction*
of a method is its peak above start / that of no-recompute, which is what remat's fraction
means (the peak above the inputs and parameters; the gradients the backward allocates are part
of it, with or without gradients kept: kept ones are resident at the start). The *predicted
fraction* comes from
the method's plans (remat's, and the Plans remat reports for PyTorch's partitioners):
``(plan.peak_bytes - resident_bytes(g)) / activation_bytes(g)`` (``remat.plans.budget``), summed
over graphs when a step has several. Step times: one alternating loop over all methods of a
model (``remat.bench.measure.step_time``); the ratio to no-recompute is taken per round and
reported as median [min, max]. Planning: remat's ``plan.solve_seconds`` (``plan s``); for the
knob, the seconds in ``min_cut_rematerialization_partition`` (its partition, the dp solver
included); ``part s`` in the JSON is the whole partitioner call (capture, plan, lowering).
``compile s``: the first call minus the median steady step. Plans are not served from remat's
cache (``cache=False``, ``REMAT_CACHE_DIR=off``) and inductor's caches are off
(``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``). Gradients of every method are compared once with
plain autograd (max abs difference after one step from the same weights).

    python benchmarks/budgets_vs_torch.py [--quick] [--models gpt2,llama,t5,cnn]
        [--budgets 1.0,0.8,0.6,0.4,0.2] [--repeats 5] [--compiler eager|inductor]
        [--device cpu|cuda] [--dtype float32] [--out out/budgets_vs_torch]

Writes ``benchmarks/results/budgets_vs_torch.json`` (every row, and the run's settings;
``--results``), and ``--out``/``rows.jsonl`` (rows as they come) and ``pareto_<model>.png``
(measured peak above start against step-time ratio, one series per method); prints a Markdown
table per model with the targets' checks under it.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import contextlib  # noqa: E402
import copy  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
import torch._dynamo.config as dynamo_config  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
import torch._functorch.partitioners as torch_partitioners  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
from torch import nn  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import error_status, free_memory, peak_memory, step_time  # noqa: E402
from remat.lower.partitioner import RematPartitioner  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.bench.harness import MiB, Run, copy_inputs, fmt as _f, gradient_bytes, grad_err, held, make_step  # noqa: E402
from remat.zoo.trials import BUDGET_SIZES, Case, budget_case  # noqa: E402

DEFAULT_BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2)
QUICK_BUDGETS = (1.0, 0.6, 0.2)
DEFAULT_MODELS = ("gpt2", "llama", "t5", "cnn")
QUICK_MODELS = ("gpt2", "cnn")
AT_PEAK = "remat @ torch's peak"
PEAK_TOL = 0.01  # measured peaks within 1% count as equal (monotonicity, "same peak")

# -- clocks around the partitioners -------------------------------------------------------------
# PyTorch's partitioners are looked up on their module at each call (remat.capture.joint), and
# remat's partitioner is called as an object: wrapping them here times the partition itself.

CLOCK = {"torch_partition": 0.0, "partitioner": 0.0}


def _clocked(fn: Callable, key: str) -> Callable:
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            CLOCK[key] += time.perf_counter() - t0

    return timed


def _install_clocks() -> None:
    """Wrap the partitioners in the clocks (once, when a run starts: importing this script, as
    the tests do, changes nothing)."""
    if getattr(RematPartitioner.__call__, "_clocked", False):
        return
    torch_partitioners.min_cut_rematerialization_partition = _clocked(
        torch_partitioners.min_cut_rematerialization_partition, "torch_partition")
    torch_partitioners.default_partition = _clocked(torch_partitioners.default_partition, "torch_partition")
    RematPartitioner.__call__ = _clocked(RematPartitioner.__call__, "partitioner")
    RematPartitioner.__call__._clocked = True


# -- one method on one model ----------------------------------------------------------------------

@dataclass
class Row:
    model: str
    method: str  # eager, no-recompute, remat, knob, remat @ torch's peak
    budget: str  # "-", "none", "min", or the fraction asked for
    status: str = "ok"  # ok, infeasible, error: ...
    peak_bytes: int | None = None  # measured peak above the step's start
    fraction: float | None = None  # measured activation fraction (peak / no-recompute's peak)
    predicted_bytes: int | None = None  # plans' peak above resident_bytes
    predicted_fraction: float | None = None  # predicted_bytes / activation_bytes
    smallest_feasible_fraction: float | None = None  # infeasible: the smallest feasible budget, as a fraction
    smallest_feasible_bytes: int | None = None
    step_ms: float | None = None  # median step
    ratio: float | None = None  # step-time ratio to no-recompute (median over rounds)
    ratio_min: float | None = None
    ratio_max: float | None = None
    plan_s: float | None = None  # remat: sum of plan.solve_seconds; knob: its partition's seconds
    partitioner_s: float | None = None  # the whole partitioner call(s)
    compile_s: float | None = None  # first call minus the median steady step
    first_s: float | None = None
    grad_err: float | None = None  # max |grad - eager grad|
    graphs: int | None = None
    solvers: list[str] = field(default_factory=list)  # the solver that made each graph's plan
    recomputed: int | None = None
    asked: float | None = None  # remat @ torch's peak: the fraction asked for
    note: str = ""


def predicted(plans: list) -> tuple[int | None, float | None]:
    """(bytes above what is resident, fraction of the activation memory) the plans predict;
    summed over graphs when a step has several."""
    if not plans or any(p.graph is None or p.peak_bytes is None for p in plans):
        return None, None
    above = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    act = sum(activation_bytes(p.graph) for p in plans)
    return above, above / act


def run_variant(case: Case, method: str, budget: Any, args, reference: list, reference_graph: list) -> Run:
    """Compile (first call), check gradients and measure the peak of one method."""
    label = "-" if budget is None and method in ("eager", "no-recompute") else \
        ("none" if budget is None else (budget if isinstance(budget, str) else f"{budget:.3g}"))
    row = Row(case.name, method, label)
    v = Run(row)
    model = copy.deepcopy(case.model)
    inputs = copy_inputs(case.inputs)
    v.model = model
    plans: list = []
    v.plans = plans
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    common = dict(compiler=args.compiler, cache=False, dynamic=False, on_plan=lambda g, p: plans.append(p))
    if args.time_limit is not None:
        common["time_limit"] = args.time_limit
    if method == "eager":
        fn: Callable = model
    elif method == "no-recompute":
        fn = remat.compile(model, solver="no-recompute", **common)
    elif method == "knob":
        fn = remat.compile(model, solver="torch-mincut", **common)
        ctx = functorch_config.patch(activation_memory_budget=float(budget),
                                     activation_memory_budget_solver="dp")
    else:  # remat, remat @ torch's peak
        fn = remat.compile(model, budget=budget, **common)
    step = make_step(fn, model, inputs, args.grads)
    for k in CLOCK:
        CLOCK[k] = 0.0
    t0 = time.perf_counter()
    try:
        with ctx, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
    except remat.InfeasibleBudgetError as e:
        row.status = "infeasible"
        row.smallest_feasible_bytes = e.smallest_feasible
        g = getattr(getattr(e, "plan", None), "graph", None) or (reference_graph[0] if reference_graph else None)
        if e.smallest_feasible is not None and g is not None:
            row.smallest_feasible_fraction = (e.smallest_feasible - resident_bytes(g)) / activation_bytes(g)
        row.note = str(e).splitlines()[0][:300]
        return v
    except Exception as e:  # noqa: BLE001 - recorded; the other methods go on
        row.status = error_status(e)
        row.note = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-1500:]
        print(f"  {case.name} {method} {label}: {row.status}", file=sys.stderr, flush=True)
        return v
    row.first_s = time.perf_counter() - t0
    fallbacks = [str(w.message).splitlines()[0][:200] for w in caught
                 if issubclass(w.category, remat.RematFallbackWarning)]
    if fallbacks:
        row.note = "fell back: " + "; ".join(dict.fromkeys(fallbacks))
    if method != "eager":
        row.partitioner_s = CLOCK["partitioner"]
        row.plan_s = CLOCK["torch_partition"] if method in ("knob", "no-recompute") else \
            float(sum(p.solve_seconds for p in plans))
    row.grad_err = grad_err(model, reference)
    row.graphs = len(plans) if method != "eager" else None
    row.solvers = [p.solver for p in plans]
    row.recomputed = sum(len(p.recomputed) for p in plans) if plans else None
    row.predicted_bytes, row.predicted_fraction = predicted(plans)
    if plans and not reference_graph:
        reference_graph.append(plans[0].graph)
    n_plans = len(plans)
    try:
        pm = peak_memory(step, args.device, warmup=1, timeline=False, held=held(model, inputs))
        row.peak_bytes = int(pm.peak_bytes)
    except Exception as e:  # noqa: BLE001
        row.status = error_status(e)
        return v
    if len(plans) != n_plans:
        row.note = (row.note + "; " if row.note else "") + f"recompiled after the first call ({len(plans)} plans)"
    v.step = step
    return v


# -- one model ----------------------------------------------------------------------------------

def run_model(name: str, args) -> tuple[Case, list[Row]]:
    size = args.size
    case = budget_case(name, size, getattr(torch, args.dtype), args.device)
    print(f"\n### {case.description}\n", flush=True)
    print(f"({sum(p.numel() for p in case.model.parameters()) / 1e6:.2f} M parameters)", flush=True)
    # plain autograd's gradients: the reference
    ref_model = copy.deepcopy(case.model)
    ref_model(*copy_inputs(case.inputs)).backward()
    reference = [None if p.grad is None else p.grad.detach().clone() for p in ref_model.parameters()]
    del ref_model
    reference_graph: list = []
    variants: list[Run] = []

    def add(method, budget=None):
        t0 = time.perf_counter()
        v = run_variant(case, method, budget, args, reference, reference_graph)
        variants.append(v)
        r = v.row
        if args.partial is not None:  # every row as it comes: a run cut short keeps what it measured
            with open(args.partial, "a") as f:
                f.write(json.dumps(asdict(r), default=str) + "\n")
        peak = f"{r.peak_bytes / MiB:.2f} MiB" if r.peak_bytes is not None else "-"
        print(f"  {method:>21} {r.budget:>5}: {r.status:<10} peak {peak:>11}  "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        return v

    base = add("no-recompute")
    if "eager" not in args.skip:
        add("eager")
    add("remat")
    for b in args.budgets:
        add("knob", b)
    for b in args.budgets:
        add("remat", b)
    if "min" not in args.skip:
        add("remat", "min")
    ref_peak = base.row.peak_bytes
    grads = gradient_bytes(base.model) if base.model is not None and args.grads == "keep" else 0

    def fractions(row: Row) -> None:
        if ref_peak and row.peak_bytes is not None:
            row.fraction = row.peak_bytes / ref_peak

    for v in variants:
        fractions(v.row)
    # remat at the fraction the knob measured
    copies: list[tuple[Run, Run]] = []  # (a row that reuses a run, that run)
    if args.at_torch_peak != "none" and ref_peak:
        done: dict[float, Run] = {}
        kinds = ((AT_PEAK, "fraction"),)
        for method, attr in kinds:
            for b in args.budgets:
                knob = _find(variants, "knob", b)
                rm = _find(variants, "remat", b)
                if knob is None or getattr(knob.row, attr) is None:
                    continue
                if args.at_torch_peak == "infeasible" and rm is not None and rm.row.status == "ok":
                    continue
                f = min(1.0, round(getattr(knob.row, attr), 4))
                if f <= 0:
                    continue
                if f in done:
                    src = done[f].row
                    row = copy.copy(src)
                    row.method, row.budget = method, f"{b:.3g}"
                    row.note = (src.note + "; " if src.note else "") + \
                        f"same run as {src.method} at budget {src.budget}"
                    variants.append(Run(row))
                    copies.append((variants[-1], done[f]))
                    continue
                v = add(method, f)
                v.row.budget = f"{b:.3g}"
                v.row.asked = f
                fractions(v.row)
                done[f] = v
    # step times, every method in one alternating loop
    steps = {f"{v.row.method}|{v.row.budget}|{i}": v.step for i, v in enumerate(variants) if v.step is not None}
    base_key = next(k for k in steps if k.startswith("no-recompute|")) if base.step is not None else None
    if steps and base_key is not None:
        times = step_time(steps, repeats=args.repeats, warmup=2, device=args.device)
        b_samples = times[base_key].samples
        for i, v in enumerate(variants):
            key = f"{v.row.method}|{v.row.budget}|{i}"
            if key not in times:
                continue
            t = times[key]
            if t.error:
                v.row.status = t.error
                continue
            v.row.step_ms = t.median_s * 1e3
            n = min(len(t.samples), len(b_samples))
            if n:
                ratios = [a / b for a, b in zip(t.samples[:n], b_samples[:n])]
                v.row.ratio = statistics.median(ratios)
                v.row.ratio_min, v.row.ratio_max = min(ratios), max(ratios)
            if v.row.first_s is not None and v.row.method != "eager":
                v.row.compile_s = max(0.0, v.row.first_s - t.median_s)
        # copies of a shared run take its numbers
        for v, src in copies:
            for k in ("status", "step_ms", "ratio", "ratio_min", "ratio_max", "compile_s"):
                setattr(v.row, k, getattr(src.row, k))
    rows = [v.row for v in variants]
    case.gradient_bytes = grads
    variants.clear()
    steps.clear()
    free_memory(args.device)
    gc.collect()
    return case, rows


def _find(variants, method, budget) -> Run | None:
    label = f"{budget:.3g}" if isinstance(budget, float) else str(budget)
    return next((v for v in variants if v.row.method == method and v.row.budget == label), None)


# -- report -------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    out = ["| method | budget | status | peak above start (MiB) | measured fraction "
           "| predicted fraction | step ratio median [min, max] | plan s | compile s | grad max err | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r.status
        if r.status == "infeasible":
            status = f"infeasible (smallest {_f(r.smallest_feasible_fraction)})"
        elif r.method.startswith(AT_PEAK) and r.asked is not None:
            status = f"{r.status} (asked {r.asked:.3f})"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f} [{r.ratio_min:.2f}, {r.ratio_max:.2f}]"
        solvers = ",".join(dict.fromkeys(r.solvers)) if r.method.startswith("remat") else ""
        note = "; ".join(x for x in (solvers, r.note[:120] if r.status == "ok" else "") if x)
        out.append(f"| {r.method} | {r.budget} | {status} | {_f(None if r.peak_bytes is None else r.peak_bytes / MiB)} "
                   f"| {_f(r.fraction)} | {_f(r.predicted_fraction)} | {ratio} | {_f(r.plan_s)} "
                   f"| {_f(r.compile_s, '{:.1f}')} | {_f(r.grad_err, '{:.1e}')} | {note} |")
    return "\n".join(out)


def _budget_value(r: Row) -> float | None:
    try:
        return float(r.budget)
    except ValueError:
        return None


def checks(rows: list[Row]) -> list[str]:
    """The issue's targets, checked on one model's rows."""
    lines = []
    by = lambda m: {r.budget: r for r in rows if r.method == m}  # noqa: E731
    remat_rows, knob_rows = by("remat"), by("knob")
    budgets = [b for b in knob_rows if _budget_value(knob_rows[b]) is not None]
    # feasible wherever the knob runs
    missing = [b for b in budgets if knob_rows[b].status == "ok" and
               (b not in remat_rows or remat_rows[b].status != "ok")]
    lines.append(f"- remat feasible at every budget the knob runs (same number): "
                 f"{'yes' if not missing else 'no, infeasible at ' + ', '.join(missing)}")
    for method in (AT_PEAK,):
        at_rows = by(method)
        if not at_rows:
            continue
        at_missing = [b for b in budgets if knob_rows[b].status == "ok" and b in at_rows
                      and at_rows[b].status != "ok"]
        # at the same measured peak, no slower
        cmp = []
        for b in budgets:
            k, a = knob_rows[b], at_rows.get(b)
            if k.status != "ok" or a is None or a.status != "ok" or a.ratio is None or k.ratio is None:
                continue
            peak_ok = a.peak_bytes <= k.peak_bytes * (1 + PEAK_TOL)
            time_ok = "ok" if a.ratio <= k.ratio else ("within noise" if a.ratio_min <= k.ratio_max else "SLOWER")
            cmp.append(f"{b}: peak {a.fraction:.2f} vs {k.fraction:.2f} ({'ok' if peak_ok else 'HIGHER'}), "
                       f"time {a.ratio:.2f} vs {k.ratio:.2f} ({time_ok})")
        lines.append(f"- {method}: feasible at every knob fraction: "
                     f"{'yes' if not at_missing else 'no, infeasible at ' + ', '.join(at_missing)}"
                     + ("; vs knob (measured fraction, step ratio): " + "; ".join(cmp) if cmp else ""))
    # a knob point dominated by any remat point (peak within 1%, median ratio no higher)
    rem_pts = [r for r in rows if r.method.startswith("remat") and r.status == "ok" and r.ratio is not None]
    dom = []
    for b in budgets:
        k = knob_rows[b]
        if k.status != "ok" or k.ratio is None:
            continue
        best = [r for r in rem_pts if r.peak_bytes <= k.peak_bytes * (1 + PEAK_TOL)]
        if not best:
            dom.append(f"{b}: no remat point at or below its peak")
            continue
        r = min(best, key=lambda r: r.ratio)
        verdict = "ok" if r.ratio <= k.ratio else ("within noise" if r.ratio_min <= k.ratio_max else "SLOWER")
        dom.append(f"{b}: fastest remat at or below its peak {r.ratio:.2f} ({r.method} {r.budget}) "
                   f"vs knob {k.ratio:.2f}: {verdict}")
    if dom:
        lines.append("- at the knob's peak, remat's step no slower: " + "; ".join(dom))
    # lower peak at 0.2
    low = [b for b in budgets if abs(float(b) - 0.2) < 1e-9]
    if low:
        b = low[0]
        k, r = knob_rows[b], remat_rows.get(b)
        mn = next((x for x in rows if x.method == "remat" and x.budget == "min"), None)
        parts = []
        if r is not None and r.status == "ok" and k.status == "ok":
            parts.append(f"remat 0.2 {r.fraction:.2f} vs knob 0.2 {k.fraction:.2f} "
                         f"({'lower' if r.peak_bytes < k.peak_bytes else 'NOT lower'})")
        if mn is not None and mn.status == "ok" and k.status == "ok":
            parts.append(f"remat min {mn.fraction:.2f} ({'lower' if mn.peak_bytes < k.peak_bytes else 'NOT lower'})")
        if r is not None and r.status != "ok":
            parts.append(f"remat 0.2: {r.status}")
        lines.append("- lower peak than the knob at 0.2: " + ("; ".join(parts) or "not measured"))
    # monotone
    for m, rs in (("remat", remat_rows), ("knob", knob_rows)):
        pts = sorted(((_budget_value(r), r.peak_bytes) for r in rs.values()
                      if _budget_value(r) is not None and r.status == "ok" and r.peak_bytes is not None))
        bad = [f"{b1:g} -> {p1 / MiB:.2f} MiB > {b2:g} -> {p2 / MiB:.2f} MiB"
               for (b1, p1), (b2, p2) in zip(pts, pts[1:]) if p1 > p2 * (1 + PEAK_TOL)]
        lines.append(f"- {m}: measured peak non-decreasing in the budget (1% tolerance): "
                     f"{'yes' if not bad else 'NO: ' + '; '.join(bad)}")
    return lines


def pareto_plot(name: str, description: str, rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    # budget sweeps joined in budget order ("min" first, "none" last); remat at the knob's
    # peaks as points, labelled by the knob's budget they match
    order = {"min": -1.0, "none": 2.0}
    series = [("knob", "tab:red", "s", "-", True), ("remat", "tab:blue", "o", "-", True),
              (AT_PEAK, "tab:cyan", "^", "", False)]
    for method, color, marker, ls, label_points in series:
        pts = [r for r in rows if r.method == method and r.status == "ok" and r.ratio is not None
               and (_budget_value(r) is not None or r.budget in order)]
        pts = list({(r.peak_bytes, r.ratio): r for r in pts}.values()) if not label_points else pts
        if not pts:
            continue
        pts.sort(key=lambda r: _budget_value(r) if _budget_value(r) is not None else order[r.budget])
        xs = [r.ratio for r in pts]
        ys = [r.peak_bytes / MiB for r in pts]
        err = [[r.ratio - r.ratio_min for r in pts], [r.ratio_max - r.ratio for r in pts]]
        ax.errorbar(xs, ys, xerr=err, color=color, marker=marker, ls=ls or "none", capsize=3, lw=1,
                    elinewidth=0.8, alpha=0.9, label=method)
        if label_points:
            for r, x, y in zip(pts, xs, ys):
                ax.annotate(r.budget, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    for method, color, marker in (("no-recompute", "black", "D"), ("eager", "gray", "x")):
        r = next((r for r in rows if r.method == method and r.status == "ok" and r.ratio is not None), None)
        if r is not None:
            ax.plot([r.ratio], [r.peak_bytes / MiB], color=color, marker=marker, ls="", label=method)
    ax.set_xlabel("step time / no-recompute (median over rounds; bars: min-max)")
    ax.set_ylabel("measured peak above the step's start (MiB)")
    ax.set_title(f"{description}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------

def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def arguments(ap) -> None:
    ap.add_argument("--quick", action="store_true", help="smoke run: GPT-2 and the CNN, smaller, budgets 1.0,0.6,0.2")
    ap.add_argument("--models", default=None, help=f"comma-separated, of {','.join(BUDGET_SIZES)} "
                    f"(default {','.join(DEFAULT_MODELS)}; --quick: {','.join(QUICK_MODELS)})")
    ap.add_argument("--budgets", default=None, help="comma-separated fractions (default 1.0,0.8,0.6,0.4,0.2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds of the alternating loop")
    ap.add_argument("--compiler", default="eager", choices=("eager", "inductor"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    ap.set_defaults(threads=1)  # stable timings on a shared CPU
    ap.add_argument("--time-limit", type=float, default=None, help="remat's time_limit (default: remat's)")
    ap.add_argument("--grads", default="keep", choices=("keep", "none"),
                    help="keep: zero gradients in place between steps (set_to_none=False); none: set them to None")
    ap.add_argument("--at-torch-peak", default="all", choices=("all", "infeasible", "none"),
                    help="run remat at the knob's measured fraction at every budget, only where remat's "
                         "own budget was infeasible, or never")
    ap.add_argument("--size", default=None, choices=("default", "quick", "gpu"),
                    help="model sizes (default: 'quick' with --quick, else 'default'); 'gpu': GPT-2 small "
                         "and a Llama with Llama-3.2-1B's widths (4 of its 16 layers), batch 8 x 1024")
    ap.add_argument("--skip", default="", help="comma-separated rows to leave out: eager, min")
    ap.add_argument("--capture", action="store_true",
                    help="only capture: write each model's graphs (remat JSON) and the saved sets of "
                         "PyTorch's knob at each budget (plans JSON) under --out, for planning offline")
    ap.add_argument("--out", default="out/budgets_vs_torch", help="the plots, rows.jsonl and --capture's files")


def run(args):
    ap = args.parser
    _install_clocks()
    args.size = args.size or ("quick" if args.quick else "default")
    args.skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    if args.skip - {"eager", "min"}:
        ap.error(f"--skip takes eager and min, not {', '.join(sorted(args.skip - {'eager', 'min'}))}")
    for m in (args.models.split(",") if args.models else []):
        if m.strip() in BUDGET_SIZES and args.size not in BUDGET_SIZES[m.strip()]:
            ap.error(f"model {m!r} has no size {args.size!r}; its sizes: {', '.join(BUDGET_SIZES[m.strip()])}")
    args.models = [m.strip() for m in args.models.split(",")] if args.models else \
        list(QUICK_MODELS if args.quick else DEFAULT_MODELS)
    args.budgets = _floats(args.budgets) if args.budgets else list(QUICK_BUDGETS if args.quick else DEFAULT_BUDGETS)
    for m in args.models:
        if m not in BUDGET_SIZES:
            ap.error(f"unknown model {m!r}; models: {', '.join(BUDGET_SIZES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA GPU")
    dynamo_config.recompile_limit = 1024  # every method recompiles the same forward with its own backend
    dynamo_config.accumulated_recompile_limit = 1 << 16
    # every compile plans afresh: no FX-graph or AOTAutograd cache answers for a partitioner
    # (inductor's kernel caches may stay on, with TORCHINDUCTOR_FORCE_DISABLE_CACHES=0)
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.partial = out / "rows.jsonl"
    args.partial.write_text("")
    meta = {**harness.environment(args.device), "compiler": args.compiler, "dtype": args.dtype, "grads": args.grads,
            "repeats": args.repeats, "budgets": args.budgets, "models": args.models,
            "size": args.size, "sizes": {m: BUDGET_SIZES[m][args.size] for m in args.models}}
    print(f"torch {torch.__version__}, {meta['machine']}, compiler {args.compiler}, {args.dtype}, "
          f"device {args.device}, gradients {args.grads}, repeats {args.repeats}, budgets {args.budgets}", flush=True)
    if args.capture:
        for name in args.models:
            capture(name, args, out)
        return 0
    all_rows: list[dict] = []
    descriptions = {}
    t_start = time.perf_counter()
    for name in args.models:
        t0 = time.perf_counter()
        try:
            case, rows = run_model(name, args)
        except Exception as e:  # noqa: BLE001 - one model's failure does not stop the others
            print(f"{name}: {error_status(e)}\n{traceback.format_exc()[-2000:]}", flush=True)
            continue
        descriptions[name] = case.description
        print(f"gradients (kept between steps): {case.gradient_bytes / MiB:.2f} MiB; no-recompute's measured peak above start: "
              f"{next((r.peak_bytes for r in rows if r.method == 'no-recompute' and r.peak_bytes), 0) / MiB:.2f} MiB\n")
        print(table(rows))
        print()
        print("\n".join(checks(rows)))
        print(f"\n({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
        all_rows.extend(asdict(r) for r in rows)
        try:
            pareto_plot(name, case.description, rows, out / f"pareto_{name}.png")
        except Exception as e:  # noqa: BLE001
            print(f"plot for {name} failed: {error_status(e)}", flush=True)
        meta["descriptions"] = descriptions
        meta["seconds"] = time.perf_counter() - t_start
    print(f"\nwrote pareto_*.png under {out} ({time.perf_counter() - t_start:.0f} s in all)")
    return harness.Result(all_rows, meta, printed=True)


def capture(name: str, args, out: Path) -> None:
    """Write ``<name>_graph<k>.json`` (remat's graph JSON of each graph of the step) and
    ``<name>_knob.json`` (the plans of PyTorch's partitioner under its knob at each budget)."""
    from remat.graph.io import save_graph

    case = budget_case(name, args.size, getattr(torch, args.dtype), args.device)
    plans_by_budget = {}
    for b in [None] + list(args.budgets):
        ctx = contextlib.nullcontext() if b is None else functorch_config.patch(
            activation_memory_budget=float(b), activation_memory_budget_solver="dp")
        with ctx:
            plans = remat.plan_all(copy.deepcopy(case.model), *case.inputs, solver="torch-mincut", cache=False)
        plans_by_budget["none" if b is None else f"{b:g}"] = [p.to_dict() for p in plans]
        if b is None:
            for k, p in enumerate(plans):
                save_graph(p.graph, out / f"{name}_graph{k}.json")
            print(f"{name}: {len(plans)} graph(s), {[len(p.graph) for p in plans]} nodes", flush=True)
    (out / f"{name}_knob.json").write_text(json.dumps(plans_by_budget, default=str))


def main(argv: list[str] | None = None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
