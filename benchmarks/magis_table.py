"""MAGIS's evaluation (seeds/004 Table 2, Figures 9-10), scaled down to a CPU: least memory
within a latency limit, and overhead within a memory limit, for remat's methods side by side.

Workloads (MAGIS Table 2, seeds/004), scaled down so that a training
step takes well under a second on one CPU thread (default: 0.2-0.6 s compiled with
``--compiler eager``; ``--quick``: the zoo's ``tiny`` sizes, with batches raised so that
activations, not gradients, make most of the step's memory; 25-65 ms):

==========  ===========================================  ==============================================
model       default (``--size default``)                 ``--quick`` (``--size quick``)
==========  ===========================================  ==============================================
resnet50    zoo ``resnet50`` small: bottleneck blocks     zoo ``resnet50`` tiny: width 8, one bottleneck
            (3,4,6,3), width 16, 64x64 px, 100 classes,   block per stage, 32x32 px, 10 classes,
            batch 4 (paper: width 64, 224 px, batch 64)   batch 8
bert        zoo ``bert`` small: 4 layers x 256, 4 heads,  zoo ``bert`` tiny: 2 x 64, 4 heads, ff 256,
            ff 1024, vocab 2048, batch 4 x 128 tokens     vocab 256, batch 8 x 16 tokens
            (paper: BERT-base 12 x 768, batch 32 x 512)
vit         zoo ``vit`` small: 64x64 px, patch 8 (64      zoo ``vit`` tiny: 32x32 px, patch 8, 2 x 64,
            tokens), 4 x 256, 4 heads, 100 classes,       10 classes, batch 8
            batch 8 (paper: ViT-base, 224 px, batch 64)
unet        zoo ``unet`` small: base 16, 4 levels,        zoo ``unet`` tiny: base 4, 2 levels, 32x32 px,
            64x64 px, 2 classes, batch 4 (paper: 256 px,  batch 4
            batch 32)
unetpp      nested U-Net (U-Net++-like, written here):    base 4, 2 levels, 32x32 px, batch 4
            base 8, 4 levels (channels 8..128), 64x64
            px, 2 classes, batch 2 (paper: U-Net++ 256
            px, batch 16)
gpt2        zoo ``gpt2`` small: 4 layers x 256, 4 heads,  zoo ``gpt2`` tiny: 2 x 64, 4 heads, vocab 256,
            vocab 2048, batch 4 x 128 tokens. GPT-2       batch 8 x 16 tokens
            stands in for GPT-Neo (both are decoder-only
            causal LMs of the same block structure;
            paper: GPT-Neo-1.3B, bf16, batch 32 x 512)
==========  ===========================================  ==============================================

BTLM-3B (Table 2's seventh workload) is left out: it is another decoder-only LM. The paper
runs on an RTX 3090 in tf32/bf16 and measures the whole peak (weights included) with
``torch.cuda.max_memory_allocated``; here everything is float32 on a CPU, and a peak is the
step's peak *above its start* (the memory of inputs, weights and kept gradients excluded), as
``benchmarks/budgets_vs_torch.py`` measures it.

Methods (each on its own deep copy of the same model and inputs, through the same compiler):

- ``no-recompute``: ``remat.compile(model, solver="no-recompute")`` (PyTorch's
  ``default_partition``: the step without recomputation); every ratio and fraction is to it;
- ``eager``: plain autograd, no compile (for scale only);
- ``no-recompute`` ``control``: a second copy of no-recompute, timed like every other run: its
  ratio to the first is the timing noise of the run (``--no-control`` leaves it out);
- ``magis``: ``remat.compile(model, solver="magis", budget=B)`` at the memory limits, and
  ``remat.compile(model, solver="magis", max_overhead=0.05 / 0.10)`` at the latency limits (the
  search's own mode: least memory within that *predicted* overhead; the table reports what it
  measured and whether the limit held);
- ``magis-nofission``: the same with ``solver_options={"fission": False}``;
- ``auto``: remat's fusion-aware budgeted planner, ``remat.compile(model, budget=B)``; for the
  latency limits a sweep of budgets (``SWEEP``) and the lowest measured peak whose measured
  step time is within the limit;
- ``checkmate``: ``remat.compile(model, solver="checkmate", budget=B)`` at the memory limits,
  where the graph has at most ``--checkmate-max-stages`` stages (default 500, else "too
  large": on this CPU the MILP returns a feasible incumbent within 30 s on the quick graphs of
  380-460 stages, and none on ViT's 709 stages at the default size); its latency-limit cells
  take the lowest peak of those two runs within the limit;
- ``torch-knob``: PyTorch's own partitioner with
  ``torch._functorch.config.activation_memory_budget = B`` (``dp`` solver), through
  ``remat.compile(model, solver="torch-mincut")`` while the config is patched; swept for the
  latency limits as ``auto`` (``min``: B = 0). The knob's B is *not* a fraction of the
  activation memory (it is one of the span between its least and its default saved set), so
  at the memory limits the row ``torch-knob (swept)`` adds the fastest sweep point whose
  *measured* fraction is within the limit.

Latency limits 5% / 10%: the lowest measured peak (fraction of no-recompute's) with a median
step-time ratio within 1.05 / 1.10. Memory limits 80% / 40%: the measured step-time overhead
at ``budget=0.8`` / ``0.4`` (remat's fraction: the peak above inputs and parameters, as a
share of the step's activation memory without recomputation), with the measured fraction
beside it, and the plan's own prediction (predicted seconds / no-recompute's predicted
seconds, and the predicted peak fraction).

Measurement (``remat.bench.measure``, as DESIGN.md "Measuring" asks): all methods of a model in
one process, same inputs; step times from one alternating loop (``step_time``), median of
``--repeats`` rounds after two warm-up rounds, the ratio to no-recompute taken per round
(median [min, max]; a timed sample runs a short step several times, at least
``--min-sample`` seconds of no-recompute's, so that one sample is not one scheduler tick); peaks from the profiler's allocation records (``peak_memory``), above the step's
start; gradients kept between steps (zeroed in place). ``cache=False``,
``REMAT_CACHE_DIR=off``, ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``. Every method's gradients
are compared once with plain autograd's (max abs difference). A method's failure is its
row's status (``InfeasibleBudgetError``: "infeasible" and the smallest feasible budget it
names; anything else: the error's type and first line); the others go on.

    python benchmarks/magis_table.py [--quick] [--models resnet50,bert,vit,unet,unetpp,gpt2]
        [--methods magis,magis-nofission,auto,checkmate,torch-knob] [--repeats 5]
        [--compiler eager|inductor] [--time-limit 30] [--out out/magis_table]

Prints one Markdown table per model and a summary against the paper's figures; writes
``benchmarks/results/magis_table.json`` (every run; the table cells and the settings in its
meta; after each model, so a run cut short keeps what it measured), and ``--out``/``tables.md``
and ``rows.jsonl`` (rows as they come).
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import contextlib  # noqa: E402
import copy  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
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
import torch._inductor.config as inductor_config  # noqa: E402
from torch import nn  # noqa: E402

import remat  # noqa: E402
from remat.bench.measure import error_status, free_memory, peak_memory, step_time  # noqa: E402
from remat.plans.budget import activation_bytes, resident_bytes  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.bench.harness import MiB, Run, copy_inputs, fmt as _f, grad_err, gradient_bytes, held, make_step  # noqa: E402
from remat.zoo.trials import MAGIS_SIZES, Case, magis_case  # noqa: E402

MODELS = ("resnet50", "bert", "vit", "unet", "unetpp", "gpt2")
METHODS = ("magis", "magis-nofission", "auto", "checkmate", "torch-knob")
LATENCY_LIMITS = (0.05, 0.10)  # extra step time
MEMORY_LIMITS = (0.8, 0.4)  # fractions of the activation memory
SWEEP = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, "min")
QUICK_SWEEP = (1.0, 0.8, 0.6, 0.4, 0.2, "min")
SWEPT = ("auto", "torch-knob")
PAPER = {"latency10": (0.15, 0.60), "latency5": (0.25, 0.70), "memory80": 0.05, "memory40": 0.15}


# -- one method at one point ----------------------------------------------------------------------

@dataclass
class Row:
    model: str
    method: str  # no-recompute, eager, magis, magis-nofission, auto, checkmate, torch-knob
    point: str  # "-", a budget ("0.8", "min") or a latency limit ("+5%")
    mode: str = "-"  # "budget", "overhead" or "-"
    status: str = "ok"  # ok, infeasible, too large, error: ...
    peak_bytes: int | None = None  # measured peak above the step's start
    fraction: float | None = None  # peak_bytes / no-recompute's
    predicted_fraction: float | None = None  # (plans' peak - resident) / activation bytes
    predicted_ratio: float | None = None  # plans' predicted seconds / no-recompute's plans'
    smallest_feasible_fraction: float | None = None  # infeasible: the smallest feasible budget
    step_ms: float | None = None
    ratio: float | None = None  # step time / no-recompute's (median over rounds)
    ratio_min: float | None = None
    ratio_max: float | None = None
    plan_s: float | None = None  # sum of the plans' solve_seconds (torch-knob: None)
    compile_s: float | None = None  # first call minus the median steady step
    first_s: float | None = None
    grad_err: float | None = None  # max |grad - plain autograd's grad|
    graphs: int | None = None
    solvers: list[str] = field(default_factory=list)
    plan_status: list[str] = field(default_factory=list)
    recomputes: int | None = None  # the plans' recomputations (simulator's count)
    fissions: int | None = None  # fissions the plans apply (plan.fissions)
    offloads: int | None = None  # values the plans offload to host memory
    search: dict | None = None  # magis: details["search"] (fission candidates, states expanded, seen)
    note: str = ""


def _label(method: str, mode: str, value: Any) -> str:
    if mode == "control":
        return "control"
    if mode == "overhead":
        return f"+{value * 100:g}%"
    if mode == "budget":
        return value if isinstance(value, str) else f"{value:g}"
    return "-"


class Reference:
    """What every row of a model is measured against: plain autograd's gradients, and
    no-recompute's plans (graphs, predicted seconds) once it has run."""

    def __init__(self, grads: list):
        self.grads = grads
        self.plans: list = []

    @property
    def seconds(self) -> float | None:
        s = [p.predicted_seconds for p in self.plans]
        return float(sum(s)) if s and all(x is not None for x in s) else None

    def stages(self) -> int | None:
        from remat.plans.stages import staged

        if not self.plans or any(p.graph is None for p in self.plans):
            return None
        return max(staged(p.graph).n for p in self.plans)


def predicted(plans: list, ref: Reference) -> tuple[float | None, float | None]:
    """(predicted peak fraction, predicted time ratio) of a method's plans. The fraction is
    the plans' peak above what is resident over the activation memory of no-recompute's
    graphs (a plan with fissions runs on a rewritten graph; the scale stays the step's),
    summed over graphs when a step has several."""
    if not plans or any(p.graph is None or p.peak_bytes is None for p in plans):
        return None, None
    above = sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans)
    graphs = [p.graph for p in ref.plans] if len(ref.plans) == len(plans) else [p.graph for p in plans]
    frac = above / sum(activation_bytes(g) for g in graphs)
    secs = [p.predicted_seconds for p in plans]
    base = ref.seconds
    ratio = float(sum(secs)) / base if base and all(s is not None for s in secs) else None
    return frac, ratio


def _compile(method: str, mode: str, value: Any, model: nn.Module, common: dict):
    """(compiled callable, context to compile in) of one method at one point."""
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if method == "eager":
        return model, ctx
    if method == "no-recompute":
        return remat.compile(model, solver="no-recompute", **common), ctx
    if method == "auto":
        return remat.compile(model, budget=value, **common), ctx
    if method == "checkmate":
        return remat.compile(model, solver="checkmate", budget=value, **common), ctx
    if method in ("magis", "magis-nofission"):
        extra: dict = {"solver_options": {"fission": False}} if method == "magis-nofission" else {}
        if mode == "overhead":
            extra["max_overhead"] = value
        else:
            extra["budget"] = value
        return remat.compile(model, solver="magis", **extra, **common), ctx
    if method == "torch-knob":
        knob = 0.0 if value == "min" else float(value)
        ctx = functorch_config.patch(activation_memory_budget=knob, activation_memory_budget_solver="dp")
        return remat.compile(model, solver="torch-mincut", **common), ctx
    raise ValueError(f"unknown method {method!r}")


def run_variant(case: Case, method: str, mode: str, value: Any, args, ref: Reference) -> Run:
    """Compile (first call), check the gradients and measure the peak of one method at one point."""
    row = Row(case.name, method, _label(method, mode, value), mode)
    v = Run(row)
    if method == "checkmate":
        n = ref.stages()
        if n is not None and n > args.checkmate_max_stages:
            row.status = "too large"
            row.note = f"{n} stages > --checkmate-max-stages {args.checkmate_max_stages}"
            return v
    model = copy.deepcopy(case.model)
    inputs = copy_inputs(case.inputs)
    v.model = model
    plans: list = v.plans
    common = dict(compiler=args.compiler, cache=False, dynamic=False, time_limit=args.time_limit,
                  on_plan=lambda g, p: plans.append(p))
    try:
        fn, ctx = _compile(method, mode, value, model, common) if method != "eager" else (model, contextlib.nullcontext())
    except Exception as e:  # noqa: BLE001 - an option remat does not know yet, say
        row.status = error_status(e)
        row.note = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]
        return v
    step = make_step(fn, model, inputs, "keep")
    t0 = time.perf_counter()
    try:
        with ctx, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    except remat.InfeasibleBudgetError as e:
        row.status = "infeasible"
        # the scale of the step (a plan with fissions names a rewritten graph)
        g = ref.plans[0].graph if ref.plans else getattr(getattr(e, "plan", None), "graph", None)
        if e.smallest_feasible is not None and g is not None:
            row.smallest_feasible_fraction = (e.smallest_feasible - resident_bytes(g)) / activation_bytes(g)
        row.note = str(e).splitlines()[0][:300]
        return v
    except Exception as e:  # noqa: BLE001 - recorded; the other methods go on
        row.status = error_status(e)
        row.note = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
        print(f"  {case.name} {method} {row.point}: {row.status}\n{row.note}", file=sys.stderr, flush=True)
        return v
    row.first_s = time.perf_counter() - t0
    fallbacks = [str(w.message).splitlines()[0][:200] for w in caught
                 if issubclass(w.category, remat.RematFallbackWarning)]
    if fallbacks:
        row.note = "fell back: " + "; ".join(dict.fromkeys(fallbacks))
    row.grad_err = grad_err(model, ref.grads)
    if method != "eager":
        row.graphs = len(plans)
        row.solvers = [str(p.solver) for p in plans]
        row.plan_status = [str(p.status) for p in plans]
        if method != "torch-knob":
            row.plan_s = float(sum(p.solve_seconds or 0.0 for p in plans))
        rec = [p.recomputes for p in plans]
        row.recomputes = int(sum(rec)) if plans and all(r is not None for r in rec) else None
        row.fissions = sum(len(p.fissions) for p in plans)
        row.offloads = sum(len({s.node for s in (p.statements or ()) if s.op == "offload"}) for p in plans)
        searches = [p.details.get("search") for p in plans if isinstance(p.details.get("search"), dict)]
        if searches:
            row.search = {k: [x.get(k) for x in searches] for k in ("candidates", "expanded", "seen")}
        if method == "no-recompute" and mode != "control":
            ref.plans = list(plans)
        row.predicted_fraction, row.predicted_ratio = predicted(plans, ref)
    n_plans = len(plans)
    try:
        pm = peak_memory(step, "cpu", warmup=1, timeline=False, held=held(model, inputs))
        row.peak_bytes = int(pm.peak_bytes)
    except Exception as e:  # noqa: BLE001
        row.status = error_status(e)
        return v
    if len(plans) != n_plans:
        row.note = (row.note + "; " if row.note else "") + f"recompiled after the first call ({len(plans)} plans)"
    v.step = step
    return v


# -- one model ----------------------------------------------------------------------------------

def _repeated(step: Callable[[], Any], n: int) -> Callable[[], Any]:
    if n == 1:
        return step

    def run():
        for _ in range(n):
            out = step()
        return out

    return run


def points(method: str, args) -> list[tuple[str, Any]]:
    """(mode, value) of every run of a method."""
    if method in SWEPT:
        return [("budget", b) for b in args.sweep]
    if method == "checkmate":
        return [("budget", b) for b in MEMORY_LIMITS]
    if method in ("magis", "magis-nofission"):
        return [("budget", b) for b in MEMORY_LIMITS] + [("overhead", x) for x in LATENCY_LIMITS]
    raise ValueError(method)


def run_model(name: str, args) -> tuple[Case, list[Row]]:
    case = magis_case(name, args.size)
    print(f"\n{case.description} ({sum(p.numel() for p in case.model.parameters()) / 1e6:.2f} M parameters): "
          "running", file=sys.stderr, flush=True)
    ref_model = copy.deepcopy(case.model)
    ref_model(*copy_inputs(case.inputs)).backward()
    ref = Reference([None if p.grad is None else p.grad.detach().clone() for p in ref_model.parameters()])
    del ref_model
    variants: list[Run] = []

    def add(method: str, mode: str = "-", value: Any = None) -> Run:
        t0 = time.perf_counter()
        v = run_variant(case, method, mode, value, args, ref)
        variants.append(v)
        r = v.row
        with open(args.partial, "a") as f:
            f.write(json.dumps(asdict(r), default=str) + "\n")
        peak = f"{r.peak_bytes / MiB:.2f} MiB" if r.peak_bytes is not None else "-"
        print(f"  {method:>16} {r.point:>5}: {r.status[:60]:<14} peak {peak:>11}  "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        return v

    base = add("no-recompute")
    if base.row.status != "ok" or base.step is None:
        raise RuntimeError(f"no-recompute failed: {base.row.status}\n{base.row.note}")
    add("eager")
    if args.control:
        add("no-recompute", "control", "control")  # a second copy: its ratio to the first is the timing noise
    print(f"  (graph: {', '.join(str(len(p.graph)) for p in ref.plans)} nodes, {ref.stages()} stages)",
          file=sys.stderr, flush=True)
    for method in args.methods:
        for mode, value in points(method, args):
            add(method, mode, value)
    ref_peak = base.row.peak_bytes
    for v in variants:
        if ref_peak and v.row.peak_bytes is not None:
            v.row.fraction = v.row.peak_bytes / ref_peak
    # step times, every run of the model in one alternating loop
    # (a sample runs each step ``inner`` times, at least --min-sample seconds of no-recompute's)
    probe = []
    for _ in range(3):
        t0 = time.perf_counter()
        base.step()
        probe.append(time.perf_counter() - t0)
    inner = max(1, math.ceil(args.min_sample / max(statistics.median(probe), 1e-6)))
    steps = {f"{v.row.method}|{v.row.point}|{i}": _repeated(v.step, inner)
             for i, v in enumerate(variants) if v.step is not None}
    base_key = next(k for k in steps if k.startswith("no-recompute|-|"))
    print(f"  timing {len(steps)} steps x {args.repeats} rounds x {inner} steps a sample ...",
          file=sys.stderr, flush=True)
    times = step_time(steps, repeats=args.repeats, warmup=2, device="cpu")
    case.config["steps_per_sample"] = inner
    b_samples = times[base_key].samples
    for i, v in enumerate(variants):
        key = f"{v.row.method}|{v.row.point}|{i}"
        if key not in times:
            continue
        t = times[key]
        if t.error:
            v.row.status = t.error
            continue
        v.row.step_ms = t.median_s * 1e3 / inner
        n = min(len(t.samples), len(b_samples))
        if n:
            ratios = [a / b for a, b in zip(t.samples[:n], b_samples[:n])]
            v.row.ratio = statistics.median(ratios)
            v.row.ratio_min, v.row.ratio_max = min(ratios), max(ratios)
        if v.row.first_s is not None and v.row.method != "eager":
            v.row.compile_s = max(0.0, v.row.first_s - t.median_s / inner)
    case.gradient_bytes = gradient_bytes(base.model)
    rows = [v.row for v in variants]
    variants.clear()
    steps.clear()
    free_memory("cpu")
    gc.collect()
    return case, rows


# -- the table's cells ----------------------------------------------------------------------------

TOL = 0.01  # a measured fraction within 0.01 over the limit counts as within it


def _ok(r: Row) -> bool:
    return r.status == "ok" and r.ratio is not None and r.fraction is not None


def _failed(rs: list[Row]) -> str:
    """The status of a cell without a usable run."""
    if not rs:
        return "not run"
    bad = [r.status for r in rs if r.status != "ok"]
    if len(bad) == len(rs):
        return _short(rs[0])
    return f"none within ({len(rs)} runs)"


def _short(r: Row) -> str:
    if r.status == "infeasible":
        f = r.smallest_feasible_fraction
        return "infeasible" + (f" (smallest {f:.2f})" if f is not None else "")
    if r.status.startswith("error: "):
        return "error: " + r.status[len("error: "):].split(":")[0]
    return r.status


def latency_cell(rows: list[Row], method: str, limit: float) -> dict:
    """The lowest measured peak of ``method`` within ``1 + limit`` of no-recompute's time."""
    cell: dict[str, Any] = {"method": method, "criterion": f"latency{round(limit * 100)}", "limit": limit}
    if method in ("magis", "magis-nofission"):
        r = next((r for r in rows if r.method == method and r.mode == "overhead"
                  and abs(float(r.point.strip("+%")) / 100 - limit) < 1e-9), None)
        if r is None or not _ok(r):
            cell["status"] = _short(r) if r is not None else "not run"
            return cell
        cell.update(status="ok", fraction=r.fraction, ratio=r.ratio, point=r.point, held=r.ratio <= 1 + limit,
                    predicted_fraction=r.predicted_fraction, predicted_ratio=r.predicted_ratio,
                    peak_bytes=r.peak_bytes)
        return cell
    rs = [r for r in rows if r.method == method and r.mode == "budget"]
    within = [r for r in rs if _ok(r) and r.ratio <= 1 + limit]
    if not within:
        cell["status"] = _failed(rs)
        return cell
    r = min(within, key=lambda r: (r.peak_bytes, r.ratio))
    cell.update(status="ok", fraction=r.fraction, ratio=r.ratio, point=r.point, held=True,
                predicted_fraction=r.predicted_fraction, predicted_ratio=r.predicted_ratio,
                peak_bytes=r.peak_bytes, runs=len(rs))
    return cell


def memory_cell(rows: list[Row], method: str, limit: float) -> dict:
    """``method`` at ``budget=limit``; ``torch-knob (swept)``: the fastest knob run whose
    measured fraction is within the limit."""
    cell: dict[str, Any] = {"method": method, "criterion": f"memory{round(limit * 100)}", "limit": limit}
    if method == "torch-knob (swept)":
        rs = [r for r in rows if r.method == "torch-knob" and r.mode == "budget"]
        within = [r for r in rs if _ok(r) and r.fraction <= limit + TOL]
        if not within:
            cell["status"] = _failed(rs)
            return cell
        r = min(within, key=lambda r: (r.ratio, r.peak_bytes))
    else:
        r = next((r for r in rows if r.method == method and r.mode == "budget"
                  and r.point == f"{limit:g}"), None)
        if r is None or not _ok(r):
            cell["status"] = _short(r) if r is not None else "not run"
            return cell
    cell.update(status="ok", fraction=r.fraction, ratio=r.ratio, overhead=r.ratio - 1, point=r.point,
                held=r.fraction <= limit + TOL, predicted_fraction=r.predicted_fraction,
                predicted_ratio=r.predicted_ratio, ratio_min=r.ratio_min, ratio_max=r.ratio_max)
    return cell


def cells(rows: list[Row], methods: list[str]) -> list[dict]:
    out = []
    names = list(methods) + (["torch-knob (swept)"] if "torch-knob" in methods else [])
    for m in names:
        for lim in LATENCY_LIMITS:
            if m != "torch-knob (swept)":
                out.append({"model": rows[0].model, **latency_cell(rows, m, lim)})
        for lim in MEMORY_LIMITS:
            out.append({"model": rows[0].model, **memory_cell(rows, m, lim)})
    return out


# -- report -------------------------------------------------------------------------------------


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f}%"


def _lat_text(c: dict | None) -> str:
    if c is None:
        return ""
    if c.get("status") != "ok":
        return c.get("status", "-")
    if c["method"] in ("magis", "magis-nofission"):
        return (f"{c['fraction']:.2f} at {c['ratio']:.2f}x ({'held' if c['held'] else 'MISSED'}; "
                f"pred {_f(c['predicted_fraction'])} at {_f(c['predicted_ratio'])}x)")
    return f"{c['fraction']:.2f} at {c['ratio']:.2f}x (budget {c['point']})"


def _mem_text(c: dict | None) -> tuple[str, str]:
    if c is None:
        return "", ""
    if c.get("status") != "ok":
        return c.get("status", "-"), "-"
    over = "" if c["held"] else " OVER"
    at = f" (knob {c['point']})" if c["method"] == "torch-knob (swept)" else ""
    measured = f"{_pct(c['ratio'])} at {c['fraction']:.2f}{over}{at}"
    pred = "-" if c["predicted_ratio"] is None else f"{_pct(c['predicted_ratio'])} at {_f(c['predicted_fraction'])}"
    return measured, pred


def table(rows: list[Row], cs: list[dict], methods: list[str]) -> str:
    out = ["| method | peak, time <= 1.05x | peak, time <= 1.10x | time at 80% memory (measured fraction) "
           "| predicted | time at 40% memory (measured fraction) | predicted | grad max err |",
           "|---|---|---|---|---|---|---|---|"]
    names = list(methods) + (["torch-knob (swept)"] if "torch-knob" in methods else [])
    for m in names:
        get = lambda crit: next((c for c in cs if c["method"] == m and c["criterion"] == crit), None)  # noqa: E731
        m80, p80 = _mem_text(get("memory80"))
        m40, p40 = _mem_text(get("memory40"))
        errs = [r.grad_err for r in rows if r.method == m and r.grad_err is not None]
        err = _f(max(errs), "{:.1e}") if errs else "-"
        out.append(f"| {m} | {_lat_text(get('latency5'))} | {_lat_text(get('latency10'))} "
                   f"| {m80} | {p80} | {m40} | {p40} | {err if m != 'torch-knob (swept)' else ''} |")
    return "\n".join(out)


def runs_table(rows: list[Row]) -> str:
    out = ["| method | point | status | peak (MiB) | fraction | pred fraction | step ratio median [min, max] "
           "| pred ratio | plan s | compile s | recomputes | fissions | offloads | grad err | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f} [{r.ratio_min:.3f}, {r.ratio_max:.3f}]"
        note = r.note.replace("\n", " ").replace("|", "/")[:100] if r.status == "ok" or r.status == "too large" else ""
        solvers = ",".join(dict.fromkeys(r.solvers)) if r.method not in ("no-recompute", "torch-knob") else ""
        odd = [s for s in dict.fromkeys(r.plan_status) if s not in ("optimal", "feasible")]
        srch = ""
        if r.search:
            srch = "search: " + ", ".join(f"{k} {'+'.join(map(str, v))}" for k, v in r.search.items())
        note = "; ".join(x for x in (solvers, "plan " + ",".join(odd) if odd else "", srch, note) if x)
        out.append(f"| {r.method} | {r.point} | {_short(r)[:70]} "
                   f"| {_f(None if r.peak_bytes is None else r.peak_bytes / MiB)} | {_f(r.fraction)} "
                   f"| {_f(r.predicted_fraction)} | {ratio} | {_f(r.predicted_ratio, '{:.3f}')} | {_f(r.plan_s)} "
                   f"| {_f(r.compile_s, '{:.1f}')} | {_f(r.recomputes, '{}')} | {_f(r.fissions, '{}')} | {_f(r.offloads, '{}')} "
                   f"| {_f(r.grad_err, '{:.1e}')} | {note} |")
    return "\n".join(out)


def _best_other(cs: list[dict], crit: str, magis_like: tuple) -> dict | None:
    """The best non-MAGIS cell of a criterion: the lowest peak (latency) or the lowest overhead
    among those within the memory limit."""
    pool = [c for c in cs if c["criterion"] == crit and c["method"] not in magis_like and c.get("status") == "ok"]
    if crit.startswith("latency"):
        return min(pool, key=lambda c: c["fraction"], default=None)
    return min((c for c in pool if c["held"]), key=lambda c: c["ratio"], default=None)


def summary(all_cells: list[dict], models: list[str], methods: list[str]) -> str:
    """The paper's figures next to ours: MAGIS at <= 10% (5%) overhead reaches 15-60%
    (25-70%) of PyTorch's peak; at an 80% (40%) memory limit its overhead is <= 5% (15%)."""
    magis_like = tuple(m for m in ("magis", "magis-nofission") if m in methods)
    lo10, hi10 = PAPER["latency10"]
    lo5, hi5 = PAPER["latency5"]
    head = ["| model | method | peak, time <= 1.10x (paper: MAGIS 0.15-0.60) | peak, time <= 1.05x (paper: 0.25-0.70) "
            "| overhead at 80% memory (paper: <= 5%) | overhead at 40% memory (paper: <= 15%) |",
            "|---|---|---|---|---|---|"]
    counts: dict[str, list[int]] = {}

    def lat(c: dict | None, lo: float, hi: float, key: str, who: str) -> str:
        if c is None or c.get("status") != "ok":
            return "-" if c is None else c.get("status", "-")
        f = c["fraction"]
        verdict = "in range" if lo <= f <= hi else ("lower" if f < lo else "HIGHER")
        if c.get("held") is False:
            verdict += ", time MISSED"
        counts.setdefault(f"{who}|{key}", [0, 0])
        counts[f"{who}|{key}"][1] += 1
        if f <= hi and c.get("held", True):
            counts[f"{who}|{key}"][0] += 1
        return f"{f:.2f} ({verdict})"

    def mem(c: dict | None, cap: float, key: str, who: str) -> str:
        if c is None or c.get("status") != "ok":
            return "-" if c is None else c.get("status", "-")
        ok = c["overhead"] <= cap and c["held"]
        counts.setdefault(f"{who}|{key}", [0, 0])
        counts[f"{who}|{key}"][1] += 1
        counts[f"{who}|{key}"][0] += ok
        extra = "" if c["held"] else f", fraction {c['fraction']:.2f} OVER"
        return f"{c['overhead'] * 100:+.1f}% ({'yes' if ok else 'NO'}{extra})"

    for model in models:
        cs = [c for c in all_cells if c["model"] == model]
        if not cs:
            continue
        whos = [(m, lambda crit, m=m: next((c for c in cs if c["method"] == m and c["criterion"] == crit), None))
                for m in magis_like]
        whos.append(("best other", lambda crit: _best_other(cs, crit, magis_like)))
        for who, get in whos:
            def named(c, text):
                return text if who != "best other" or c is None else f"{text} [{c['method']}]"
            c10, c5, c80, c40 = get("latency10"), get("latency5"), get("memory80"), get("memory40")
            head.append(f"| {model} | {who} | {named(c10, lat(c10, lo10, hi10, 'l10', who))} "
                        f"| {named(c5, lat(c5, lo5, hi5, 'l5', who))} "
                        f"| {named(c80, mem(c80, PAPER['memory80'], 'm80', who))} "
                        f"| {named(c40, mem(c40, PAPER['memory40'], 'm40', who))} |")
    lines = ["\n".join(head), ""]
    for who in list(magis_like) + ["best other"]:
        parts = []
        for key, text in (("l10", "peak <= 0.60 at <= 1.10x"), ("l5", "peak <= 0.70 at <= 1.05x"),
                          ("m80", "<= 5% at 80%"), ("m40", "<= 15% at 40%")):
            k, n = counts.get(f"{who}|{key}", [0, 0])
            parts.append(f"{text}: {k}/{n}")
        lines.append(f"- {who} meets the paper's figure on: " + "; ".join(parts) + " models")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------

def _sweep(text: str) -> list:
    out: list = []
    for x in text.split(","):
        x = x.strip()
        if x:
            out.append(x if x == "min" else float(x))
    return out


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {','.join(MODELS)}")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}")
    ap.add_argument("--quick", action="store_true",
                    help="tiny configs, sweep 1.0,0.8,0.6,0.4,0.2,min, 3 repeats")
    ap.add_argument("--size", default=None, choices=("default", "quick"),
                    help="model sizes (default: 'quick' with --quick, else 'default')")
    ap.add_argument("--sweep", default=None, help="budgets of the sweeps of auto and torch-knob "
                    f"(default {','.join(map(str, SWEEP))}; --quick: {','.join(map(str, QUICK_SWEEP))}); "
                    "0.8 and 0.4 are always added")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds of the alternating loop "
                    "(default 5; --quick: 3)")
    ap.add_argument("--compiler", default="eager", choices=("eager", "inductor"))
    ap.add_argument("--time-limit", type=float, default=30.0, help="remat's per-graph solver time (s)")
    ap.add_argument("--checkmate-max-stages", type=int, default=500,
                    help="checkmate runs only on graphs of at most this many stages (else 'too large')")
    ap.add_argument("--min-sample", type=float, default=0.25,
                    help="seconds of no-recompute's steps a timed sample lasts at least (short steps are "
                         "repeated within a sample, so that a sample is not one scheduler tick)")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="leave out the control row (a second no-recompute copy, timed like the others: "
                         "its ratio to the first shows the timing noise)")
    ap.set_defaults(threads=1)  # stable timings on a shared CPU
    ap.add_argument("--out", default="out/magis_table", help="tables.md and rows.jsonl (rows as they come)")


def run(args):
    ap = args.parser
    args.size = args.size or ("quick" if args.quick else "default")
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; models: {', '.join(MODELS)}")
    for m in args.methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r}; methods: {', '.join(METHODS)}")
    sweep = _sweep(args.sweep) if args.sweep else list(QUICK_SWEEP if args.quick else SWEEP)
    for b in MEMORY_LIMITS:
        if b not in sweep:
            sweep.append(b)
    args.sweep = sorted(sweep, key=lambda b: -1.0 if b == "min" else b, reverse=True)
    dynamo_config.recompile_limit = 1024  # every run recompiles the same forward with its own backend
    dynamo_config.accumulated_recompile_limit = 1 << 16
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.partial = out / "rows.jsonl"
    args.partial.write_text("")
    meta = {**harness.environment("cpu"), "compiler": args.compiler, "repeats": args.repeats, "time_limit": args.time_limit,
            "sweep": args.sweep, "models": args.models, "methods": args.methods, "size": args.size,
            "sizes": {m: MAGIS_SIZES[m][args.size] for m in args.models},
            "checkmate_max_stages": args.checkmate_max_stages, "paper": PAPER}
    print(f"torch {torch.__version__}, {meta['machine']}, compiler {args.compiler}, float32, cpu, "
          f"repeats {args.repeats}, time limit {args.time_limit:g} s, sweep {args.sweep}, "
          f"methods {','.join(args.methods)}", flush=True)
    all_rows: list[dict] = []
    all_cells: list[dict] = []
    descriptions: dict[str, str] = {}
    seconds: dict[str, float] = {}
    md: list[str] = []
    t_start = time.perf_counter()
    for name in args.models:
        t0 = time.perf_counter()
        try:
            case, rows = run_model(name, args)
        except Exception as e:  # noqa: BLE001 - one model's failure does not stop the others
            print(f"{name}: {error_status(e)}\n{traceback.format_exc()[-3000:]}", flush=True)
            continue
        seconds[name] = time.perf_counter() - t0
        descriptions[name] = case.description
        cs = cells(rows, args.methods)
        base = next(r for r in rows if r.method == "no-recompute")
        eager = next((r for r in rows if r.method == "eager"), None)
        control = next((r for r in rows if r.mode == "control" and r.ratio is not None), None)
        noise = "" if control is None else (
            f"; timing control (a second no-recompute copy): ratio {control.ratio:.3f} "
            f"[{control.ratio_min:.3f}, {control.ratio_max:.3f}]")
        text = [f"### {case.description}", "",
                f"no-recompute: peak above start {base.peak_bytes / MiB:.2f} MiB, step {_f(base.step_ms, '{:.0f}')} ms; "
                f"eager autograd: step ratio "
                f"{_f(eager.ratio if eager else None)}, peak fraction {_f(eager.fraction if eager else None)}; "
                f"gradients kept {case.gradient_bytes / MiB:.2f} MiB{noise}", "",
                table(rows, cs, args.methods), "",
                f"({name}: {seconds[name]:.0f} s)"]
        print("\n" + "\n".join(text), flush=True)
        md.append("\n".join(text) + "\n\nAll runs:\n\n" + runs_table(rows))
        all_rows.extend(asdict(r) for r in rows)
        all_cells.extend(cs)
        meta["descriptions"] = descriptions
        meta["seconds"] = seconds
        meta["total_seconds"] = time.perf_counter() - t_start
        harness.write_rows(harness.output_path(args, __file__), all_rows, {**meta, "cells": all_cells}, script="magis_table")
        (out / "tables.md").write_text("\n\n".join(md) + "\n")
    text = summary(all_cells, args.models, args.methods)
    print("\n## Against the paper (MAGIS Figs. 9-10; fractions of no-recompute's peak above the step's start)\n")
    print(text)
    (out / "tables.md").write_text("\n\n".join(md) + "\n\n## Against the paper\n\n" + text + "\n")
    print(f"\nwrote {out / 'tables.md'} ({time.perf_counter() - t_start:.0f} s in all)")
    return harness.Result(all_rows, {**meta, "cells": all_cells}, printed=True)


def main(argv: list[str] | None = None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
