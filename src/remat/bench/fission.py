"""Fission benchmarks (issue 31): an LM whose logits dominate, side by side with the remedies
users write today (``benchmarks/fission_lm.py``), and fission plans' predicted against
measured step time (``benchmarks/fission_timing.py``).

**The LM case** (:func:`lm_case`): a transformers ``LlamaForCausalLM`` from a config (random
weights), mean cross-entropy with some labels at -100 (the ignored prompt tokens and a random
share of the rest). Every row runs on its own copy of the same weights and inputs and is
measured the same way (:func:`remat.bench.budgets.measure`: peak above the step's start,
gradients after one seeded step; then one alternating timing loop):

- ``no-recompute``: ``remat.compile(solver="no-recompute")`` (PyTorch's ``default_partition``):
  the base of every fraction and step-time ratio;
- ``torch.compile``: plain ``torch.compile`` (PyTorch's min-cut partition), and the ``knob``
  (``activation_memory_budget``) at the fractions asked for;
- ``hand-chunked``: the head and the mean cross-entropy in token chunks, each under
  ``torch.utils.checkpoint`` (:class:`ChunkedHeadLoss`, eager, as users write it);
- ``hf checkpointing``: transformers' ``activation_checkpointing_enable()`` (every decoder
  layer under ``torch.utils.checkpoint``), eager;
- ``remat``: ``remat.compile(model, budget=...)`` at ``"min"`` and the fractions asked for;
  the rows say whether its plans split a region (``fissions``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from remat.bench import budgets as B
from remat.bench.harness import MiB, copy_inputs
from remat.bench.measure import free_memory, step_time
from remat.eager.blocks import enable_transformers_checkpointing
from remat.zoo.trials import Case, make_step

IGNORE = -100


# -- the LM case ------------------------------------------------------------------------------

class LMLabelsLoss(nn.Module):
    """``forward(ids, labels) -> lm(input_ids=ids, labels=labels).loss`` (transformers' causal
    LM loss: labels shifted by one, mean over the labels that are not -100)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels).loss


class ChunkedHeadLoss(nn.Module):
    """The hand-written remedy (Liger's fused linear cross-entropy, Mini-Sequence Transformer):
    the decoder's final hidden states, then the LM head and the cross-entropy in ``chunks``
    token chunks, each under ``torch.utils.checkpoint`` (so a chunk's logits exist only while
    it runs, in the forward and again in the backward); the chunks' loss sums over the count
    of valid labels. The same loss as :class:`LMLabelsLoss` (same parameters, same order)."""

    def __init__(self, lm: nn.Module, chunks: int = 8):
        super().__init__()
        self.lm = lm
        self.chunks = chunks

    def _part(self, h, y):
        return F.cross_entropy(self.lm.lm_head(h).float(), y, ignore_index=IGNORE, reduction="sum")

    def forward(self, ids, labels):
        h = self.lm.model(input_ids=ids).last_hidden_state
        y = F.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1)
        h = h.reshape(-1, h.shape[-1])
        total = None
        for hc, yc in zip(h.chunk(self.chunks), y.chunk(self.chunks)):
            part = torch.utils.checkpoint.checkpoint(self._part, hc, yc, use_reentrant=False)
            total = part if total is None else total + part
        return total / (y != IGNORE).sum()


def lm_labels(ids: torch.Tensor, ignored: float = 0.25, prompt: int = 16, seed: int = 1) -> torch.Tensor:
    """Labels of ``ids``: the first ``prompt`` tokens of each row and a random ``ignored``
    share of the rest at -100 (rows of unequal valid counts)."""
    gen = torch.Generator().manual_seed(seed)
    labels = ids.clone()
    labels[:, :prompt] = IGNORE
    labels[torch.rand(ids.shape, generator=gen) < ignored] = IGNORE
    return labels


def lm_case(layers: int = 2, hidden: int = 256, heads: int = 4, kv_heads: int = 4, ff: int = 688,
            vocab: int = 32000, batch: int = 1, seq: int = 512, seed: int = 0) -> Case:
    """A Llama from transformers' config with random weights, ``forward(ids, labels) -> loss``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max(seq, 256),
            attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False))
        ids = torch.randint(0, vocab, (batch, seq))
    lm.loss_type = "ForCausalLM"
    _install_hooks(lm)
    labels = lm_labels(ids)
    desc = (f"Llama ({layers} x {hidden}, {heads} heads / {kv_heads} kv, ff {ff}, vocab {vocab}), "
            f"batch {batch} x {seq}, {int((labels != IGNORE).sum())} valid labels")
    return Case("llama-lm", desc, LMLabelsLoss(lm).train(), (ids, labels),
                {"layers": layers, "hidden": hidden, "vocab": vocab, "batch": batch, "seq": seq})


def _install_hooks(lm: nn.Module) -> None:
    from remat.zoo.trials import _install_output_hooks

    _install_output_hooks(lm)


# -- the rows -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One row: a label, the case it runs on (a variant of the LM's module, same weights) and
    its :class:`remat.bench.budgets.Method`."""

    label: str
    case: Case
    method: B.Method


def lm_entries(case: Case, budgets: list, knobs: list, chunks: int = 8) -> list[Entry]:
    """The rows of the LM benchmark: no-recompute first (the base), then plain torch.compile,
    the knob, the hand-chunked head + loss, transformers' gradient checkpointing, remat min and
    remat at ``budgets``."""
    lm = case.model.lm
    chunked = Case(case.name, case.description, ChunkedHeadLoss(lm, chunks), case.inputs)
    ckpt_lm = copy.deepcopy(lm)
    enable_transformers_checkpointing(ckpt_lm, use_reentrant=False)
    ckpt = Case(case.name, case.description, LMLabelsLoss(ckpt_lm).train(), case.inputs)
    out = [Entry("no-recompute", case, B.Method(B.NO_RECOMPUTE, "-", None, (("solver", "no-recompute"),))),
           Entry("eager", case, B.Method("eager", "-")),
           Entry("torch.compile", case, B.Method(B.REFERENCE, "-"))]
    out += [Entry(f"knob {k:g}", case, B.Method("knob", f"{k:g}", k)) for k in knobs]
    out += [Entry(f"hand-chunked ({chunks})", chunked, B.Method("eager", "-")),
            Entry("hf checkpointing", ckpt, B.Method("eager", "-")),
            Entry("remat min", case, B.Method("remat", "min", None, (("budget", "min"),)))]
    out += [Entry(f"remat {b:g}", case, B.Method("remat", f"{b:g}", b, (("budget", b),))) for b in budgets]
    return out


@contextlib.contextmanager
def plans_seen(sink: list):
    """Every plan ``remat.compile`` makes while inside, appended to ``sink`` (beside the
    caller's own ``on_plan``)."""
    import remat

    original = remat.compile

    def compile(model, *, on_plan=None, **kw):
        def both(g, p):
            sink.append(p)
            if on_plan is not None:
                on_plan(g, p)
        return original(model, on_plan=both, **kw)

    remat.compile = compile
    try:
        yield sink
    finally:
        remat.compile = original


def fission_text(plans: list) -> str:
    """What the plans split, in module terms (:func:`remat.plans.fission_text.describe_fission`:
    ``"lm_head + loss in 16 token parts"``) with the region's op count, or ``"-"``."""
    from remat.plans.fission_text import describe_fission

    out = [f"{describe_fission(p.graph, f) if p.graph is not None else f'{f.n} parts'} "
           f"({len(f.nodes)} ops)" for p in plans for f in (p.fissions or ())]
    return ", ".join(out) or "-"


def compile_settings() -> None:
    """Every row compiles the same forward again (dynamo's recompile limit would run the later
    ones eagerly), and partitions afresh (no FX-graph or autograd cache); PyTorch's partitioner
    is clocked (:func:`remat.bench.budgets.install_clocks`)."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    dynamo_config.recompile_limit = 1024
    dynamo_config.accumulated_recompile_limit = 1 << 16
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    B.install_clocks()


def run_entries(entries: list[Entry], s: B.Settings, repeats: int = 3,
                on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Measure every entry (:func:`remat.bench.budgets.measure`), then time them in one
    alternating loop; rows as dicts with ``label``, ``fissions``, ``fraction`` and ``ratio``
    (both to the first entry's)."""
    compile_settings()
    ref = copy.deepcopy(entries[0].case.model)
    make_step(ref, ref, copy_inputs(entries[0].case.inputs), seed=s.seed)()
    refs = {"eager": B.grads_of(ref)}
    del ref
    done = []
    for e in entries:
        t0 = time.perf_counter()
        plans: list = []
        with plans_seen(plans):
            m = B.measure(e.case, e.method, s, refs, [])
        row = {"label": e.label, **asdict(m.row), "fissions": fission_text(plans),
               "fission_count": sum(len(p.fissions or ()) for p in plans),
               "solvers": sorted({p.solver for p in plans}),
               "predicted_peak_bytes": sum(p.peak_bytes or 0 for p in plans) if plans else None}
        done.append((row, m.step))
        print(f"  {e.label:>18}: {row['status'][:40]:<10} peak "
              f"{(row['peak_bytes'] or 0) / MiB:8.1f} MiB  fissions {row['fissions']}  "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        if on_row is not None:
            on_row(row)
    base = done[0][0]
    for row, _ in done:
        if base["peak_bytes"] and row["peak_bytes"] is not None:
            row["fraction"] = row["peak_bytes"] / base["peak_bytes"]
    steps = {str(i): st for i, (_, st) in enumerate(done) if st is not None}
    if "0" in steps:
        times = step_time(steps, repeats=repeats, warmup=1, device=s.device)
        b = times["0"].samples
        for i, (row, _) in enumerate(done):
            t = times.get(str(i))
            if t is None:
                continue
            if t.error:
                row["status"] = t.error
                continue
            row["step_ms"] = t.median_s * 1e3
            n = min(len(t.samples), len(b))
            if n:
                r = [x / y for x, y in zip(t.samples[:n], b[:n])]
                row["ratio"], row["ratio_min"], row["ratio_max"] = statistics.median(r), min(r), max(r)
    rows = [row for row, _ in done]
    done.clear()
    steps.clear()
    free_memory(s.device)
    gc.collect()
    return rows


def lm_comparison(case: Case, budgets: list, knobs: list, chunks: int = 8, compiler: str = "eager",
                  time_limit: float = 60.0, repeats: int = 3) -> list[dict]:
    """The LM rows (:func:`lm_entries`) measured (:func:`run_entries`) and printed as a table."""
    entries = lm_entries(case, budgets, knobs, chunks)
    s = B.Settings(compiler=compiler, time_limit=time_limit, fd_directions=0)
    rows = run_entries(entries, s, repeats=repeats)
    print(f"\n{case.description}, compiler {compiler}; fraction and ratio of no-recompute's\n")
    print(lm_table(rows))
    return rows


LM_COLUMNS = ("label", "status", "peak MB", "fraction", "step ratio [min, max]", "grad vs eager", "fissions")


def lm_table(rows: list[dict]) -> str:
    """The LM rows as a Markdown table (fraction and ratio: of the first row's)."""
    def f(x, spec="{:.3f}"):
        return "-" if x is None else spec.format(x)

    lines = ["| " + " | ".join(LM_COLUMNS) + " |", "|" + "---|" * len(LM_COLUMNS)]
    for r in rows:
        ratio = "-" if r.get("ratio") is None else \
            f"{r['ratio']:.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]"
        peak = "-" if r.get("peak_bytes") is None else f"{r['peak_bytes'] / 1e6:.1f}"
        lines.append(f"| {r['label']} | {r['status'][:60]} | {peak} | {f(r.get('fraction'))} | {ratio} | "
                     f"{f(r.get('grad_eager'), '{:.1e}')} | {r['fissions']} |")
    return "\n".join(lines)


# -- fission plans' predicted against measured step time (benchmarks/fission_timing.py) -----------

FIXED_SOLVER = "bench-fission"
"""A solver of this benchmark's own, registered when it runs: the conservative min cut's saved
set with one fission region of the F-Tree (:func:`remat.solvers.magis.ftree.ftree`) split in
``parts`` parts, the search's way of building a state's schedule. It lets the benchmark choose
n instead of the search."""


def fixed_fission(g, *, budget=None, cost_model=None, time_limit=None, parts: int = 2,
                  candidate: str = "largest"):
    """The plan of :data:`FIXED_SOLVER` on ``g``: the candidate with the most nodes that
    ``parts`` parts may split (``candidate="largest"``), or the one whose label starts with
    ``candidate``; without one, the min cut's plan (no fissions) with
    ``details["fission"]`` saying why."""
    from remat.cost.model import default_cost_model
    from remat.plans.plan import Plan
    from remat.plans.schedule import schedule_from_saved_set
    from remat.plans.simulator import simulate
    from remat.solvers.magis.ftree import ftree
    from remat.solvers.magis.search import _resident_at_peak, _saved_in
    from remat.solvers.mincut import mincut
    from remat.transforms.fission import apply_fissions, illegal

    cm = cost_model or default_cost_model(g)
    base = mincut(g, "conservative")
    s0 = schedule_from_saved_set(g, base.saved_names)
    sim0 = simulate(s0, cm)
    tree = ftree(g, _resident_at_peak(s0, sim0))
    ok = [f for f in tree.candidates if f.length % parts == 0 and illegal(g, f.with_n(parts)) is None]
    if candidate != "largest":
        ok = [f for f in ok if f.label.startswith(candidate)]
    if not ok:
        return base.judge(budget, cm).updated(details={"fission": f"no candidate of {len(tree)} splits in {parts} parts"})
    f = max(ok, key=lambda f: (len(f.nodes), -f.index)).with_n(parts).with_index(0)
    gf = apply_fissions(g, [f])
    s = schedule_from_saved_set(gf, _saved_in(gf, frozenset(base.saved_names)))
    p = Plan.from_schedule(s, solver="magis", fissions=(f,),
                           details={"fission": f"{f.label}: {len(f.nodes)} nodes in {parts} parts",
                                    "candidates": len(tree)})
    return p.judge(budget, cm)


def register_fixed_solver() -> None:
    """Register :data:`FIXED_SOLVER` (once per process)."""
    from remat.solvers import registry

    if FIXED_SOLVER not in registry.names():
        registry.register(FIXED_SOLVER, "magis", "optional",
                          "benchmark: one F-Tree candidate split in a given number of parts", fixed_fission)


def timing_case(name: str) -> Case:
    """The graphs of the timing table: ``mlp`` (the wide-batch MLP of the MAGIS trial, batch
    1,024), ``mixer`` (the MLP-Mixer, batch 64), ``head`` (an LM head + mean cross-entropy
    with ignored labels: 2,048 tokens x 256 -> vocabulary 8,192)."""
    from remat.zoo.trials import Mixer, WideMLP

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if name == "mlp":
            return Case("mlp", "WideMLP (64-256-256-8, GELU), batch 1024, sum of squares", WideMLP(),
                        (torch.randn(1024, 64), torch.randint(0, 8, (1024,))))
        if name == "mixer":
            return Case("mixer", "MLP-Mixer (4 blocks, 64 tokens x 128), batch 64, cross-entropy", Mixer(),
                        (torch.randn(64, 64, 48), torch.randint(0, 10, (64,))))
        if name == "head":
            ids = torch.randn(2048, 256)
            labels = lm_labels(torch.randint(0, 8192, (1, 2048)), prompt=0).reshape(-1)
            return Case("head", "LM head (2048 tokens x 256 -> 8192) + mean cross-entropy, 25% ignored",
                        HeadLoss(256, 8192), (ids, labels))
    raise ValueError(f"unknown timing case {name!r}: mlp, mixer or head")


class HeadLoss(nn.Module):
    """An LM head and its mean cross-entropy over tokens, labels at -100 ignored."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, h, labels):
        return F.cross_entropy(self.head(self.norm(h)), labels, ignore_index=IGNORE)


def _old_cpu():
    from remat.cost.model import DeviceProfile

    return DeviceProfile("cpu (before per-kernel pricing)", 50e9, 8e9, 2e-6, conv_workspace=1.0)


OLD_CPU = _old_cpu()
"""The CPU profile before per-kernel pricing (no curves, no per-op view): the fused formula
``flops / peak + traffic / bandwidth + kernels x 2 us`` whatever the compiler."""


def predicted_seconds(plan, cm) -> float:
    """The simulator's step time for ``plan``'s schedule on its graph under ``cm``."""
    from remat.plans.simulator import simulate

    return simulate(plan.schedule(), cm, timeline=False).predicted_seconds


def timing_rows(case: Case, parts: list[int], compiler: str = "eager", repeats: int = 7,
                profile=None) -> list[dict]:
    """No-recompute and the fixed-fission plan at each of ``parts`` on ``case``: each row's
    measured step time (the least of an alternating loop's samples, and their median), its
    predicted time under ``profile``
    (default: :func:`remat.cost.calibrate.cpu_profile`, measured now) and the default CPU
    profile, both as ratios to no-recompute's and absolute."""
    import remat
    from remat.cost.calibrate import cpu_profile
    from remat.cost.model import CostModel, default_cost_model

    register_fixed_solver()
    compile_settings()
    profile = profile or cpu_profile()
    variants = [("no-recompute", dict(solver="no-recompute"))]
    variants += [(f"n={n}", dict(solver=FIXED_SOLVER, solver_options={"parts": n}, strict=True)) for n in parts]
    steps, rows = {}, []
    for label, kw in variants:
        torch._dynamo.reset()
        model = copy.deepcopy(case.model)
        plans: list = []
        fn = remat.compile(model, compiler=compiler, cache=False, dynamic=False,
                           on_plan=lambda g, p, plans=plans: plans.append(p), **kw)
        step = make_step(fn, model, copy_inputs(case.inputs))
        row = {"case": case.name, "plan": label, "status": "ok"}
        try:
            step()
        except Exception as e:  # noqa: BLE001 - a row, not the end of the run
            row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            rows.append(row)
            continue
        p = plans[0]
        calibrated = CostModel(profile, fused_memory=compiler == "inductor", per_op=compiler == "eager")
        row.update(fissions=fission_text(plans), detail=p.details.get("fission", ""),
                   predicted_s=predicted_seconds(p, calibrated),
                   predicted_default_s=predicted_seconds(p, default_cost_model(p.graph)),
                   predicted_old_s=predicted_seconds(p, CostModel(OLD_CPU, fused_memory=compiler == "inductor")))
        steps[label] = step
        rows.append(row)
    times = step_time(steps, repeats=repeats, warmup=2)
    base = next((r for r in rows if r["plan"] == "no-recompute" and r["status"] == "ok"), None)
    for r in rows:
        t = times.get(r["plan"])
        if t is None or t.error:
            continue
        # the least of the alternating samples: on a machine others share, a step is only
        # ever slowed down by them (the median is kept beside it)
        r["measured_s"], r["median_s"] = min(t.samples), t.median_s
        if base is not None and "measured_s" in base:
            for k in ("measured_s", "predicted_s", "predicted_default_s", "predicted_old_s"):
                r[k.replace("_s", "_ratio")] = r[k] / base[k]
            r["ratio_error"] = r["predicted_ratio"] / r["measured_ratio"]
        r["abs_error"] = r["predicted_s"] / r["measured_s"]
    return rows


TIMING_COLUMNS = ("case", "plan", "fissions", "measured ms", "predicted ms", "pred / meas",
                  "measured ratio", "predicted ratio", "ratio error", "default profile: ratio",
                  "before: ratio (error)")


def old_error(r: dict) -> float | None:
    """The old model's predicted ratio over the measured one."""
    if r.get("predicted_old_ratio") is None or not r.get("measured_ratio"):
        return None
    return r["predicted_old_ratio"] / r["measured_ratio"]


def timing_table(rows: list[dict]) -> str:
    def f(x, spec="{:.2f}"):
        return "-" if x is None else spec.format(x)

    lines = ["| " + " | ".join(TIMING_COLUMNS) + " |", "|" + "---|" * len(TIMING_COLUMNS)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['case']} | {r['plan']} | {r['status']} |" + " |" * (len(TIMING_COLUMNS) - 3))
            continue
        ms = lambda k: None if r.get(k) is None else r[k] * 1e3  # noqa: E731
        lines.append(" | ".join([f"| {r['case']}", r["plan"], r.get("fissions", "-"), f(ms("measured_s"), "{:.1f}"),
                                 f(ms("predicted_s"), "{:.1f}"), f(r.get("abs_error")), f(r.get("measured_ratio")),
                                 f(r.get("predicted_ratio")), f(r.get("ratio_error")),
                                 f(r.get("predicted_default_ratio")),
                                 f"{f(r.get('predicted_old_ratio'))} ({f(old_error(r))})"]) + " |")
    return "\n".join(lines)
