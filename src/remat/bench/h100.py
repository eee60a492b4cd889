"""The graphs one H100 lease captured (``benchmarks/data/h100``): GPT-2 small and a Llama with
Llama-3.2-1B's widths, as inductor compiled them, with the saved sets of PyTorch's knob at each
budget and the CUDA allocator's measured peaks. ``benchmarks/h100_graphs.py`` and
``benchmarks/swap_h100_graphs.py`` plan on them offline.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from remat.graph.io import load_graph
from remat.plans.plan import Plan


def graph(data: str | Path, name: str):
    """The captured graph ``<data>/<name>_graph.json.gz``."""
    g = load_graph(Path(data) / f"{name}_graph.json.gz")
    g.meta["compiler"] = "inductor"  # captured before capture recorded it; measured with inductor
    return g


def knob_plans(data: str | Path, name: str, g) -> dict[str, Plan]:
    """PyTorch's plans under its knob, by budget (``none``: no budget)."""
    plans = json.loads(gzip.decompress((Path(data) / f"{name}_knob.json.gz").read_bytes()))
    return {b: Plan.from_dict(p[0], g) for b, p in plans.items()}


def measured(data: str | Path, name: str) -> dict[str, int]:
    """The knob's measured peaks above the step's start, by budget."""
    path = Path(data) / f"{name}_measured.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {("none" if r["budget"] in ("1", "1.0") else r["budget"]): r["peak_bytes"]
            for r in rows if r["method"] == "knob" and r["peak_bytes"]}
