"""Run the benchmark: every (model, size, method), measured the same way, side by side.

For each model of the zoo (:mod:`remat.zoo`) and size, every method
(:data:`remat.bench.methods.METHODS`) is prepared on its own copy of the case (same seed:
same weights and inputs), run once (the first call compiles; its time is the compile
time when ``prepare`` did not compile already), then measured: saved activation bytes
(autograd's saved-tensor hooks), peak memory of a step above what was resident before it
(CUDA allocator, or the profiler's allocation records on a CPU) and its timeline, and the
simulator's prediction of both on a calibrated device profile. Then the step times of all
the model's methods are measured in one alternating loop (DESIGN.md: side by side, median
after warm-up).

Every case runs in a ``try``: a crash or an out-of-memory is recorded in its ``status``
("oom", "error: ...") and the others go on. ``results.json`` is rewritten after every
model, so an interrupted run keeps what it measured; with ``resume`` a second run skips the
records already ``ok``.

>>> from remat.bench.runner import run
>>> recs = run(["cos-cos"], "tiny", ["eager", "mincut-conservative"], compiler="eager",
...            repeats=2, progress=False)                                  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Iterable, Sequence

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import zoo
from ..cost.calibrate import profile_for
from . import measure as M
from . import report
from .fidelity import markdown as fidelity_md
from .methods import CHECKPOINT, METHODS, prepare, split_methods

DEFAULT_REPEATS = {"tiny": 5, "small": 10, "full": 5}
DEFAULT_WARMUP = {"tiny": 1, "small": 2, "full": 1}
MEASURED_FIELDS = (  # every record has these keys (None where not measured)
    "batch", "saved_activation_bytes", "saved_tensors", "predicted_saved_activation_bytes",
    "peak_bytes", "predicted_peak_bytes", "resident_bytes", "peak_total_bytes", "step_ms", "predicted_step_ms",
    "compile_s", "planner_ms", "graphs", "recomputed", "timeline", "note",
)
TIMELINE_POINTS = 4000  # longer measured timelines are reduced, keeping every bucket's max


def _as_list(x, everything: Sequence[str]) -> list[str]:
    if x is None or x == "all" or x == ["all"]:
        return list(everything)
    if isinstance(x, str):
        return [s.strip() for s in x.split(",") if s.strip()]
    return list(x)


def _downsample(tl: list[tuple[float, int]], n: int = TIMELINE_POINTS) -> list[list[float]]:
    if len(tl) <= n:
        return [[t, b] for t, b in tl]
    step = math.ceil(len(tl) / n)
    out = []
    for i in range(0, len(tl), step):
        chunk = tl[i:i + step]
        t, b = max(chunk, key=lambda p: p[1])
        out.append([chunk[0][0], b])
    out.append(list(tl[-1]))
    return out


def _slug(s) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(s))


class _Progress:
    """A rich progress bar over runs, or nothing when disabled / not a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), transient=False)
            self.task = self.bar.add_task("bench", total=total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=text)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, n)


def _plans_info(prep) -> dict:
    plans = list(getattr(prep, "plans", None) or [])
    planner_s = getattr(prep, "planner_seconds", None)
    if not planner_s and plans:
        planner_s = sum(p.solve_seconds for p in plans)
    return {
        "graphs": len(plans) if plans else len(getattr(prep, "graphs", None) or []) or None,
        "predicted_saved_activation_bytes": M.plans_saved_activation_bytes(prep),
        "recomputed": sum(len(p.recomputed) for p in plans) if plans else None,
        "planner_ms": planner_s * 1e3 if planner_s else (0.0 if plans else None),
        "saved_names": [[s.name for s in p.saved_activations] for p in plans][:8] if plans else None,
    }


def _measure_method(model: str, size: str, method: str, device: str, compiler: str,
                    batch: int | None) -> tuple[dict, object, object, dict]:
    """Build, prepare, run once and measure one method. Returns (record fields, prepared,
    case, side data)."""
    case = zoo.build(model, size, batch=batch, device=device, seed=0)
    t0 = time.perf_counter()
    prep = prepare(method, case, compiler=compiler)
    prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    prep.step()
    M._sync(device)
    first_s = time.perf_counter() - t0
    compile_s = getattr(prep, "compile_seconds", first_s)  # None: nothing compiled (eager)
    # the method's own tensors (prepare works on a copy of the case)
    held = list(prep.params_and_inputs() if hasattr(prep, "params_and_inputs") else case.params_and_inputs())
    model = getattr(prep, "model", None) or case.model
    # resident anyway, so not activations: buffers (BN statistics), inputs without grads
    resident = list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    resident += [x for x in (getattr(prep, "inputs", None) or case.inputs) if isinstance(x, torch.Tensor)]
    saved = M.saved_activation_bytes(prep, held + resident)
    released = M.released_gradient_bytes(prep.step, held)
    pm = M.peak_memory(prep.step, device, warmup=1, held=held + resident)
    rec = {
        "batch": getattr(case, "batch", None),
        "saved_activation_bytes": saved.activation_bytes,
        "saved_tensors": saved.count,
        "peak_bytes": pm.peak_bytes,
        "end_bytes": pm.end_bytes,
        "resident_bytes": pm.resident_before,
        "peak_total_bytes": (pm.resident_before or 0) + pm.peak_bytes,
        "released_bytes": released,
        "peak_source": pm.source,
        "compile_s": compile_s,
        "prepare_s": prepare_s,
        "first_step_s": first_s,
        **_plans_info(prep),
    }
    return rec, prep, case, {"measured": pm.timeline, "released": released}


def run(models: Iterable[str] | str = "all", sizes: Iterable[str] | str = "tiny",
        methods: Iterable[str] | str = "all", device: str = "cpu", out_dir: str | Path | None = None,
        repeats: int | None = None, warmup: int | None = None, compiler: str = "inductor",
        resume: bool = True, progress: bool = True, batch: int | None = None,
        fidelity: bool = True, kernel_cache: bool = True, threads: int | None = None) -> list[dict]:
    """Benchmark ``models`` x ``sizes`` x ``methods`` on ``device``; returns every record
    (those of earlier runs in ``out_dir`` included). With ``out_dir`` it writes
    results.json after each model, and results.csv, results.md and fidelity.md at the end.
    ``repeats``/``warmup``: timed and warm-up rounds of the alternating loop (defaults by
    size: :data:`DEFAULT_REPEATS`, :data:`DEFAULT_WARMUP`). Methods are names of
    :data:`remat.bench.methods.METHODS` or ``"<solver>[:key=value,...]"`` strings.

    The compiled-graph caches (inductor's FX graph cache, AOTAutograd's cache) are always
    off, so every compile runs the partitioner and captures its plan. ``kernel_cache``
    keeps inductor's cache of compiled kernels (C++/Triton binaries keyed by their source):
    methods that generate the same kernels share them, and a second run compiles much
    faster; ``compile_s`` is then not a cold compile time. ``kernel_cache=False`` turns
    every cache off (``force_disable_caches``): cold compiles, slow. ``threads``: torch's
    CPU threads for the run (on a loaded machine, 1 avoids OpenMP threads waiting for each
    other's time slices, which inflates compiled CPU steps many times over)."""
    models = _as_list(models, list(zoo.names()) if models in (None, "all", ["all"]) else [])
    sizes = _as_list(sizes, ["tiny"])
    methods = _as_list(split_methods(methods) if isinstance(methods, str) and methods != "all" else methods,
                       list(METHODS) if methods in (None, "all", ["all"]) else [])
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' asked for, but torch sees no CUDA GPU; use --device cpu")
    out = Path(out_dir) if out_dir is not None else None
    records: list[dict] = report.load_results(out / "results.json") if (out and resume) else []
    # a record counts as done only for the compiler asked for (eager and inductor differ)
    done = {report.key(r) for r in records if r.get("status") == "ok" and r.get("compiler") == compiler}
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(models, sizes, methods, device, out, repeats, warmup, compiler, resume, progress,
                    batch, fidelity, kernel_cache, records, done)
    finally:
        torch.set_num_threads(old_threads)


def _run(models, sizes, methods, device, out, repeats, warmup, compiler, resume, progress, batch,
         fidelity, kernel_cache, records, done) -> list[dict]:
    profile = profile_for(device)
    meta = {
        "command": " ".join(sys.argv) if sys.argv else "",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine() + (f" {torch.cuda.get_device_name()}" if device.startswith("cuda") else
                                         f" {os.cpu_count()} cpus, {torch.get_num_threads()} threads"),
        "device": device, "compiler": compiler,
        "device_profile": {"name": profile.name, "peak_flops": profile.peak_flops,
                           "bandwidth": profile.bandwidth, "launch_seconds": profile.launch_seconds},
    }

    def upsert(rec: dict) -> None:
        k = report.key(rec)
        for i, r in enumerate(records):
            if report.key(r) == k:
                records[i] = rec
                return
        records.append(rec)

    def save() -> None:
        if out is not None:
            report.write_json(records, out / "results.json", meta)

    todo = [(m, s, k) for m in models for s in sizes for k in methods if (m, s, k, device) not in done]
    meta["kernel_cache"] = kernel_cache
    with _Progress(len(todo), progress) as bar, M.graph_caches_off(kernel_cache):
        for model in models:
            for size in sizes:
                run_methods = [k for k in methods if (model, size, k, device) not in done]
                if not run_methods:
                    continue
                for rec in _run_model(model, size, run_methods, device, compiler, batch, profile, out,
                                      repeats if repeats is not None else DEFAULT_REPEATS.get(size, 10),
                                      warmup if warmup is not None else DEFAULT_WARMUP.get(size, 2), bar):
                    upsert(rec)
                save()
    if out is not None:
        report.write_all(records, out, meta)
        if fidelity:
            (out / "fidelity.md").write_text(fidelity_md(records))
    return records


def _run_model(model: str, size: str, methods: list[str], device: str, compiler: str,
               batch: int | None, profile, out: Path | None, repeats: int, warmup: int,
               bar: _Progress) -> list[dict]:
    recs: dict[str, dict] = {}
    prepared: dict[str, object] = {}
    cases: list = []
    side: dict[str, dict] = {}
    for method in methods:
        bar.describe(f"{model} ({size}): {method}")
        rec = {**dict.fromkeys(MEASURED_FIELDS), "model": model, "size": size, "method": method,
               "device": device, "status": "ok", "compiler": compiler, "repeats": repeats}
        try:
            fields, prep, case, extra = _measure_method(model, size, method, device, compiler, batch)
            rec.update(fields)
            prepared[method] = prep
            cases.append(case)
            side[method] = extra
        except Exception as e:  # noqa: BLE001 - recorded; the other methods go on
            rec["status"] = M.error_status(e)
            rec["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:]
            M._free_after_error(device)
        recs[method] = rec
        bar.advance()
    # the simulator's predictions (eager: the no-recompute plan of the same case)
    for method, prep in prepared.items():
        rec = recs[method]
        try:
            fallback = prepared.get("no-recompute") if method == "eager" else None
            pred = None if method == CHECKPOINT else M.predicted(
                prep, profile, fallback=fallback, released_bytes=side[method]["released"])
        except Exception as e:  # noqa: BLE001
            pred = None
            rec["note"] = f"prediction failed: {M.error_status(e)}"
        rec["predicted_peak_bytes"] = pred.peak_bytes if pred else None
        rec["predicted_step_ms"] = pred.seconds * 1e3 if pred else None
        if pred is not None:
            if method == "eager":
                rec["note"] = "predicted from the no-recompute plan"
            if pred.note:
                rec["note"] = "; ".join(x for x in (rec.get("note"), pred.note) if x)
            side[method]["simulated"] = pred.timeline
            if method == "eager":
                side[method]["simulated_from"] = "no-recompute"
    # step times side by side
    if prepared:
        bar.describe(f"{model} ({size}): timing {len(prepared)} methods x {repeats}")
        times = M.step_time({k: p.step for k, p in prepared.items()}, repeats=repeats, warmup=warmup,
                            device=device)
        for method, t in times.items():
            rec = recs[method]
            if t.error:
                rec["status"] = t.error
            rec["step_ms"] = t.median_s * 1e3 if not math.isnan(t.median_s) else None
            rec["step_ms_min"] = min(t.samples) * 1e3 if t.samples else None
    # timelines in side files
    for method, extra in side.items():
        tl = {"measured": _downsample(extra.get("measured") or []),
              "simulated": extra.get("simulated") or [],
              **({"simulated_from": extra["simulated_from"]} if "simulated_from" in extra else {})}
        if out is not None:
            name = f"timelines/{_slug(model)}_{_slug(size)}_{_slug(device)}_{_slug(method)}.json"
            (out / "timelines").mkdir(parents=True, exist_ok=True)
            (out / name).write_text(json.dumps(tl))
            recs[method]["timeline"] = name
        else:
            recs[method]["timeline"] = tl
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    for rec in recs.values():
        rec["time"] = stamp
    del prepared, cases, side
    with contextlib.suppress(Exception):
        M.free_memory(device)
    gc.collect()
    return [recs[m] for m in methods]
