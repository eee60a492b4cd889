"""What a split LM head costs inductor: its parts unrolled against its parts as one subgraph.

A transformers Llama whose logits dominate (:func:`remat.bench.fission.lm_case`: random
weights, mean cross-entropy with some labels at -100), compiled three ways, one fresh
interpreter per row (:func:`in_subprocess`; inductor's, AOTAutograd's and remat's caches off):

- ``torch.compile``: plain ``torch.compile`` with inductor (no remat);
- ``unrolled``: ``remat.compile`` with the final norm + LM head + cross-entropy split in n
  token parts (:data:`HEAD_SOLVER`), lowered as n copies of the region's ops
  (``REMAT_FISSION_LOOP=0``: :mod:`remat.lower.fission`);
- ``loop``: the same plan with the parts lowered as n calls of one subgraph
  (:mod:`remat.lower.fission_loop`), what ``remat.compile`` does.

Each row: the first call (compile, first forward and backward; wall and CPU seconds, the C++
compiles included: inductor compiles on one thread by default here, so that on a shared
machine the CPU seconds say what the wall seconds blur), the seconds inside inductor
(``compile_fx_inner``: lowering, scheduling, codegen and the kernels' C++ compile, for the
forward and the backward; wall and CPU), remat's partitioner, a steady step, the peak above the step's start
(:func:`remat.bench.harness.measure_peak`), the largest gradient difference from eager
autograd on the same weights and inputs, and the forward's and backward's op counts as inductor
lowers them (:func:`remat.lower.fission_loop.op_counts`: a subgraph's ops once).
"""

from __future__ import annotations

import copy
import os
import resource
import time
from typing import Any

METHODS = ("torch.compile", "unrolled", "loop")

HEAD_SOLVER = "bench-fission-head"
"""A solver of this benchmark's: the conservative min cut's saved set with the largest F-Tree
candidate outside the decoder layers (no node of a module under ``.layers.``: the final norm,
the LM head and the loss) split in ``parts`` parts (:func:`remat.bench.fission.fixed_fission`)."""


def head_fission(g, *, budget=None, cost_model=None, time_limit=None, parts: int = 4):
    """The plan of :data:`HEAD_SOLVER` on ``g``."""
    from remat.bench.fission import fixed_fission
    from remat.cost.model import default_cost_model
    from remat.plans.schedule import schedule_from_saved_set
    from remat.plans.simulator import simulate
    from remat.solvers.magis.ftree import ftree
    from remat.solvers.magis.search import _resident_at_peak
    from remat.solvers.mincut import mincut
    from remat.transforms.fission import illegal

    cm = cost_model or default_cost_model(g)
    s0 = schedule_from_saved_set(g, mincut(g, "conservative").saved_names)
    tree = ftree(g, _resident_at_peak(s0, simulate(s0, cm)))
    head = [f for f in tree.candidates if f.length % parts == 0 and illegal(g, f.with_n(parts)) is None
            and not any(".layers." in (g[v].meta.get("module") or "") for v in f.nodes)]
    if not head:
        return fixed_fission(g, budget=budget, cost_model=cm, parts=parts, candidate="(none outside the layers)")
    best = max(head, key=lambda f: (len(f.nodes), -f.index))
    return fixed_fission(g, budget=budget, cost_model=cm, parts=parts, candidate=best.label)


def register_head_solver() -> None:
    """Register :data:`HEAD_SOLVER` (once per process)."""
    from remat.solvers import registry

    if HEAD_SOLVER not in registry.names():
        registry.register(HEAD_SOLVER, "magis", "optional",
                          "benchmark: the LM head + loss split in a given number of parts", head_fission)


def _cpu_s() -> float:
    """CPU seconds of this process and of its children waited for (the C++ compiler's runs)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _clock_inductor() -> list[float]:
    """CPU seconds inside inductor's compile of each graph (``_compile_fx_inner``, which
    ``compile_fx_inner`` looks up when called), accumulated in the returned list's one item."""
    import torch._inductor.compile_fx as cfx

    inner, total = cfx._compile_fx_inner, [0.0]

    def clocked(*args, **kwargs):
        c0 = _cpu_s()
        try:
            return inner(*args, **kwargs)
        finally:
            total[0] += _cpu_s() - c0

    cfx._compile_fx_inner = clocked
    return total


def first_call(method: str, parts: int, config: dict[str, int], compile_threads: int = 1) -> dict[str, Any]:
    """One row, in this process (:func:`in_subprocess` gives it a fresh one). ``compile_threads``:
    inductor's (``0``: its default); with one, every kernel's C++ compile runs as a child this
    process waits for, and ``cpu_s`` counts it."""
    from remat.bench.first_call import caches_off

    caches_off()
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import compilation_time_metrics

    import remat
    from remat.bench import fission as F
    from remat.bench.budgets import plain_compile
    from remat.bench.harness import copy_inputs, grad_err, held, measure_peak
    from remat.lower import partitioner
    from remat.lower.fission_loop import REPORT_META, op_counts
    from remat.zoo.trials import make_step

    if compile_threads:
        inductor_config.compile_threads = compile_threads
    case = F.lm_case(**config)
    model, inputs = case.model, case.inputs
    ref = copy.deepcopy(model)
    make_step(ref, ref, copy_inputs(inputs), seed=0)()
    reference = [p.grad for p in ref.parameters()]
    del ref
    modules: list = []
    plans: list = []
    row: dict[str, Any] = {"method": method, "parts": parts if method != "torch.compile" else None, "status": "ok"}
    if method == "torch.compile":
        fn = plain_compile(model, "inductor")
    else:
        register_head_solver()
        lowered = partitioner.loop_parts

        def spy(gm, fissions):
            out = lowered(gm, fissions)
            modules.append(out)
            return out

        partitioner.loop_parts = spy
        fn = remat.compile(model, compiler="inductor", cache=False, dynamic=False, strict=True, solver=HEAD_SOLVER,
                           solver_options={"parts": parts}, on_plan=lambda g, p: plans.append(p))
    step = make_step(fn, model, copy_inputs(inputs), seed=0)
    inductor_cpu = _clock_inductor()
    compilation_time_metrics.clear()
    t0, c0 = time.perf_counter(), _cpu_s()
    step()
    row["first_s"] = round(time.perf_counter() - t0, 2)
    row["first_cpu_s"] = round(_cpu_s() - c0, 2)
    row["inductor_s"] = round(sum(compilation_time_metrics.get("compile_fx_inner", ())), 2)
    row["inductor_cpu_s"] = round(inductor_cpu[0], 2)
    row["partition_s"] = round(sum(compilation_time_metrics.get("RematPartitioner", ())), 2) if plans else None
    row["grad_err"] = grad_err(model, reference)
    t1 = time.perf_counter()
    step()
    row["step_s"] = round(time.perf_counter() - t1, 3)
    row["peak_bytes"] = measure_peak(step, keep=held(model, inputs))
    if plans:
        row["fissions"] = F.fission_text(plans)
        row["predicted_peak_bytes"] = sum(p.peak_bytes or 0 for p in plans)
    if modules:
        counts = [sum(op_counts(m).values()) for m in modules]
        row["fw_ops"], row["bw_ops"] = counts[0], counts[-1]
        reports = [e for m in modules for e in m.meta.get(REPORT_META, ())]
        row["calls"] = sum(e["calls"] for e in reports)
        row["unrolled_why"] = "; ".join(dict.fromkeys(e["reason"] for e in reports if e["reason"])) or None
    return row


CHILD = """
import json, torch
torch.set_num_threads({threads})
from remat.bench.fission_compile import first_call
print("ROW " + json.dumps(first_call({method!r}, {parts}, {config!r}, {compile_threads})))
"""


def in_subprocess(method: str, parts: int, config: dict[str, int], threads: int = 1,
                  timeout: float | None = None, compile_threads: int = 1) -> dict[str, Any]:
    """:func:`first_call` in a fresh interpreter: its row, or one with the failure in ``status``."""
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "REMAT_CACHE_DIR": "off",
           "REMAT_FISSION_LOOP": "0" if method == "unrolled" else "1"}
    code = CHILD.format(threads=int(threads), method=method, parts=int(parts), config=dict(config),
                        compile_threads=int(compile_threads))
    from . import harness

    return harness.child_row(code, {"method": method, "parts": parts if method != "torch.compile" else None},
                             env=env, timeout=timeout)


COLUMNS = ("method", "parts", "status", "first s", "first CPU s", "inductor s", "inductor CPU s", "partition s", "step s", "peak MB",
           "predicted MB", "grad vs eager", "fw ops", "bw ops", "calls")


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    def f(x, spec="{}"):
        return "-" if x is None else spec.format(x)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    def mb(r, k):
        return None if r.get(k) is None else r[k] / 1e6

    for r in rows:
        lines.append("| " + " | ".join([
            r["method"], f(r.get("parts")), r["status"][:60], f(r.get("first_s"), "{:.1f}"),
            f(r.get("first_cpu_s"), "{:.1f}"),
            f(r.get("inductor_s"), "{:.1f}"), f(r.get("inductor_cpu_s"), "{:.1f}"), f(r.get("partition_s"), "{:.1f}"), f(r.get("step_s"), "{:.3f}"),
            f(mb(r, "peak_bytes"), "{:.1f}"), f(mb(r, "predicted_peak_bytes"), "{:.1f}"), f(r.get("grad_err"), "{:.1e}"),
            f(r.get("fw_ops")), f(r.get("bw_ops")), f(r.get("calls"))]) + " |")
    return "\n".join(lines)
