"""The short GPU check (``benchmarks/gpu_check.sh OUT [--cpu]``): offloading and budgets on one
GPU in about ten minutes, or the same stages on a CPU.

Stages:

1. **preflight** (``OUT/preflight.json``): torch, transformers and GPU versions, the
   schemas of PyTorch's ``ao`` copy ops (or ``"missing"``), whether remat can lower offloads
   with them (:func:`remat.lower.offload.offload_support`), the measured host link
   (:func:`remat.capture.link.link_for_device`).
2. **offload** micro-test: remat's ``swap`` solver (``strict=True``) on the zoo's MLP and U-Net
   (``tiny``), eager compiler and inductor: the gradients' error against eager autograd, the
   offloads the plans make and the copies left waiting (:func:`remat.bench.ao_standin.pending`).
3. **gpt2**: a GPT-2 step, one variant per process: ``no-recompute``, PyTorch's knob at 0.4
   (``torch-mincut`` with ``activation_memory_budget = 0.4``), PyTorch's offloading
   (``torch-offload``: every saved activation marked), remat's ``auto`` 0.4, ``swap`` 0.7,
   ``swap-recompute`` 0.4 and ``magis`` 0.4 (``strict=True``, a short ``time_limit``).
4. **eager** (issue 32): the same GPT-2 without ``torch.compile``, one variant per process
   (:data:`remat.bench.eager.GPU_CHECK_VARIANTS`): no checkpointing, transformers' full
   checkpointing, op SAC, offload-everything (pinned host buffers, a side stream) and
   ``remat.checkpoint`` at full checkpointing's peak, 0.5 and ``min``
   (:func:`remat.bench.eager.run_gpu_check_variant`). ``--stages preflight,eager`` runs it alone.

Every variant runs in a process of its own (:func:`run_isolated`) with a timeout, so a crash
(a freed buffer reused by a compiled kernel is a segfault or an illegal memory access) or a
hang is a row with an error, not the end of the check. The process writes its row to a file
as it goes (planned, first step, peak, timing), so a crash keeps what was known before it:
the plan's offloads and PyTorch's transfers included. Each row: the first call's seconds
(compile and one step), the gradients' largest difference from eager autograd (absolute and
relative to the largest gradient), the peak allocated and reserved above the step's start
(CUDA allocator; on a CPU :func:`remat.bench.measure.peak_memory`'s profiler records, nothing
reserved), the median of 10 steps (:func:`remat.bench.measure.step_time`: CUDA events, or
``perf_counter`` on a CPU), the plans' predicted peak above the step's start and predicted
time, the offloads made (the schedules' offload statements; for ``torch-offload`` the
``ao.offload`` nodes of its forward), the copies left waiting and the fallbacks
(:class:`~remat.errors.RematFallbackWarning`). Rows go to ``OUT/rows.jsonl``; a table is
printed at the end.

With ``--cpu`` each process first installs :mod:`remat.bench.ao_standin`, so PyTorch's real
``ao`` ops run on the CPU (their stream, event and pinned-memory parts stubbed), and GPT-2
is small (:data:`GPT2_CPU`); torch runs one thread per process (``--threads``), which keeps
CPU step times steady on a loaded machine.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Iterable

GPT2_GPU = {"layers": 4, "width": 768, "heads": 12, "seq": 512, "batch": 8, "vocab": 8192}
"""GPT-2 on the GPU: 4 layers of GPT-2 small's width, 8 x 512 tokens, a vocabulary of 8192 (the
LM head's logits stay a small part of the step)."""

GPT2_CPU = {"layers": 2, "width": 64, "heads": 4, "seq": 128, "batch": 8, "vocab": 256}
"""GPT-2 on a CPU (``--cpu``): the zoo's ``tiny`` layers with 8 x 128 tokens, so that activations
outweigh parameters and gradients and fractional budgets such as 0.4 can be met (at the zoo's
2 x 16 tokens the gradients alone are above them)."""

TIME_LIMIT = 10.0
"""Seconds each remat solver may search per graph."""

GPT2_VARIANTS: list[dict] = [
    {"name": "no-recompute", "method": "no-recompute"},
    {"name": "torch-knob-0.4", "method": "torch-mincut", "functorch": {"activation_memory_budget": 0.4}},
    {"name": "torch-offload", "method": "torch-offload"},
    {"name": "torch-offload-lastuse", "method": "torch-offload", "torch_offload_waits": "last-use",
     "needs": "last_use_of_storage"},
    {"name": "auto-0.4", "method": f"auto:budget=0.4,time_limit={TIME_LIMIT:g}", "strict": True},
    {"name": "swap-0.7", "method": f"swap:budget=0.7,time_limit={TIME_LIMIT:g}", "strict": True},
    {"name": "swap-recompute-0.4", "method": f"swap-recompute:budget=0.4,time_limit={TIME_LIMIT:g}",
     "strict": True},
    {"name": "magis-0.4", "method": f"magis:budget=0.4,time_limit={TIME_LIMIT:g}", "strict": True},
]
"""The GPT-2 stage's variants: a name, a :mod:`remat.bench.methods` method string, ``strict``
and functorch config set in the variant's process. ``torch-offload-lastuse`` is PyTorch's
offloading with its offloads' waits passing the device tensor as ``last_use_of_storage``
instead of ``keepalive`` (:func:`remat.lower.torch_offload.last_use_waits`; as PyTorch writes them,
inductor may reuse the freed buffer); it runs only where ``ao.wait_tensor`` has that argument."""

OFFLOAD_BUDGET = "min"
"""The micro-test's budget for ``swap``: the least memory it reaches (the zoo's ``tiny`` MLP
cannot meet 0.5)."""

STAGES = ("preflight", "offload", "gpt2", "eager")


# -- preflight --------------------------------------------------------------------------------

def ao_schemas() -> dict[str, str]:
    """The schema of each of PyTorch's ``ao`` copy ops, or ``"missing"``."""
    import torch

    with contextlib.suppress(Exception):
        import torch._functorch._activation_offloading.offload_ops  # noqa: F401 - registers them
    out = {}
    for op in ("offload", "reload", "wait_tensor"):
        try:
            out[op] = str(getattr(torch.ops.ao, op).default._schema)
        except Exception:  # noqa: BLE001 - absent on torch <= 2.12
            out[op] = "missing"
    return out


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return repr(x)


def preflight(device: str) -> dict:
    """Versions, the ``ao`` op schemas, remat's verdict on offloading and the measured link."""
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "device": device,
    }
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        info["transformers"] = f"missing ({type(e).__name__}: {e})"
    if device.startswith("cuda"):
        if torch.cuda.is_available():
            dev = torch.device(device)
            p = torch.cuda.get_device_properties(dev)
            info["gpu"] = {"name": p.name, "capability": f"{p.major}.{p.minor}",
                           "memory_gib": round(p.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
        else:
            info["gpu"] = "torch sees no CUDA device"
        smi = shutil.which("nvidia-smi")
        if smi:
            with contextlib.suppress(Exception):
                info["nvidia_smi"] = subprocess.run(
                    [smi, "--query-gpu=name,driver_version,memory.total,memory.used", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=20).stdout.strip()
    info["ao_schemas"] = ao_schemas()
    try:
        from ..lower import offload as lowering
        problem = getattr(lowering, "ao_problem", None)
        info["ao_problem"] = problem() if problem else None
        support = getattr(lowering, "offload_support", None)
        if support is not None:
            ok, why = support(torch.device(device).type)
            info["offload_support"] = {"ok": ok, "how": why}
    except Exception as e:  # noqa: BLE001
        info["ao_problem"] = f"could not ask remat: {type(e).__name__}: {e}"
    try:
        from ..capture.link import link_for_device  # written beside this check; may be absent
    except Exception as e:  # noqa: BLE001
        info["link"] = f"unavailable ({type(e).__name__}: {e})"
    else:
        try:
            t0 = time.perf_counter()
            info["link"] = _jsonable(link_for_device(device))
            info["link_seconds"] = round(time.perf_counter() - t0, 2)
        except Exception as e:  # noqa: BLE001
            info["link"] = f"error: {type(e).__name__}: {e}"
    return info


# -- one variant, in its own process ----------------------------------------------------------

def gpt2_case(*, layers: int, width: int, heads: int, seq: int, batch: int, vocab: int,
              device: str = "cpu", dtype: str = "float32", seed: int = 0):
    """A zoo-style GPT-2 case of any size (:mod:`remat.zoo.transformers_models`), built on the
    CPU in float32 from ``seed`` and moved to ``device`` and ``dtype``."""
    import torch

    from ..zoo.registry import Case
    from ..zoo.transformers_models import GPT2Loss, _layer_names, gpt2_tiny

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2Loss(gpt2_tiny(n_layer=layers, n_embd=width, n_head=heads, vocab=vocab, positions=seq))
        ids = torch.randint(0, vocab, (batch, seq))
    model = model.to(device=device, dtype=getattr(torch, dtype)).train()
    return Case(name="gpt2", size=f"{layers}x{width}", kind="model", model=model, inputs=(ids.to(device),),
                loss=lambda out: out, blocks=_layer_names(model, layers), batch=batch,
                description=f"GPT-2 {layers} layers x {width}, {batch} x {seq} tokens, vocab {vocab}, {dtype}")


def _case(spec: dict):
    from .. import zoo

    m = spec["model"]
    if m.get("zoo"):
        import torch
        return zoo.build(m["zoo"], m.get("size", "tiny"), device=spec["device"],
                         dtype=getattr(torch, spec.get("dtype", "float32")))
    return gpt2_case(**{k: m[k] for k in ("layers", "width", "heads", "seq", "batch", "vocab")},
                     device=spec["device"], dtype=spec.get("dtype", "float32"))


def _pending() -> int | None:
    try:
        from .ao_standin import pending
        return pending()
    except Exception:  # noqa: BLE001 - a torch without the ao ops
        return None


def cuda_peaks(step, device) -> tuple[int, int]:
    """(allocated, reserved) peak bytes of one ``step()`` above those at its start (CUDA)."""
    import torch

    dev = torch.device(device)
    gc.collect()
    torch.cuda.synchronize(dev)
    alloc0, resv0 = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    step()
    torch.cuda.synchronize(dev)
    return (int(torch.cuda.max_memory_allocated(dev) - alloc0),
            int(torch.cuda.max_memory_reserved(dev) - resv0))


def plan_fields(plans: list, released: int | None = None) -> dict:
    """What a variant's plans say: offloads (schedule statements; PyTorch's offloading: its
    forward's transfers), predicted time (summed over graphs) and peak above the step's start
    (the largest graph's; ``released``: the gradient bytes the step frees as it starts, else
    those the graphs return)."""
    from .measure import gradient_bytes

    if not plans:
        return {}
    offloads, transfers, peak, seconds = 0, None, None, 0.0
    for p in plans:
        if p.transfers is not None:
            transfers = (transfers or 0) + p.transfers
        with contextlib.suppress(Exception):
            offloads += sum(s.op == "offload" for s in p.schedule().statements)
        if p.sim is not None and p.graph is not None:
            grads = gradient_bytes(p.graph) if released is None else released
            rel = int(p.sim.peak_bytes - p.sim.constant_bytes - grads)
            peak = rel if peak is None else max(peak, rel)
        seconds += float(p.predicted_seconds or 0.0)
    return {"graphs": len(plans), "solver": sorted({p.solver for p in plans}),
            "offloads": transfers if transfers is not None else offloads,
            "transfers": transfers, "pred_peak_bytes": peak, "pred_ms": seconds * 1e3,
            "statuses": sorted({p.status for p in plans})}


class _Row(dict):
    """A row that rewrites its file whenever it changes phase (kept if the process dies)."""

    def __init__(self, path: str | None, **kw):
        super().__init__(**kw)
        self.path = path

    def save(self, **kw) -> None:
        self.update(kw)
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self, f, default=repr)
            os.replace(tmp, self.path)


def run_variant(spec: dict, path: str | None = None) -> dict:
    """Run one variant in this process (see the module docstring); ``spec``: ``name``,
    ``method``, ``model`` (``{"zoo": name, "size": size}`` or GPT-2 dimensions), ``device``,
    ``dtype``, ``compiler``, ``strict``, ``functorch`` (config set first), ``steps`` (timed
    steps; 0: none), ``standin`` (install :mod:`remat.bench.ao_standin`), ``threads`` (torch's
    CPU threads), ``torch_offload_waits`` (``torch-offload``'s ``waits``:
    :func:`remat.lower.torch_offload.torch_offload`). The row is also written to ``path`` at each
    phase."""
    import torch
    import torch._functorch.config as functorch_config

    from ..errors import RematFallbackWarning
    from . import measure as M
    from .methods import parse_method
    from .measure import graph_caches_off as _graph_caches_off

    row = _Row(path, stage=spec.get("stage"), variant=spec["name"], method=spec["method"],
               compiler=spec["compiler"], device=spec["device"], status="started", phase="setup")
    row.save()
    if spec.get("standin"):
        from . import ao_standin
        ao_standin.install()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    for k, v in (spec.get("functorch") or {}).items():
        setattr(functorch_config, k, v)
    if spec.get("torch_offload_waits"):
        import functools

        from ..lower import torch_offload as tc
        from ..lower import partitioner
        partitioner.TORCH_PARTITIONERS["torch-offload"] = functools.partial(
            tc.torch_offload, waits=spec["torch_offload_waits"])
    device = spec["device"]
    cuda = device.startswith("cuda")
    with warnings.catch_warnings(record=True) as caught, _graph_caches_off(kernel_cache=True):
        warnings.simplefilter("always")
        try:
            if spec.get("stage") == "eager":
                from .eager import run_gpu_check_variant
                run_gpu_check_variant(spec, row, _case(spec))
            else:
                _run(spec, row, torch, M, parse_method)
        except Exception as e:  # noqa: BLE001 - the row says what failed, and where
            row["status"] = M.error_status(e)
            row["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2500:]
        row["fallbacks"] = sum(issubclass(w.category, RematFallbackWarning) for w in caught)
        row["warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:200]}" for w in caught
                                  if w.category.__module__.startswith("remat")})
    row["pending"] = _pending()
    if cuda:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
    row.save(done=True)
    return dict(row)


def _run(spec: dict, row: _Row, torch, M, parse_method) -> None:
    import remat

    device, cuda = spec["device"], spec["device"].startswith("cuda")
    case = _case(spec)
    row.save(case=case.description, batch=case.batch, phase="eager reference")
    # eager autograd on a copy of the same weights: the reference gradients (kept on the CPU)
    ref_model = copy.deepcopy(case.model)
    case.loss(ref_model(*case.inputs)).backward()
    ref = [p.grad.detach().float().cpu() for p in ref_model.parameters()]
    del ref_model
    M.free_memory(device, reset_dynamo=False)

    model = copy.deepcopy(case.model)
    inputs = tuple(x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                   for x in case.inputs)
    plans: list = []

    def on_plan(graph, plan) -> None:
        plans.append(plan)
        row.save(phase="planned, first step", **plan_fields(plans))

    method = parse_method(spec["method"])
    fn = remat.compile(model, dynamic=False, **method.compile_options(
        compiler=spec["compiler"], strict=bool(spec.get("strict")), on_plan=on_plan))
    held = list(model.parameters()) + [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def step():
        for t in held:
            t.grad = None
        loss = case.loss(fn(*inputs))
        loss.backward()
        return loss.detach()

    row.save(phase="compile, first step")
    t0 = time.perf_counter()
    step()
    M._sync(device)
    row["first_s"] = time.perf_counter() - t0
    got = [p.grad.detach().float().cpu() if p.grad is not None else None for p in model.parameters()]
    missing = sum(g is None for g in got)
    diff = max((float((g - r).abs().max()) for g, r in zip(got, ref) if g is not None), default=math.nan)
    scale = max((float(r.abs().max()) for r in ref), default=0.0)
    row.save(phase="measuring", grad_err=diff, grad_rel=diff / scale if scale > 0 else diff,
             missing_grads=missing, pending_after_first=_pending(), **plan_fields(plans))
    if not spec.get("steps"):
        row["status"] = "ok"
        return
    released = M.released_gradient_bytes(step, held)
    resident = list(model.buffers()) + [x for x in inputs if isinstance(x, torch.Tensor)]
    if cuda:
        step()  # warm
        alloc, resv = cuda_peaks(step, device)
    else:
        pm = M.peak_memory(step, device, warmup=1, timeline=False, held=held + resident)
        alloc, resv = pm.peak_bytes, None
    row.save(phase="timing", peak_bytes=alloc, reserved_bytes=resv, released_bytes=released,
             **plan_fields(plans, released))
    t = M.step_time({spec["name"]: step}, repeats=int(spec["steps"]), warmup=1, device=device)[spec["name"]]
    if t.error:
        raise RuntimeError(t.error)
    row.save(step_ms=t.median_s * 1e3, step_ms_min=min(t.samples) * 1e3 if t.samples else None,
             status="ok", phase="done")


# -- the parent: one process per variant ------------------------------------------------------

def run_isolated(spec: dict, out_dir: Path, timeout: float) -> dict:
    """:func:`run_variant` in a new Python process, with ``timeout`` seconds. A crash, a hang or
    a failure to start is a row with ``status`` ``"crashed: SIGSEGV"`` / ``"timeout"`` / ...
    that keeps what the process wrote before it."""
    rows = out_dir / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    name = f"{spec.get('stage')}_{spec['name']}_{spec['compiler']}"
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    path, log = rows / f"{slug}.json", rows / f"{slug}.log"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "remat.bench.gpu_check", "--child", json.dumps(spec), "--row", str(path)]
    t0 = time.perf_counter()
    status = None
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc, status = None, f"timeout after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    try:
        row = json.loads(path.read_text())
    except Exception:  # noqa: BLE001 - nothing written (it died at import)
        row = {"stage": spec.get("stage"), "variant": spec["name"], "method": spec["method"],
               "compiler": spec["compiler"], "device": spec["device"]}
    if status is None and rc not in (0, None):
        try:
            status = f"crashed: {signal.Signals(-rc).name}" if rc < 0 else f"exited {rc}"
        except ValueError:
            status = f"exited {rc}"
    if status is not None:
        row["status"] = f"{status} ({row.get('phase', 'before setup')})"
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        row.setdefault("error", "\n".join(tail))
    row["wall_s"] = wall
    row["log"] = str(log)
    return row


# -- the table --------------------------------------------------------------------------------

_COLUMNS = [("stage", "stage"), ("variant", "variant"), ("compiler", "compiler"), ("status", "status"),
            ("first_s", "first s"), ("grad_rel", "grad err (rel)"), ("peak_bytes", "peak MiB"),
            ("reserved_bytes", "reserved MiB"), ("step_ms", "step ms"), ("pred_peak_bytes", "pred MiB"),
            ("pred_ms", "pred ms"), ("offloads", "offloads"), ("pending", "pending"),
            ("fallbacks", "fallbacks"), ("wall_s", "wall s")]


def _cell(key: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if key.endswith("_bytes"):
        return f"{v / 2**20:.2f}"
    if key == "grad_rel":
        return f"{v:.1e}"
    if key in ("first_s", "wall_s"):
        return f"{v:.1f}"
    if key in ("step_ms", "pred_ms"):
        return f"{v:.3g}"
    if key == "status":
        return str(v)[:48]
    return str(v)


def table(rows: Iterable[dict], title: str = "") -> str:
    """The rows as a plain text table."""
    rows = list(rows)
    head = [h for _, h in _COLUMNS]
    body = [[_cell(k, r.get(k)) for k, _ in _COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = ([title] if title else []) + [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    return "\n".join(out)


def print_table(rows: list[dict], title: str = "") -> None:
    """The table with rich on a terminal, else (a log, a pipe) plain text."""
    if not sys.stdout.isatty():
        print(table(rows, title), flush=True)
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(table(rows, title), flush=True)
        return
    t = Table(title=title or None)
    for _, h in _COLUMNS:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*(_cell(k, r.get(k)) for k, _ in _COLUMNS))
    Console(width=max(160, shutil.get_terminal_size((160, 40)).columns)).print(t)


# -- main -------------------------------------------------------------------------------------

def _variants(args) -> list[dict]:
    device, cpu = args.device, args.cpu
    base = {"device": device, "dtype": args.dtype, "standin": cpu, "threads": args.threads}
    specs: list[dict] = []
    if "offload" in args.stages:
        for model in ("mlp", "unet"):
            for compiler in ("eager", "inductor"):
                specs.append({**base, "stage": "offload", "name": f"{model}-swap-{OFFLOAD_BUDGET}",
                              "method": f"swap:budget={OFFLOAD_BUDGET},time_limit={args.time_limit:g}",
                              "model": {"zoo": model, "size": "tiny"}, "compiler": compiler,
                              "strict": True, "steps": 0, "dtype": "float32"})
    if "gpt2" in args.stages:
        dims = GPT2_CPU if cpu else GPT2_GPU
        model = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in dims.items()}
        wanted = set(args.variants.split(",")) if args.variants else None
        wait_args = ao_schemas()["wait_tensor"]
        for v in GPT2_VARIANTS:
            if wanted and v["name"] not in wanted:
                continue
            if v.get("needs") and v["needs"] not in wait_args:
                specs.append({**base, **v, "stage": "gpt2", "compiler": args.compiler,
                              "skip": f"skipped: ao.wait_tensor has no {v['needs']} ({wait_args})"})
                continue
            method = v["method"].replace(f"time_limit={TIME_LIMIT:g}", f"time_limit={args.time_limit:g}")
            specs.append({**base, **v, "method": method, "stage": "gpt2", "model": model,
                          "compiler": args.compiler, "steps": args.steps})
    if "eager" in args.stages:
        from .eager import GPU_CHECK_VARIANTS

        dims = GPT2_CPU if cpu else GPT2_GPU
        model = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in dims.items()}
        for v in GPU_CHECK_VARIANTS:
            specs.append({**base, **v, "standin": False, "stage": "eager", "model": model,
                          "compiler": "none", "steps": args.steps})
    return specs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description="remat's short GPU check: preflight, an offload "
                                 "micro-test and GPT-2 variants, one process each (--cpu: on this CPU)")
    ap.add_argument("out", nargs="?", default="gpu_check_out", help="folder for preflight.json and rows.jsonl")
    ap.add_argument("--cpu", action="store_true", help="run on this CPU with PyTorch's ao ops on CPU stand-ins")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated: {', '.join(STAGES)}")
    ap.add_argument("--variants", default="", help="GPT-2 variants to run (default all: "
                    + ", ".join(v["name"] for v in GPT2_VARIANTS) + ")")
    ap.add_argument("--compiler", default="inductor", choices=["inductor", "eager"], help="GPT-2 stage's")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per GPT-2 variant (median)")
    ap.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="remat solvers' seconds per graph")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per variant's process (default 150 on a GPU, 120 on a CPU)")
    ap.add_argument("--deadline", type=float, default=570.0,
                    help="seconds for the whole check: variants not started by then are skipped")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="GPT-2's dtype")
    for k, v in GPT2_GPU.items():
        ap.add_argument(f"--{k}", type=int, default=None,
                        help=f"GPT-2's {k} (default {v} on a GPU, {GPT2_CPU[k]} with --cpu)")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads per process "
                    "(default 1 with --cpu, torch's own on a GPU)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in args.stages if s not in STAGES]
    if bad:
        ap.error(f"unknown stage(s) {bad}; stages: {', '.join(STAGES)}")
    args.device = "cpu" if args.cpu else "cuda"
    if args.timeout is None:
        args.timeout = 120.0 if args.cpu else 150.0
    if args.threads is None and args.cpu:
        args.threads = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        row = run_variant(json.loads(args.child), args.row)
        print(json.dumps(row, default=repr))
        return 0
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.cpu:
        import torch
        if not torch.cuda.is_available():
            print("gpu_check: torch sees no CUDA GPU; pass --cpu to run the stages on this CPU", file=sys.stderr)
            return 2
    if "preflight" in args.stages:
        info = preflight(args.device)
        if args.cpu:
            info["ao_standin"] = "each variant's process runs PyTorch's ao ops on CPU stand-ins"
        (out / "preflight.json").write_text(json.dumps(info, indent=2, default=repr))
        print("== preflight", flush=True)
        for k in ("torch", "torch_cuda", "transformers", "gpu", "nvidia_smi", "ao_problem", "offload_support",
                  "ao_standin", "link"):
            if k in info:
                print(f"  {k}: {info[k]}", flush=True)
        for op, schema in info["ao_schemas"].items():
            print(f"  ao.{op}: {schema}", flush=True)
    specs = _variants(args)
    rows: list[dict] = []
    jsonl = out / "rows.jsonl"
    jsonl.write_text("")
    for spec in specs:
        left = args.deadline - (time.perf_counter() - start)
        label = f"{spec['stage']} {spec['name']} ({spec['compiler']})"
        if spec.get("skip") or left < 20:
            row = {k: spec[k] for k in ("stage", "compiler", "device", "method")}
            row.update(variant=spec["name"],
                       status=spec.get("skip") or f"skipped: the check's {args.deadline:.0f} s are spent")
        else:
            print(f"== {label} ...", flush=True)
            row = run_isolated(spec, out, min(args.timeout, left))
        rows.append(row)
        with open(jsonl, "a") as f:
            f.write(json.dumps(row, default=repr) + "\n")
        print(f"   {label}: {str(row.get('status'))[:300]} in {row.get('wall_s', 0):.0f} s; "
              + ", ".join(f"{h} {_cell(k, row.get(k))}" for k, h in _COLUMNS[4:-1]), flush=True)
    wall = time.perf_counter() - start
    print_table(rows, f"gpu_check on {args.device} ({wall:.0f} s)")
    (out / "summary.json").write_text(json.dumps({"wall_s": wall, "device": args.device, "rows": len(rows),
                                                  "ok": sum(r.get("status") == "ok" for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
