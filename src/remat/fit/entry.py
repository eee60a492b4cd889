"""``remat.fit``: will a model's training step fit a GPU you do not have, at what batch or
sequence, and at what cost."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

from ..cost.model import CostModel
from ..errors import OptionError
from ..plans.budget import Budget
from .family import GraphFamily
from .fitting import fit_checkmate, fit_family, without_input_bytes
from .methods import (
    CHECKMATE_METHODS,
    DEFAULT_CHECKMATE_METHODS,
    DEFAULT_METHODS,
    METHODS,
    check_methods,
)
from .result import FitResult
from .states import ITEMSIZE, dtype_name, model_states

CAPTURE_BATCHES = (2, 3, 4)
"""The batch sizes the step is captured at (the search scales from them)."""

CAPTURE_SEQUENCES = (64, 96, 128)
"""The sequence lengths the step is captured at with ``sequence=True``."""

CHECKMATE_MEMORY = 16 * 1000**3
"""The Checkmate artifact's GPU: a 16 GB V100 (``platform_memory("p32xlarge")``, decimal bytes)."""

CHECKMATE_PARAMS = {"VGG16": 138_357_544, "VGG19": 143_667_240, "MobileNet": 4_253_864,
                    "ResNet50": 25_636_712}
"""Parameter counts of the Keras models behind Checkmate's graphs (ImageNet heads, 224x224x3),
float32; the artifact charges ``2 x params x 4`` bytes (weights and gradients) as fixed."""

CHECKMATE_PUBLISHED = {"VGG19": {"checkpoint-all": 167, "chen-sqrtn": 197, "chen-greedy": 266, "checkmate": 289},
                       "vgg_unet": {"checkmate": 57}, "fcn_8_vgg": {"checkmate": 60}, "segnet": {"checkmate": 62},
                       "ResNet50": {"checkmate": 193}, "MobileNet": {"checkmate": 1105}}
"""The maximum batch sizes Checkmate's artifact published (VGG19's MILP proved optimal; the
others the MILP's best within its time limit)."""


def _bytes(value, what: str) -> int:
    """Bytes given as a number or with a unit (``"80GiB"``, ``"16e9"``)."""
    if isinstance(value, (int, float)):
        out = value
    else:
        text = str(value).strip()
        try:
            out = float(text)
        except ValueError:
            try:
                b = Budget.parse(text)
            except Exception as e:
                raise OptionError(f"{what} {value!r}: give bytes, with a unit or not (80GiB, 16e9)") from e
            if b.kind != "bytes":
                raise OptionError(f"{what} {value!r}: give bytes, with a unit or not (80GiB, 16e9)") from None
            out = b.value
    if not out >= 0:
        raise OptionError(f"{what} {value!r} must be a size in bytes >= 0")
    return int(out)


def _capacity(gpu, memory, reserve) -> tuple[int, object, str]:
    from ..cost.profiles import memory_bytes, resolve_profile

    profile = resolve_profile(gpu) if gpu is not None else None
    if memory is not None:
        cap = _bytes(memory, "memory")
    else:
        cap = memory_bytes(profile) if profile is not None else None
        if cap is None:
            raise OptionError(f"the device {gpu!r} records no memory size; pass memory= (--memory 80GiB)")
    cap -= _bytes(reserve or 0, "reserve")
    if cap <= 0:
        raise OptionError(f"no memory left to fit into ({cap} bytes): check memory= and reserve=")
    return cap, profile, (profile.name if profile is not None else "memory given")


def fit(model: str, gpu: str | None = None, *, optimizer: str = "adamw", dtype: str = "bf16",
        master_weights: bool | None = None, gpus: int = 1, sequence: bool = False,
        batch: int | None = None, seq_len: int | None = None, size: str = "full",
        methods=None, memory: int | str | None = None, reserve: int | str = 0,
        time_limit: float | None = 60.0, max_size: int | None = None, abstract: bool = True,
        log: Callable[[str], None] | None = None) -> FitResult:
    """The largest batch (``sequence=True``: sequence) ``model``'s training step fits on
    ``gpu``, per method (:data:`remat.fit.methods.METHODS`), with its predicted peak and step
    time.

    - ``model``: a zoo entry (at zoo ``size``), a transformers config JSON, ``"module:factory"``
      (:mod:`remat.fit.workload`), or ``"checkmate:VGG19"`` for one of Checkmate's graphs
      (their paper's maximum-batch experiment: its strategies, a 16 GB V100 unless ``gpu`` or
      ``memory`` says otherwise, cost at most one extra forward pass).
    - ``gpu``: a GPU name (``"H100"``, the default, ``"A100-40GB"``, ...) or a profile file
      (:func:`remat.cost.profiles.resolve_profile`); ``memory`` overrides its memory,
      ``reserve`` is taken off it (the CUDA context, fragmentation).
    - ``optimizer``, ``dtype``, ``master_weights``, ``gpus`` (FSDP2 shards): the model states'
      bytes (:func:`remat.fit.states.model_states`).
    - ``batch`` (with ``sequence=True``) and ``seq_len`` (when searching the batch): the size
      held fixed; ``max_size``: the largest size tried.
    - ``abstract`` (default): the model built on the meta device and captured on fake tensors,
      nothing allocated (a zoo entry or a config; a factory builds as it likes); False: built
      and run for real here.

    >>> r = remat.fit("gpt2", "H100", size="tiny", methods="none,remat-min")  # doctest: +SKIP
    >>> r.method("remat-min").size >= r.method("none").size                    # doctest: +SKIP
    True
    """
    t0 = time.perf_counter()
    if isinstance(model, str) and model.startswith("checkmate:"):
        return _fit_checkmate(model.split(":", 1)[1], gpu, methods, memory, reserve, time_limit, max_size, log, t0)
    names = check_methods(methods or DEFAULT_METHODS, METHODS)
    dt = dtype_name(dtype)
    model_states(0, optimizer=optimizer, dtype=dt, master_weights=master_weights, shards=gpus)  # the names, first
    capacity, profile, gpu_label = _capacity("H100" if gpu is None else gpu, memory, reserve)
    if profile is None:
        from ..cost.profiles import resolve_profile

        profile = resolve_profile("H100", dtype=dt)
    from .workload import block_param_bytes, capture_step, param_count, workload

    w = workload(model, size=size, dtype=dt, sequence=seq_len, abstract=abstract)
    if sequence and w.sequence is None:
        raise OptionError(f"{w.name} has no sequence dimension remat fit can change; search the batch instead")
    what = "sequence" if sequence else "batch"
    sizes = CAPTURE_SEQUENCES if sequence else CAPTURE_BATCHES
    graphs, step = [], None
    for s in sizes:
        step = w.step(batch or 1, s) if sequence else w.step(s, seq_len or w.sequence)
        if log:
            log(f"capturing {w.name} at {what} {s}")
        graphs.append(_retarget(capture_step(step, _graph_name(w.name)), profile, dt))
    capture_seconds = time.perf_counter() - t0
    family = GraphFamily(sizes, graphs, what)
    n = param_count(step.model)
    states = model_states(n, optimizer=optimizer, dtype=dt, master_weights=master_weights, shards=gpus)
    block = block_param_bytes(step)
    gather = 2 * block + block  # two blocks' parameters gathered, one block's gradients unsharded
    longest = w.max_sequence if sequence else None
    cm = CostModel(profile, fused_memory=True)
    fits = fit_family(family, cm, capacity, states, methods=names, blocks=step.blocks,
                      full_param_bytes=n * ITEMSIZE[dt], gather_bytes=gather,
                      max_size=max_size or longest or (1 << 16), time_limit=time_limit, log=log)
    setup = {"optimizer": states.optimizer, "dtype": dt, "gpus": int(gpus), "captured_at": list(sizes),
             "fixed": {"batch": batch or 1} if sequence else {"sequence": seq_len or w.sequence},
             "profile": profile.name, "abstract": bool(abstract), "graph_nodes": len(family), "blocks": len(step.blocks),
             "fsdp_gather_bytes": gather if gpus > 1 else 0}
    return FitResult(w.name, gpu_label, what, capacity, states.to_dict(), fits, setup, capture_seconds,
                     time.perf_counter() - t0)


def _graph_name(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_") or "step"


def _retarget(g, profile, dtype: str):
    """``g`` as a step on the GPU ``profile`` describes: its device (the cost model's and the
    host link's), inductor's fused kernels."""
    meta = copy.deepcopy(g.meta)
    meta["device"] = {"type": "cuda", "name": profile.name, "dtype": dtype}
    meta["compiler"] = "inductor"
    g.meta = meta
    return g


def _fit_checkmate(name, gpu, methods, memory, reserve, time_limit, max_size, log, t0) -> FitResult:
    from ..data import checkmate_path
    from ..graph.io import load_graph

    names = check_methods(methods or DEFAULT_CHECKMATE_METHODS, CHECKMATE_METHODS)
    if gpu is None and memory is None:
        capacity, label = CHECKMATE_MEMORY - _bytes(reserve or 0, "reserve"), "V100 16 GB (Checkmate's)"
    else:
        capacity, _, label = _capacity(gpu, memory, reserve)
    g = without_input_bytes(load_graph(checkmate_path(name)))
    params = CHECKMATE_PARAMS.get(name)
    fixed = 2 * 4 * (params or 0)
    fits = fit_checkmate(g, capacity, fixed, methods=names, time_limit=time_limit,
                         max_size=max_size or (1 << 16), log=log)
    published = CHECKMATE_PUBLISHED.get(name, {})
    fits = [f if f.method not in published else
            type(f)(**{**f.__dict__, "note": (f.note + "; " if f.note else "") + f"published {published[f.method]}"})
            for f in fits]
    if "checkmate" in published and "checkmate" not in names and "checkmate-lp" in names:
        fits = [f if f.method != "checkmate-lp" else
                type(f)(**{**f.__dict__, "note": f"{f.note}; published MILP {published['checkmate']}".lstrip("; ")})
                for f in fits]
    why = (f"2 x {params:,} params x 4 B, as the artifact" if params else "parameters unknown: none charged")
    return FitResult(f"checkmate:{name}", label, "batch", int(capacity),
                     {"total": fixed, "why": why}, fits,
                     {"graph": g.name, "cost_limit": "one extra forward pass (eq. 10)", "published": published},
                     0.0, time.perf_counter() - t0)
