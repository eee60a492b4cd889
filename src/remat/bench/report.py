"""Benchmark results on disk: ``results.json`` (versioned), ``results.csv`` and ``results.md``.

A result is one record per (model, size, method); see :mod:`remat.bench.runner` for the
fields. The Markdown table puts every method of a model beside the no-recompute baseline
(``torch.compile`` without recomputation), as ratios: saved bytes, peak memory and step time.

>>> rows = [{"model": "m", "size": "tiny", "method": "no-recompute", "status": "ok",
...          "saved_activation_bytes": 2 << 20, "peak_bytes": 4 << 20, "step_ms": 2.0},
...         {"model": "m", "size": "tiny", "method": "mincut-conservative", "status": "ok",
...          "saved_activation_bytes": 1 << 20, "peak_bytes": 3 << 20, "step_ms": 2.0}]
>>> print(markdown_table(rows).splitlines()[3].split("|")[10].strip())  # saved vs no-recompute
0.50
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.table import Table

from ..errors import OptionError
from ..plans.cache import read_json_file

RESULTS_FORMAT = "remat.bench.results"
RESULTS_VERSION = 1
BASELINE = "no-recompute"

CSV_FIELDS = [
    "model", "size", "method", "device", "status", "batch", "saved_activation_bytes",
    "saved_tensors", "predicted_saved_activation_bytes", "peak_bytes", "predicted_peak_bytes",
    "resident_bytes", "step_ms", "predicted_step_ms", "compile_s", "planner_ms", "graphs",
    "recomputed", "compiler", "repeats", "peak_source", "note",
]

MiB = float(1 << 20)


def key(r: dict) -> tuple:
    return (r.get("model"), r.get("size"), r.get("method"), r.get("device"))


def load_results(path: str | Path) -> list[dict]:
    """Records of a ``results.json`` (empty if the file does not exist)."""
    path = Path(path)
    data, why = read_json_file(path)
    fix = "pass --no-resume to start the results over, or another --out"
    if why is not None:
        raise OptionError(f"{path} cannot be resumed from: {why}; {fix}")
    if data is None:
        return []
    if isinstance(data, dict):
        if data.get("format") != RESULTS_FORMAT or not isinstance(data.get("records", []), list):
            raise OptionError(f"{path} is not a remat benchmark result (format {RESULTS_FORMAT!r}); {fix}")
        return list(data.get("records", []))
    if not isinstance(data, list):
        raise OptionError(f"{path} is not a remat benchmark result (format {RESULTS_FORMAT!r}); {fix}")
    return list(data)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(records: Sequence[dict], path: str | Path, meta: dict | None = None) -> Path:
    """Write ``records`` as ``{"format", "version", "meta", "records"}``, atomically (a crash
    while writing never leaves a truncated file)."""
    path = Path(path)
    doc = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "meta": meta or {},
           "records": list(records)}
    _atomic_write(path, json.dumps(doc, indent=1, default=_jsonable))
    return path


def _jsonable(x: Any):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def write_csv(records: Sequence[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: r.get(k) for k in CSV_FIELDS})
    return path


def _num(x) -> float | None:
    if x is None:
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _mib(x) -> str:
    v = _num(x)
    return "" if v is None else f"{v / MiB:.2f}"


def _ms(x) -> str:
    v = _num(x)
    return "" if v is None else f"{v:.2f}"


def _ratio(a, b) -> str:
    a, b = _num(a), _num(b)
    if a is None or b is None or b == 0:
        return ""
    return f"{a / b:.2f}"


def baselines(records: Iterable[dict]) -> dict[tuple, dict]:
    """The ok no-recompute record of each (model, size, device)."""
    return {(r["model"], r["size"], r.get("device")): r for r in records
            if r.get("method") == BASELINE and r.get("status") == "ok"}


COLUMNS = ["model", "size", "method", "status", "saved MiB", "peak MiB", "pred. peak MiB",
           "step ms", "pred. step ms", "saved vs no-rec", "peak vs no-rec", "time vs no-rec",
           "compile s"]


def table_rows(records: Sequence[dict]) -> list[list[str]]:
    """The Markdown/console table's cells, one row per record, in COLUMNS order."""
    base = baselines(records)
    rows = []
    for r in records:
        b = base.get((r.get("model"), r.get("size"), r.get("device")), {})
        ok = r.get("status") == "ok"
        status = r.get("status", "")
        rows.append([
            str(r.get("model", "")), str(r.get("size", "")), str(r.get("method", "")),
            status if len(status) <= 40 else status[:37] + "...",
            _mib(r.get("saved_activation_bytes")), _mib(r.get("peak_bytes")),
            _mib(r.get("predicted_peak_bytes")), _ms(r.get("step_ms")), _ms(r.get("predicted_step_ms")),
            _ratio(r.get("saved_activation_bytes"), b.get("saved_activation_bytes")) if ok else "",
            _ratio(r.get("peak_bytes"), b.get("peak_bytes")) if ok else "",
            _ratio(r.get("step_ms"), b.get("step_ms")) if ok else "",
            "" if _num(r.get("compile_s")) is None else f"{float(r['compile_s']):.1f}",
        ])
    return rows


def markdown_table(records: Sequence[dict]) -> str:
    """The results as a Markdown table (ratios are against no-recompute of the same model)."""
    rows = table_rows(records)
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "| " + " | ".join("---" if c in ("model", "size", "method", "status") else "---:"
                               for c in COLUMNS) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(records: Sequence[dict], meta: dict | None = None) -> str:
    meta = meta or {}
    head = ["# remat benchmark", ""]
    if meta:
        head += [f"- {k}: {v}" for k, v in meta.items() if not isinstance(v, (dict, list))]
        head.append("")
    head += ["Peak memory is measured above the bytes resident before the step (parameters, "
             "inputs, the previous step's gradients); predictions are the simulator's "
             "(`remat.plans.simulator`) on a measured device profile. Ratios are against "
             "`no-recompute` (torch.compile without recomputation) of the same model.", ""]
    return "\n".join(head) + markdown_table(records) + "\n"


def write_all(records: Sequence[dict], out_dir: str | Path, meta: dict | None = None) -> dict[str, Path]:
    """Write results.json, results.csv and results.md under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(records, out / "results.json", meta),
             "csv": write_csv(records, out / "results.csv")}
    _atomic_write(out / "results.md", markdown(records, meta))
    paths["md"] = out / "results.md"
    return paths


def rich_table(records: Sequence[dict], title: str = "remat bench"):
    """The same table for the console (rich)."""
    t = Table(title=title)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c in ("model", "size", "method", "status") else "right",
                     no_wrap=c in ("model", "method"), overflow="ellipsis")
    prev = None
    for r, row in zip(records, table_rows(records)):
        model = (r.get("model"), r.get("size"))
        if prev is not None and model != prev:
            t.add_section()
        prev = model
        t.add_row(*row)
    return t
