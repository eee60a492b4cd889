"""Where the search splits MAGIS's six workloads (seeds/004 Table 2, the zoo's quick sizes,
:func:`remat.zoo.trials.magis_case`), and what it gains: for each workload, remat's
``solver="magis"`` plan with and without fission, for the least memory (``budget="min"``)
and within 10% predicted overhead (``max_overhead=0.1``), each compiled with
``compiler="eager"`` and measured (:func:`remat.bench.measure.peak_memory`, the peak above
the step's start, as a fraction of ``no-recompute``'s; :func:`remat.bench.measure.step_time`,
the step time over no-recompute's, from one alternating loop), with the plan's regions in
module terms and, where it splits nothing, why (the plan's notes, or how many candidate
regions the search had and that none lowered its objective).

``benchmarks/fission_magis.py`` is the command."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from ..plans.fission_text import describe_fission
from ..zoo.trials import copy_inputs, magis_case, make_step
from .measure import peak_memory, step_time

WORKLOADS = ("resnet50", "bert", "vit", "unet", "unetpp", "gpt2")
MODES = {"min": {"budget": "min"}, "overhead 10%": {"max_overhead": 0.1}}


@dataclass
class Row:
    workload: str
    mode: str
    split: list[str] = field(default_factory=list)  # describe_fission of each region
    why_not: str = ""
    peak: float = 0.0  # measured, fraction of no-recompute's
    peak_without: float = 0.0  # the same search without fission
    time: float = 0.0  # step-time ratio to no-recompute
    time_without: float = 0.0
    predicted_time: float = 0.0  # the fission plan's predicted seconds over no-recompute's
    grad_error: float = 0.0  # max |grad - no-recompute's grad| / max |grad|


def _why_not(plan) -> str:
    search = (plan.details or {}).get("search", {})
    notes = search.get("notes") or []
    if notes:
        return notes[0]
    if not search:
        return f"the plan is {plan.solver}'s: the search's plan was no better"
    return f"{search.get('candidates', 0)} candidate regions; no split lowered the objective within the limit"


def run_workload(name: str, repeats: int = 5, modes=MODES) -> list[Row]:
    import remat

    torch._dynamo.reset()  # every workload's loss wrapper is one code object: 5 compiles each
    case = magis_case(name, "quick")
    base_model = case.model
    steps, plans, models = {}, {}, {}

    def add(label, **kwargs):
        model = copy.deepcopy(base_model)
        got = []
        fn = remat.compile(model, compiler="eager", cache=False, on_plan=lambda g, p: got.append(p), **kwargs)
        steps[label] = make_step(fn, model, copy_inputs(case.inputs), seed=0)
        plans[label], models[label] = got, model

    add("no-recompute", solver="no-recompute")
    for mode, kw in modes.items():
        add(mode, solver="magis", **kw)
        add(mode + " no fission", solver="magis", solver_options={"fission": False}, **kw)
    peaks = {k: peak_memory(s).peak_bytes for k, s in steps.items()}  # the first call plans
    times = step_time(steps, repeats=repeats)
    ref_grads = [p.grad.clone() for p in models["no-recompute"].parameters() if p.grad is not None]
    base_t = times["no-recompute"].median_s
    rows = []
    for mode in modes:
        plan = plans[mode][0]
        grads = [p.grad for p in models[mode].parameters() if p.grad is not None]
        err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(grads, ref_grads))
        ref_plan = plans["no-recompute"][0]
        rows.append(Row(
            name, mode, [describe_fission(plan.graph, f) for f in plan.fissions],
            "" if plan.fissions else _why_not(plan),
            peaks[mode] / peaks["no-recompute"], peaks[mode + " no fission"] / peaks["no-recompute"],
            times[mode].median_s / base_t, times[mode + " no fission"].median_s / base_t,
            (plan.predicted_seconds or 0.0) / (ref_plan.predicted_seconds or 1.0), err))
    return rows


def table(rows: list[Row]):
    from rich.table import Table

    t = Table(title="Fission on MAGIS's six workloads (quick sizes, compiler='eager')")
    for col in ("workload", "mode", "peak (no fission)", "time (no fission)", "pred time", "grad err", "split / why not"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.workload, r.mode, f"{r.peak:.2f} ({r.peak_without:.2f})",
                  f"{r.time:.2f}x ({r.time_without:.2f}x)", f"{r.predicted_time:.2f}x",
                  f"{r.grad_error:.1e}", "; ".join(r.split) or r.why_not)
    return t


def to_json(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
