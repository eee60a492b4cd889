"""First calls and planning time of a transformers Llama as it deepens (issue 39, items 5 and 6).

One (depth, method) per fresh interpreter (:func:`in_subprocess`; caches off, dynamo reset):
the first call (compile + the first forward and backward), a steady step after it, the peak
RSS, and where the compile's seconds went, by clocks wrapped around PyTorch's and remat's
partitioning functions in that process only (:func:`install_clocks`, no change to remat):

- ``torch_partition``: ``min_cut_rematerialization_partition`` (plain torch.compile's
  partitioner, the knob's, and remat's reference partition);
- remat's partitioner (``RematPartitioner.__call__``, ``partition``) split into ``reference``
  (PyTorch's min cut as a fraction's reference: :meth:`StepPlanner.needs_reference`),
  ``prepare`` (``prepare_joint``), ``capture`` (the joint graph to remat's Graph), ``solve``
  (:meth:`StepPlanner.plan`), ``split`` (a plan's fissions unrolled), ``lower`` (the plan to
  fx modules) and ``fallback``; each clock counts its own time, nested clocks' time not
  included (``partition`` is the whole call).

The methods (:data:`METHODS`): plain ``torch.compile`` (``aot_eager_decomp_partition`` under
the eager compiler, inductor's ``compile_fx`` under inductor: :func:`remat.bench.budgets.plain_compile`),
PyTorch's knob at ``activation_memory_budget`` 0.5, and ``remat.compile(model, compiler=...,
cache=False)`` with no budget, at 0.5 and at ``"min"``.

>>> sorted(METHODS)
['knob 0.5', 'remat', 'remat 0.5', 'remat min', 'torch.compile']
>>> ratios([{"depth": 2, "compiler": "eager", "method": "torch.compile", "first_s": 2.0},
...         {"depth": 2, "compiler": "eager", "method": "remat 0.5", "first_s": 3.0}])[0]["ratio"]
1.5
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

METHODS: dict[str, dict[str, Any]] = {
    "torch.compile": {"kind": "plain"},
    "knob 0.5": {"kind": "knob", "budget": 0.5},
    "remat": {"kind": "remat"},
    "remat 0.5": {"kind": "remat", "budget": 0.5},
    "remat min": {"kind": "remat", "budget": "min"},
}
"""Method name -> what it compiles with."""

BARS = {"remat": 1.05, "remat 0.5": 1.25, "remat min": 1.25}
"""The issue's bars on the first call over plain torch.compile's (item 6)."""

ALLOWANCE = 1.10
"""The time limit counts as held when a graph's solve took at most 1.1 x the limit."""

WIDTHS = {"hidden": 128, "heads": 4, "kv_heads": 4, "intermediate": 344, "vocab": 1000, "batch": 1, "seq": 128}
"""The Llama's widths: small, so that depth is what grows."""

# -- the model ----------------------------------------------------------------------------------


def llama(depth: int, seed: int = 0):
    """A transformers ``LlamaForCausalLM`` of ``depth`` layers at :data:`WIDTHS`, its loss as
    the output (``LMLoss``), and its input ids: ``(model, (ids,))``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from remat.zoo.transformers_models import LMLoss
    from remat.zoo.trials import _install_output_hooks

    w = WIDTHS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = LlamaForCausalLM(LlamaConfig(vocab_size=w["vocab"], hidden_size=w["hidden"],
                                          intermediate_size=w["intermediate"], num_hidden_layers=depth,
                                          num_attention_heads=w["heads"], num_key_value_heads=w["kv_heads"],
                                          max_position_embeddings=max(w["seq"], 256), attention_dropout=0.0,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                          tie_word_embeddings=False, use_cache=False))
        lm.loss_type = "ForCausalLM"  # otherwise the loss breaks the graph
        ids = torch.randint(0, w["vocab"], (w["batch"], w["seq"]))
    model = LMLoss(lm).train()
    _install_output_hooks(model)
    return model, (ids,)


# -- clocks ---------------------------------------------------------------------------------------


class Clocks:
    """Exclusive timers: each clock's own seconds (``own``, a nested clock's time taken out)
    and its whole seconds (``whole``), and how often it ran (``calls``)."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.whole: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[float]] = []  # [start, nested seconds]
        self.facts: dict[str, Any] = {}

    def wrap(self, name: str, fn: Callable) -> Callable:
        if getattr(fn, "_first_call_clock", None) is self:
            return fn

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            frame = [time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                took = time.perf_counter() - frame[0]
                self.whole[name] = self.whole.get(name, 0.0) + took
                self.own[name] = self.own.get(name, 0.0) + took - frame[1]
                self.calls[name] = self.calls.get(name, 0) + 1
                if self._stack:
                    self._stack[-1][1] += took

        timed._first_call_clock = self
        return timed


_TORCH_MODULES = ("torch._functorch.partitioners", "torch._dynamo.backends.debugging", "torch._inductor.compile_fx")


def install_clocks(clocks: Clocks) -> None:
    """Wrap PyTorch's min cut where its callers look it up, and remat's partitioner's stages
    (in this process: the benchmark's child)."""
    for name in _TORCH_MODULES:
        mod = importlib.import_module(name)
        fn = getattr(mod, "min_cut_rematerialization_partition", None)
        if fn is not None:
            def counted(*args, _fn=fn, **kwargs):
                clocks.facts["joint_nodes"] = max(clocks.facts.get("joint_nodes", 0), len(args[0].graph.nodes))
                return _fn(*args, **kwargs)

            mod.min_cut_rematerialization_partition = clocks.wrap("torch_partition", functools.wraps(fn)(counted))
    from remat.capture import joint as tc
    from remat.lower import partitioner as rp
    from remat.step import planner as sp

    P = rp.RematPartitioner
    P.__call__ = clocks.wrap("partition", P.__call__)
    P._reference_saved = staticmethod(clocks.wrap("reference", P._reference_saved))
    P._capture = clocks.wrap("capture", P._capture)
    P._split = clocks.wrap("split", P._split)
    tc.prepare_joint = clocks.wrap("prepare", tc.prepare_joint)
    rp.lower = clocks.wrap("lower", rp.lower)
    rp.fall_back = clocks.wrap("fallback", rp.fall_back)
    sp.StepPlanner.plan = clocks.wrap("solve", sp.StepPlanner.plan)


def _record_plans(plans: list) -> None:
    """Append each plan the step planner returns to ``plans`` (in this process)."""
    from remat.step import planner as sp

    plan = sp.StepPlanner.plan

    @functools.wraps(plan)
    def recorded(self, graph, split=None):
        lowered, p = plan(self, graph, split)
        plans.append(p)
        return lowered, p

    sp.StepPlanner.plan = recorded


# -- one (depth, method), in this process -----------------------------------------------------------


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def caches_off() -> None:
    """Every compile partitions afresh: inductor's and AOTAutograd's caches off, remat's plan
    cache off, dynamo reset (as :mod:`benchmarks.budgets_vs_torch` does)."""
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    os.environ["REMAT_CACHE_DIR"] = "off"
    import torch
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    inductor_config.force_disable_caches = True
    functorch_config.enable_autograd_cache = False
    torch._dynamo.reset()


def first_call(depth: int, method: str, compiler: str = "eager", time_limit: float | None = None,
               profile: str | None = None, steps: int = 2) -> dict:
    """Build the Llama of ``depth`` layers, compile it with ``method`` (a key of :data:`METHODS`)
    through ``compiler``, and time its first call and ``steps`` steady steps after. In this
    process (:func:`in_subprocess` gives it a fresh one). ``profile``: a path for the first
    call's cProfile stats. Returns the row."""
    caches_off()
    import warnings

    import remat
    from remat.bench.budgets import knob, plain_compile
    from remat.zoo.trials import make_step

    m = METHODS[method]
    clocks = Clocks()
    install_clocks(clocks)
    model, inputs = llama(depth)
    rss_base = _rss_mb()
    plans: list = []
    ctx: contextlib.AbstractContextManager = contextlib.nullcontext()
    if m["kind"] == "remat":
        _record_plans(plans)  # not on_plan: a graph handed to a callback records PyTorch's
        # reference partition, which a user's remat.compile(model) without one does not run
        kw: dict = {"compiler": compiler, "cache": False, "dynamic": False}
        if "budget" in m:
            kw["budget"] = m["budget"]
        if time_limit is not None:
            kw["time_limit"] = time_limit
        fn = remat.compile(model, **kw)
    else:
        fn = plain_compile(model, compiler)
        if m["kind"] == "knob":
            ctx = knob(m["budget"])
    step = make_step(fn, model, inputs, seed=0)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        with ctx:
            if prof is not None:
                prof.enable()
            step()
            if prof is not None:
                prof.disable()
        first = time.perf_counter() - t0
    if prof is not None:
        prof.dump_stats(profile)
    steady = []
    for _ in range(steps):
        t1 = time.perf_counter()
        step()
        steady.append(time.perf_counter() - t1)
    step_s = min(steady) if steady else 0.0
    own = clocks.own
    limit = time_limit if time_limit is not None else _default_time_limit()
    solve_max = max((p.solve_seconds for p in plans), default=None)
    row: dict[str, Any] = {
        "depth": depth, "compiler": compiler, "method": method, "status": "ok",
        "nodes": clocks.facts.get("joint_nodes") or (len(plans[0].graph) if plans else None),
        "first_s": round(first, 3), "step_s": round(step_s, 4), "compile_s": round(first - step_s, 3),
        "torch_partition_s": round(own.get("torch_partition", 0.0), 3),
        "partition_s": round(clocks.whole.get("partition", 0.0), 3) if plans else None,
        "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_base_mb": None if rss_base is None else round(rss_base),
    }
    if m["kind"] == "remat":
        for k in ("reference", "prepare", "capture", "solve", "split", "lower", "fallback"):
            row[f"{k}_s"] = round(own.get(k, 0.0), 3)
        row["reference_s"] = round(clocks.whole.get("reference", 0.0), 3)  # PyTorch's min cut inside it
        row["reference_calls"] = clocks.calls.get("reference", 0)
        row["plan_s"] = None if not plans else round(sum(p.solve_seconds for p in plans), 3)
        row["graphs"] = len(plans)
        row["solvers"] = ",".join(dict.fromkeys(p.solver for p in plans))
        row["plan_status"] = ",".join(dict.fromkeys(p.status for p in plans))
        row["limit_s"] = limit
        row["held"] = None if solve_max is None or limit is None else bool(solve_max <= ALLOWANCE * limit)
        row["stops"] = "; ".join(_stops(plans))
    row["warned"] = "; ".join(dict.fromkeys(
        f"{w.category.__name__}: {str(w.message).strip().splitlines()[0][:120]}" for w in caught
        if w.category.__module__.split(".")[0] == "remat"))
    return row


def _default_time_limit() -> float | None:
    from remat.solvers.registry import DEFAULT_TIME_LIMIT

    return DEFAULT_TIME_LIMIT


def _stops(plans: list) -> list[str]:
    """What a plan's ``tried`` list says stopped or was skipped (time limits among them)."""
    out: dict[str, None] = {}
    for p in plans:
        for t in p.tried:
            status = str(t.status)
            if status not in ("feasible", "optimal", "infeasible", "over budget"):
                out[f"{t.solver}: {status}"] = None
        work = p.details.get("offload_work") or {}
        for k, v in sorted((work.get("stops") or {}).items()):
            out[f"{k}: {v}"] = None
    return list(out)


# -- one (depth, method), in a fresh interpreter -----------------------------------------------------

CHILD = """
import json, sys
import torch
torch.set_num_threads({threads})
from remat.bench.first_call import first_call
row = first_call({depth}, {method!r}, {compiler!r}, {limit!r}, {profile!r})
print("ROW " + json.dumps(row))
"""


def in_subprocess(depth: int, method: str, compiler: str = "eager", time_limit: float | None = None,
                  threads: int = 1, profile: str | None = None, timeout: float | None = None) -> dict:
    """:func:`first_call` in a fresh interpreter (no compiled code, caches or allocations shared
    between rows): its row, or one with the failure in ``status``."""
    code = CHILD.format(threads=int(threads), depth=int(depth), method=method, compiler=compiler,
                        limit=time_limit, profile=profile)
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "REMAT_CACHE_DIR": "off"}
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"depth": depth, "compiler": compiler, "method": method, "status": f"timed out after {timeout:g} s"}
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        tail = (out.stderr.strip().splitlines() or [f"exit status {out.returncode} (killed: out of memory?)"])[-1]
        return {"depth": depth, "compiler": compiler, "method": method, "status": f"crashed: {tail[:120]}"}
    row = json.loads(rows[-1])
    row["process_s"] = round(time.perf_counter() - t0, 2)
    return row


# -- what the rows show ------------------------------------------------------------------------------


def ratios(rows: list[dict], reference: str = "torch.compile") -> list[dict]:
    """Each row's first call over plain torch.compile's at the same depth and compiler:
    ``{"depth", "compiler", "method", "first_s", "ratio", "bar", "meets"}`` (``bar``: the
    issue's, :data:`BARS`)."""
    base = {(r["depth"], r["compiler"]): r.get("first_s") for r in rows if r["method"] == reference}
    out = []
    for r in rows:
        if r["method"] == reference:
            continue
        b = base.get((r["depth"], r["compiler"]))
        ratio = None if not b or r.get("first_s") is None else round(r["first_s"] / b, 2)
        bar = BARS.get(r["method"])
        out.append({"depth": r["depth"], "compiler": r["compiler"], "method": r["method"],
                    "first_s": r.get("first_s"), "ratio": ratio, "bar": bar,
                    "meets": None if ratio is None or bar is None else ratio <= bar})
    return out


def attach_ratios(rows: list[dict], reference: str = "torch.compile") -> None:
    """Set each row's ``ratio``: its first call over plain torch.compile's at its depth and
    compiler (None until that row is there)."""
    base = {(r["depth"], r["compiler"]): r.get("first_s") for r in rows if r["method"] == reference}
    for r in rows:
        b = base.get((r["depth"], r["compiler"]))
        r["ratio"] = None if not b or r.get("first_s") is None else round(r["first_s"] / b, 2)


def depth_ratio(rows: list[dict], deep: int = 32, shallow: int = 4, key: str = "plan_s") -> list[dict]:
    """Planning at ``deep`` layers over ``shallow`` (item 5: budgeted at most 2x), per remat
    method: ``key`` (``plan_s``: the solvers' own seconds; ``partition_s``: remat's whole
    partitioner; ``first_s``: the first call)."""
    out = []
    for method in sorted({r["method"] for r in rows if r["method"].startswith("remat")}):
        for compiler in sorted({r["compiler"] for r in rows}):
            at = {r["depth"]: r.get(key) for r in rows if r["method"] == method and r["compiler"] == compiler}
            if at.get(deep) and at.get(shallow):
                out.append({"method": method, "compiler": compiler, "key": key, f"at {deep}": at[deep],
                            f"at {shallow}": at[shallow], "ratio": round(at[deep] / at[shallow], 2)})
    return out


def profile_summary(path: str, top: int = 25) -> dict[str, list[dict]]:
    """The top ``top`` functions of a cProfile dump by their own time (``tottime``), by their
    whole time (``cumtime``), and remat's and PyTorch's partitioners' (``remat/`` and
    ``torch/_functorch/partitioners``) by their whole time: ``{"own": [...], "whole": [...],
    "partitioners": [...]}``, each ``{"function", "calls", "own_s", "whole_s"}``."""
    import pstats

    st = pstats.Stats(path)
    entries = []
    for (file, line, name), (cc, nc, tt, ct, _callers) in st.stats.items():
        where = file if file.startswith("<") or file == "~" else f"{_short(file)}:{line}"
        entries.append({"function": f"{where}({name})", "calls": nc, "own_s": round(tt, 3), "whole_s": round(ct, 3)})
    return {"own": sorted(entries, key=lambda e: -e["own_s"])[:top],
            "whole": sorted(entries, key=lambda e: -e["whole_s"])[:top],
            "partitioners": sorted((e for e in entries if e["function"].startswith(("remat/", "torch/_functorch/partitioners"))
                                    and "bench/" not in e["function"] and "zoo/" not in e["function"]),
                                   key=lambda e: -e["whole_s"])[:top]}


def _short(file: str) -> str:
    for marker in ("site-packages/", "/src/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file
