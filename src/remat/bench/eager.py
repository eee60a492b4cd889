"""Eager checkpointing side by side (issue 32): ``benchmarks/eager_checkpoint.py``.

On a transformers Llama, a transformers BERT (hidden and attention dropout 0.1, masked-LM loss)
and a CNN with BatchNorm, all eager (no ``torch.compile``), in one run, each method on its own
copy of the same weights and inputs:

- ``none``: plain autograd, no checkpointing: the reference of every fraction, time ratio and
  gradient;
- ``full``: every block recomputed whole: transformers' ``activation_checkpointing_enable``
  (``use_reentrant=False``) on the transformers models, non-reentrant
  ``torch.utils.checkpoint`` on each block of the CNN (:mod:`remat.eager.baselines`);
- ``op-sac``: torchtitan-style "op" selective checkpointing (matmuls saved but every second one,
  attention and ``max`` saved; :func:`remat.eager.baselines.op_sac`);
- ``offload-all``: every saved activation to host memory (torchtune's ``OffloadActivations``
  design; :func:`remat.eager.baselines.offload_everything`). On a CPU the host copies live
  outside torch's allocator, so the measured peak is what a GPU's allocator would count; the
  ``host MiB`` column says what they took;
- ``remat B``: ``remat.checkpoint(model, budget=B)`` at each of ``--budgets`` and ``min``; its
  warnings are recorded (``warned``: the least it reaches, when the budget is out of reach);
  ``remat @full``: ``budget="full"`` (full checkpointing's predicted peak with the least
  recomputation); ``remat @op-sac``: the fraction op SAC measured, for the comparison at the
  same peak; ``remat 0.6 +offload``: ``offload=True`` (the values the plan keeps go to host
  memory: :mod:`remat.eager.offload`).

Columns: ``peak MiB``, the measured peak above the step's start
(:func:`remat.bench.measure.peak_memory`: the profiler's allocation records on a CPU, the
allocator on CUDA; gradients zeroed in place, so resident); ``fraction`` of ``none``'s;
``pred``, remat's predicted fraction (``model.remat_summary()``); ``time``, the step-time ratio
to ``none`` (one alternating loop, :func:`remat.bench.measure.step_time`, median of per-round
ratios); ``grad err`` / ``grad rel``, the gradients' max abs difference from ``none``'s, every
step seeded the same (dropout draws the same masks), and that over the largest gradient;
``plan s``, the seconds of the first step beyond a steady one (remat captures and plans there).

The issue's targets, per model (:func:`checks`):

1. remat's peak within the fraction asked (2% of ``none``'s peak allowed for measurement), or a
   warning naming the least;
2. at full checkpointing's peak (within 2%), remat's step is faster than full checkpointing's;
3. remat's least peak <= 1.05x full checkpointing's;
4. remat's step no slower than op SAC's at the same or lower peak (3% allowed for timing noise on
   this shared machine; the raw ratios are in the table): the fastest remat row at or below op
   SAC's peak, and, stricter, every budget whose peak is at or below op SAC's (a budget far below
   op SAC's peak may rightly cost more time; both are reported).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Any

import torch

from . import harness
from .budgets import grads_of
from .measure import free_memory

MODELS = ("llama", "bert", "cnn")
BUDGETS = (0.8, 0.6, 0.4, 0.2)
SEED = 7

SIZES: dict[str, dict[str, tuple]] = {
    # llama: layers, width, heads, kv heads, ff, vocab, batch, seq
    # bert: layers, width, heads, ff, vocab, batch, seq
    # cnn: channels, blocks, batch, image
    "quick": {"llama": (4, 64, 4, 2, 172, 256, 8, 128), "bert": (4, 64, 4, 256, 256, 8, 128),
              "cnn": (16, 4, 16, 32)},
    "default": {"llama": (4, 128, 4, 2, 344, 512, 8, 256), "bert": (4, 128, 4, 512, 512, 8, 256),
                "cnn": (32, 4, 32, 32)},
}
"""Model sizes: ``quick`` is the issue's Llama (4 layers of width 64, batch 8 x 128), activations
well above parameters; ``default`` doubles width and sequence."""

OFFLOAD_BUDGET = 0.6
"""The budget of the ``remat B +offload`` row: ``remat.checkpoint(model, budget=B, offload=True)``."""

PEAK_TOL = 0.02
TIME_TOL = 0.03


def eager_case(name: str, size: str = "quick", device: str = "cpu"):
    """A :class:`remat.zoo.trials.Case` of ``name`` at ``size`` (:data:`SIZES`), built from a fixed
    seed; transformers models with ``use_cache=False``, as training runs them (with the cache on,
    a Llama's layers append to it in the forward, and the recomputation under any checkpointing
    then sees a longer key: SAC stops with "aten.slice.Tensor invocation index 4 encountered
    during backward but not found in storage")."""
    from remat.zoo import trials

    cfg = SIZES[size][name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        case = trials._build(name, cfg)
    inner = _inner(case.model)
    if inner is not None:
        inner.config.use_cache = False  # training: a KV cache filled in the forward changes the recomputation
    case.model = case.model.to(device).train()
    case.inputs = tuple(x.to(device) for x in case.inputs)
    return case


def _inner(model):
    """The transformers model inside a zoo loss wrapper (None for the CNN)."""
    for attr in ("lm", "model"):
        m = getattr(model, attr, None)
        if m is not None and hasattr(m, "gradient_checkpointing_enable"):
            return m
    return None


def methods(budgets=BUDGETS) -> list[tuple[str, Any]]:
    """``(name, setting)`` of every row, in the table's order. ``remat @full`` is
    ``budget="full"`` (full checkpointing's predicted peak, the least recomputation that keeps it);
    ``remat @op-sac`` asks for op SAC's measured fraction (setting ``"op-sac"``, resolved when the
    row runs)."""
    out: list[tuple[str, Any]] = [("none", None), ("full", None), ("op-sac", None), ("offload-all", None)]
    out += [(f"remat {b:g}", b) for b in budgets] + [("remat min", "min"), ("remat @full", "full"),
                                                    ("remat @op-sac", "op-sac"),
                                                    (f"remat {OFFLOAD_BUDGET:g} +offload", ("offload", OFFLOAD_BUDGET))]
    return out


def apply(model, name: str, setting, device: str = "cpu") -> dict:
    """Apply method ``name`` to ``model`` in place; returns what is kept of it (the offloader)."""
    from remat.eager import baselines

    if name == "none":
        return {}
    if name == "full":
        inner = _inner(model)
        if inner is not None:
            baselines.hf_full_checkpoint(inner)
        else:
            baselines.full_checkpoint(model)
        return {}
    if name == "op-sac":
        baselines.op_sac(model)
        return {}
    if name == "offload-all":
        return {"offloader": baselines.offload_everything(model, device=device)}
    import remat

    if isinstance(setting, tuple) and setting[0] == "offload":
        remat.checkpoint(model, budget=setting[1], offload=True)
        return {"remat": True, "offloader": lambda: getattr(model._remat_planner, "_offloader", None)}
    remat.checkpoint(model, budget=setting)
    return {"remat": True}


def _grad_errors(got: list, ref: list) -> tuple[float, float]:
    err, scale = 0.0, 0.0
    for g, r in zip(got, ref):
        if r is not None:
            scale = max(scale, float(r.abs().max()))
        if (g is None) != (r is None):
            return math.inf, math.inf
        if g is not None:
            err = max(err, float((g.double() - r.double()).abs().max()))
    return err, (err / scale if scale else err)


def run_model(name: str, size: str, budgets, repeats: int, device: str = "cpu", log=print) -> list[dict]:
    """Every method on ``name``: one row each (see the module docstring)."""
    case = eager_case(name, size, device)
    base, inputs = case.model, case.inputs
    ref_model = copy.deepcopy(base)
    harness.make_step(ref_model, ref_model, inputs, grads="none", seed=SEED)()
    ref = grads_of(ref_model)
    del ref_model
    rows, steps, keep = [], {}, {}
    peaks: dict[str, int] = {}
    for mname, setting in methods(budgets):
        row: dict = {"model": name, "method": mname, "status": "ok", "case": case.description}
        rows.append(row)
        try:
            if setting == "op-sac":
                if not peaks.get("op-sac") or not peaks.get("none"):
                    raise RuntimeError("op SAC's or no checkpointing's peak was not measured")
                setting = round(peaks["op-sac"] / peaks["none"], 3)
                row["budget"] = setting
            m = copy.deepcopy(base)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                kept = apply(m, mname, setting, device)
                step = harness.make_step(m, m, inputs, grads="keep", seed=SEED)
                t0 = time.perf_counter()
                step()
                first = time.perf_counter() - t0
            row["warned"] = "; ".join(sorted({str(w.message)[:240] for w in caught
                                              if type(w.message).__module__.startswith("remat")})) or None
            row["grad_err"], row["grad_rel"] = _grad_errors(grads_of(m), ref)
            t0 = time.perf_counter()
            step()
            row["plan_s"] = max(0.0, first - (time.perf_counter() - t0))
            row["peak_bytes"] = peaks[mname] = harness.measure_peak(step, device, keep=harness.held(m, inputs))
            off = kept.get("offloader")
            off = off() if callable(off) else off
            if off is not None:
                row["host_bytes"] = off.host_peak_bytes
                row["offloaded"] = off.stats.offloaded
            if kept.get("remat"):
                s = m.remat_summary()
                row["pred"] = s.peak / s.peak_eager if s.peak_eager else None
                row["plans"] = "; ".join(f"{r.cls} x{len(r.blocks)} {r.plan}" for r in s.rows)
                row["summary"] = str(s)
            steps[mname], keep[mname] = step, m
        except Exception as e:  # noqa: BLE001 - recorded; the other methods go on
            row.update(harness.error_row(e))
        log(f"  {name} {mname}: {row['status']}" + (f", peak {row['peak_bytes'] / 2**20:.2f} MiB"
                                                    if row.get("peak_bytes") else ""))
    base_peak = next((r.get("peak_bytes") for r in rows if r["method"] == "none"), None)
    times = harness.time_ratios(steps, "none", repeats=repeats, warmup=1, device=device) if "none" in steps else {}
    for r in rows:
        if base_peak and r.get("peak_bytes") is not None:
            r["fraction"] = r["peak_bytes"] / base_peak
        t = times.get(r["method"])
        if t:
            r["time"], r["time_min"], r["time_max"] = t["ratio"], t["ratio_min"], t["ratio_max"]
            r["step_ms"] = t["step_ms"]
            if t["error"]:
                r["status"] = t["error"]
    del keep
    free_memory(device, reset_dynamo=False)
    return rows


def _setting(method: str):
    """The budget a row's name asks for: a float, ``"min"``, or None (``@full``, ``@op-sac``,
    ``+offload``)."""
    tail = method.split(" ", 1)[1]
    if tail.endswith("+offload"):
        return None
    if tail == "min":
        return tail
    try:
        return float(tail)
    except ValueError:
        return None


def checks(rows: list[dict]) -> list[dict]:
    """The issue's targets (module docstring), per model: ``{"model", "check", "ok", "detail"}``."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {r["method"]: r for r in rows if r["model"] == model and r.get("fraction") is not None}
        remat = {k: r for k, r in by.items() if k.startswith("remat ") and "+offload" not in k}
        full, sac = by.get("full"), by.get("op-sac")
        if not remat:
            out.append({"model": model, "check": "remat ran", "ok": False, "detail": "no remat row measured"})
            continue
        for k, r in remat.items():
            b = r.get("budget") if k == "remat @op-sac" else _setting(k)
            if b is None or b == "min":
                continue
            ok = r["fraction"] <= b + PEAK_TOL or bool(r.get("warned"))
            how = "within" if r["fraction"] <= b + PEAK_TOL else ("warned" if r.get("warned") else "over, no warning")
            out.append({"model": model, "check": f"1. peak within {b:g}", "ok": ok,
                        "detail": f"{r['fraction']:.3f} ({how})"})
        if full is not None:
            at = [r for r in remat.values() if r["fraction"] <= full["fraction"] + PEAK_TOL and r.get("time")]
            if at:
                best = min(at, key=lambda r: r["time"])
                out.append({"model": model, "check": "2. faster at full's peak", "ok": best["time"] < full["time"],
                            "detail": f"{best['method']}: {best['fraction']:.3f} at {best['time']:.2f}x; "
                                      f"full {full['fraction']:.3f} at {full['time']:.2f}x"})
            else:
                out.append({"model": model, "check": "2. faster at full's peak", "ok": False,
                            "detail": f"no remat row reaches full's {full['fraction']:.3f}"})
            least = min(remat.values(), key=lambda r: r["fraction"])
            out.append({"model": model, "check": "3. least <= 1.05x full's", "ok":
                        least["fraction"] <= 1.05 * full["fraction"],
                        "detail": f"{least['method']} {least['fraction']:.3f} vs full {full['fraction']:.3f} "
                                  f"({least['fraction'] / full['fraction']:.2f}x)"})
        if sac is not None and sac.get("time"):
            below = [r for r in remat.values() if r.get("time") and r["fraction"] <= sac["fraction"] + PEAK_TOL]
            if below:
                best = min(below, key=lambda r: r["time"])
                out.append({"model": model, "check": "4. fastest remat at or below op SAC's peak", "ok":
                            best["time"] <= sac["time"] * (1 + TIME_TOL),
                            "detail": f"{best['method']}: {best['fraction']:.3f} at {best['time']:.2f}x; "
                                      f"op SAC {sac['fraction']:.3f} at {sac['time']:.2f}x"})
            for k, r in remat.items():
                if not r.get("time"):
                    continue
                if r["fraction"] <= sac["fraction"] + PEAK_TOL:
                    ok = r["time"] <= sac["time"] * (1 + TIME_TOL)
                    detail = f"{r['fraction']:.3f} at {r['time']:.2f}x; op SAC {sac['fraction']:.3f} at {sac['time']:.2f}x"
                else:
                    ok, detail = True, (f"n/a: {r['fraction']:.3f} above op SAC's {sac['fraction']:.3f}")
                out.append({"model": model, "check": f"4. <= op SAC's time ({k})", "ok": ok, "detail": detail})
    return out


COLUMNS = ["model", "method", "status", "peak MiB", "fraction", "pred", "time", "time range", "grad err",
           "grad rel", "host MiB", "plan s", "plans", "warned"]
"""The table's columns (the targets leave the ``+offload`` row out: they are about checkpointing)."""


def display_rows(rows: list[dict]) -> list[dict]:
    """The rows as the table shows them."""
    out = []
    for r in rows:
        d = {"model": r["model"], "method": r["method"], "status": r["status"][:40]}
        d["peak MiB"] = r["peak_bytes"] / 2**20 if r.get("peak_bytes") is not None else None
        d["fraction"] = r.get("fraction")
        d["pred"] = r.get("pred")
        d["time"] = r.get("time")
        d["time range"] = (f"{r['time_min']:.2f}-{r['time_max']:.2f}" if r.get("time_min") is not None else None)
        d["grad err"] = harness.fmt(r.get("grad_err"), "{:.1e}")
        d["grad rel"] = harness.fmt(r.get("grad_rel"), "{:.1e}")
        d["host MiB"] = r["host_bytes"] / 2**20 if r.get("host_bytes") is not None else None
        d["plan s"] = r.get("plan_s")
        d["plans"] = r.get("plans")
        d["warned"] = (r.get("warned") or "")[:90] or None
        out.append(d)
    return out


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS), help="remat's fractions")
    ap.add_argument("--size", default="default", choices=sorted(SIZES), help="model sizes (SIZES)")
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds (every method once per round)")
    ap.add_argument("--quick", action="store_true", help="--size quick --repeats 10 (about 2 minutes here)")
    ap.add_argument("--device", default="cpu")


def run(args):
    if args.quick:
        args.size, args.repeats = "quick", 10
    if not args.threads:
        torch.set_num_threads(1)  # steady CPU times on a shared machine
    budgets = tuple(float(b) for b in args.budgets.split(",") if b.strip())
    rows: list[dict] = []
    t0 = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        print(f"== {name} ({args.size})", flush=True)
        rows += run_model(name, args.size, budgets, args.repeats, args.device)
    wall = time.perf_counter() - t0
    shown = display_rows(rows)
    harness.print_table(shown, COLUMNS, f"eager checkpointing, {args.size} ({wall:.0f} s)")
    found = checks(rows)
    print("\nTargets (issue 32):")
    for c in found:
        print(f"  [{'ok' if c['ok'] else 'MISSED'}] {c['model']}: {c['check']}: {c['detail']}")
    print("\n" + harness.markdown_table(shown, COLUMNS))
    return harness.Result(rows, {"checks": found, "wall_s": wall, "size": args.size,
                                 "threads": torch.get_num_threads()}, printed=True)


# -- the GPU check's eager stage (benchmarks/gpu_check.sh, remat.bench.gpu_check) ---------------

GPU_CHECK_VARIANTS: list[dict] = [
    {"name": "eager-none", "method": "none"},
    {"name": "eager-full", "method": "full"},
    {"name": "eager-op-sac", "method": "op-sac"},
    {"name": "eager-offload-all", "method": "offload-all"},
    {"name": "eager-remat-full-peak", "method": "remat", "budget": "full"},
    {"name": "eager-remat-0.5", "method": "remat", "budget": 0.5},
    {"name": "eager-remat-min", "method": "remat", "budget": "min"},
    {"name": "eager-remat-0.5-offload", "method": "remat", "budget": ["offload", 0.5]},
]
"""The GPU check's eager stage on GPT-2 (transformers, no torch.compile): no checkpointing,
transformers' full checkpointing, op SAC, offload-everything (pinned host buffers and a side
stream on a GPU), and ``remat.checkpoint`` at full checkpointing's peak (``budget="full"``), at 0.5
and at ``min``, and at 0.5 with ``offload=True`` (what the plan keeps waits in pinned host memory:
SAC's cache through :func:`remat.eager.offload.wrap_sac_contexts`, unwrapped blocks through
:func:`remat.eager.offload.offload_hooks`)."""


def run_gpu_check_variant(spec: dict, row, case) -> None:
    """One eager variant of the GPU check in this process (called by
    :func:`remat.bench.gpu_check.run_variant` for ``stage == "eager"``): ``row`` gets the first
    step's seconds, the gradients' difference from no checkpointing under the same seed, the peak
    above the step's start (CUDA allocator: allocated and reserved; CPU: the profiler's records),
    the median step, the host bytes offloading took and remat's plan. ``case``: the GPT-2 case."""
    from . import measure as M

    device = spec["device"]
    cuda = device.startswith("cuda")
    inner = _inner(case.model)
    if inner is not None:
        inner.config.use_cache = False
    inputs = case.inputs
    row.save(case=case.description, batch=case.batch, phase="eager reference")
    ref_model = copy.deepcopy(case.model)
    harness.make_step(ref_model, ref_model, inputs, grads="none", seed=SEED)()
    ref = [None if p.grad is None else p.grad.detach().float().cpu() for p in ref_model.parameters()]
    del ref_model
    M.free_memory(device, reset_dynamo=False)

    model = copy.deepcopy(case.model)
    method, setting = spec["method"], spec.get("budget")
    if isinstance(setting, list):  # ("offload", budget), through JSON
        setting = tuple(setting)
    kept = apply(model, method, setting, device)
    step = harness.make_step(model, model, inputs, grads="keep", seed=SEED)
    row.save(phase="first step")
    t0 = time.perf_counter()
    step()
    M._sync(device)
    row["first_s"] = time.perf_counter() - t0
    got = [None if p.grad is None else p.grad.detach().float().cpu() for p in model.parameters()]
    err, rel = _grad_errors(got, ref)
    fields: dict = {"grad_err": err, "grad_rel": rel}
    if kept.get("remat"):
        s = model.remat_summary()
        fields.update(pred_fraction=s.peak / s.peak_eager if s.peak_eager else None, pred_peak_bytes=s.peak,
                      plans="; ".join(f"{r.cls} x{len(r.blocks)} {r.plan}" for r in s.rows), summary=str(s))
    off = kept.get("offloader")
    off = off() if callable(off) else off
    if off is not None:  # after the first step
        fields.update(offloads_first=off.stats.offloaded, host_bytes=off.host_peak_bytes)
    row.save(phase="measuring", **fields)
    if not spec.get("steps"):
        row["status"] = "ok"
        return
    pm = M.peak_memory(step, device, warmup=1, timeline=False, held=harness.held(model, inputs))
    alloc = pm.peak_bytes  # CUDA: the allocator's peak above the step's start; CPU: the profiler's
    resv = None
    if cuda:  # and what the allocator reserved beyond its start
        torch.cuda.synchronize()
        before = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        resv = int(torch.cuda.max_memory_reserved() - before)
    extra = {}
    if off is not None:  # over every step so far
        extra = {"host_bytes": off.host_peak_bytes, "offloads": off.stats.offloaded}
    row.save(phase="timing", peak_bytes=alloc, reserved_bytes=resv, **extra)
    t = M.step_time({spec["name"]: step}, repeats=int(spec["steps"]), warmup=1, device=device)[spec["name"]]
    if t.error:
        raise RuntimeError(t.error)
    row.save(step_ms=t.median_s * 1e3, step_ms_min=min(t.samples) * 1e3 if t.samples else None,
             status="ok", phase="done")
