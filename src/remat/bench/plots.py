"""Plots of benchmark results (matplotlib, Agg backend), written under ``out_dir/plots/``.

- ``normalized_<size>_<device>.png``: for every model, throughput and peak memory of each
  method normalized to no-recompute, one bar per method, with each method's geometric mean
  across models as a dotted line (the layout of seeds/000 Figure 5).
- ``timeline_<model>_<size>_<device>.png``: memory over one training step for each method,
  measured (bytes above the step's start over time) and, beside it, the simulator's
  timeline of the same plan (bytes above the start per schedule statement).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from .report import BASELINE, baselines

MiB = float(1 << 20)
CLIP = 8.0  # normalized bars beyond [1/CLIP, CLIP] are clipped and labelled


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _f(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def load_timeline(record: dict, out_dir: str | Path | None) -> dict | None:
    """A record's timelines: ``{"measured": [[seconds, bytes], ...], "simulated": [bytes, ...]}``."""
    tl = record.get("timeline")
    if isinstance(tl, dict):
        return tl
    if isinstance(tl, str) and out_dir is not None:
        p = Path(out_dir) / tl
        if p.exists():
            return json.loads(p.read_text())
    return None


def _method_order(records: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in records))


def _colors(methods: Sequence[str]) -> dict[str, str]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(methods)}


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def normalized_plot(records: Sequence[dict], path: str | Path, title: str = "") -> Path | None:
    """Throughput and peak memory per model and method, normalized to no-recompute."""
    base = baselines(records)
    ok = [r for r in records if r.get("status") == "ok"
          and (r["model"], r["size"], r.get("device")) in base]
    if not ok:
        return None
    plt = _plt()
    models = list(dict.fromkeys((r["model"], r["size"], r.get("device")) for r in ok))
    methods = _method_order(ok)
    colors = _colors(methods)
    width = 0.8 / max(len(methods), 1)
    fig, axes = plt.subplots(2, 1, figsize=(min(18, max(8, 0.75 * len(models) + 3)), 8), sharex=True)
    panels = [("throughput vs no-recompute", "step_ms", True), ("peak memory vs no-recompute", "peak_bytes", False)]
    by = {(r["model"], r["size"], r.get("device"), r["method"]): r for r in ok}
    for ax, (label, field, inverse) in zip(axes, panels):
        for j, m in enumerate(methods):
            xs, ys = [], []
            for i, mk in enumerate(models):
                r, b = by.get((*mk, m)), base[mk]
                v, bv = _f(r.get(field)) if r else None, _f(b.get(field))
                if v is None or bv is None or v <= 0 or bv <= 0:
                    continue
                xs.append(i + (j - (len(methods) - 1) / 2) * width)
                ys.append(bv / v if inverse else v / bv)
            # ratios on a log axis, clipped to [1/CLIP, CLIP]; clipped bars carry their value
            shown = [min(max(y, 1 / CLIP), CLIP) for y in ys]
            ax.bar(xs, [y - 1 for y in shown], bottom=1, width=width, color=colors[m], label=m)
            for x, y, y0 in zip(xs, shown, ys):
                if y != y0:
                    ax.annotate(f"{y0:.3g}", (x, y), fontsize=6, ha="center",
                                va="bottom" if y0 > 1 else "top", rotation=90)
            g = _geomean(ys)
            if g is not None:
                ax.axhline(g, color=colors[m], linestyle=":", linewidth=1.2)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(1 / CLIP / 1.3, CLIP * 1.3)
        ax.set_ylabel(label + " (log)")
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[1].set_xticks(range(len(models)))
    axes[1].set_xticklabels([m[0] for m in models], rotation=45, ha="right")
    axes[0].legend(ncol=min(len(methods), 6), fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0))
    fig.suptitle(title or "normalized to no-recompute (dotted: geometric mean over models)")
    return _save(fig, path)


def timeline_plot(records: Sequence[dict], path: str | Path, out_dir: str | Path | None = None,
                  title: str = "") -> Path | None:
    """Memory over one step for each method of one model: measured, and simulated beside it."""
    series = [(r["method"], load_timeline(r, out_dir)) for r in records if r.get("status") == "ok"]
    series = [(m, t) for m, t in series if t and (t.get("measured") or t.get("simulated"))]
    if not series:
        return None
    plt = _plt()
    colors = _colors([m for m, _ in series])
    has_sim = any(t.get("simulated") for _, t in series)
    fig, axes = plt.subplots(1, 2 if has_sim else 1, figsize=(13 if has_sim else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    for m, t in series:
        meas = t.get("measured") or []
        if meas:  # x: share of the step's time (the profiler slows methods unequally)
            end = meas[-1][0] or 1.0
            ax.step([p[0] / end for p in meas], [p[1] / MiB for p in meas], where="post",
                    color=colors[m], label=f"{m} ({meas[-1][0] * 1e3:.0f} ms profiled)", linewidth=1.2)
    ax.set_xlabel("fraction of the step's time (first to last allocation)")
    ax.set_ylabel("MiB above the step's start")
    ax.set_title("measured")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if has_sim:
        ax2 = axes[0][1]
        for m, t in series:
            sim = t.get("simulated") or []
            if sim:
                n = len(sim)
                ax2.step([k / max(n - 1, 1) for k in range(n)], [b / MiB for b in sim], where="post",
                         color=colors[m], label=m + (" (as no-recompute)" if t.get("simulated_from") else ""),
                         linewidth=1.2)
        ax2.set_xlabel("fraction of the schedule's statements")
        ax2.set_ylabel("MiB above the step's start")
        ax2.set_title("simulated (remat.plans.simulator)")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close ``fig``."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _slug(s) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(s))


def plot_all(records: Sequence[dict], out_dir: str | Path) -> list[Path]:
    """Every plot of the module docstring, under ``out_dir/plots/``; returns the files."""
    out = Path(out_dir) / "plots"
    written: list[Path] = []
    groups: dict = {}
    for r in records:
        groups.setdefault((r.get("size"), r.get("device")), []).append(r)
    for (size, device), recs in groups.items():
        p = normalized_plot(recs, out / f"normalized_{_slug(size)}_{_slug(device)}.png",
                            f"{size} cases on {device}, normalized to {BASELINE}: throughput (higher is "
                            "better) and peak memory above the step's start (lower is better); "
                            "dotted: geometric means")
        if p:
            written.append(p)
        by_model: dict = {}
        for r in recs:
            by_model.setdefault(r["model"], []).append(r)
        for model, mrecs in by_model.items():
            p = timeline_plot(mrecs, out / f"timeline_{_slug(model)}_{_slug(size)}_{_slug(device)}.png",
                              out_dir, f"{model} ({size}, {device}): memory over one training step")
            if p:
                written.append(p)
    return written


def sweep_plot(graph_name: str, rows: Sequence[dict], path: str | Path) -> Path:
    """Overhead against the budget, one line per solver (rows of :func:`remat.bench.sweep.sweep`)."""
    fig, ax = _plt().subplots(figsize=(6.4, 4.2))
    for s in dict.fromkeys(r["solver"] for r in rows):
        pts = [(r["budget"] / 2**30, r["overhead"]) for r in rows if r["solver"] == s and r["feasible"]]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", label=s, linewidth=1.5 if s.startswith("checkmate") else 1)
    ax.set_xlabel("memory budget (GiB)")
    ax.set_ylabel("overhead (x cost without recomputation)")
    ax.set_title(f"{graph_name}: overhead vs budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def streams_plot(schedule, sim, path: str | Path, title: str = "") -> Path:
    """A schedule's two streams over time (:func:`remat.plans.simulator.simulate` with
    ``timeline=True``): device memory after each statement (top), and the bytes each copy
    moves while it runs on the copy stream, offloads up and reloads down (bottom)."""
    from ..cost.model import storage

    plt = _plt()
    g = schedule.graph
    sizes = storage(g)[1]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1]})
    # memory changes where the program issues each statement: at the compute stream's clock
    ends, clock = [], 0.0
    for stream, _, end in sim.times:
        clock = end if stream == "compute" else clock
        ends.append(clock)
    ax1.step([0.0] + ends, [sim.constant_bytes / MiB] + [m / MiB for m in sim.timeline], where="post",
             color="tab:blue", label="device memory")
    ax1.axhline(sim.peak_bytes / MiB, color="tab:red", lw=0.8, ls="--", label=f"peak {sim.peak_bytes / MiB:.1f} MiB")
    ax1.set_ylabel("MiB on the device")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    for st, (stream, start, end) in zip(schedule.statements, sim.times):
        if stream != "copy":
            continue
        mib = sizes[g.index(st.node)] / MiB
        sign = 1 if st.op == "offload" else -1
        ax2.broken_barh([(start, max(end - start, 1e-12))], (0, sign * mib),
                        color="tab:orange" if sign > 0 else "tab:green")
    ax2.axhline(0, color="k", lw=0.5)
    ax2.set_ylabel("MiB in flight\n(offload + / reload -)")
    ax2.set_xlabel("time (the graph's unit: seconds, or its profiled cost)")
    ax2.grid(alpha=0.3)
    fig.suptitle(title or f"{g.name}: {sim.offloads} offloads, {sim.reloads} reloads, "
                 f"waits {sim.wait_seconds:.3g}")
    return _save(fig, path)
