"""How well the simulator predicts what the benchmark measured.

DESIGN.md: the cost model's predictions are checked against measurements, not assumed.
From benchmark records this computes, for peak memory, step time and saved activation
bytes: Spearman's rank correlation between predicted and measured (over all records, and
within each model, where it asks whether the simulator orders a model's methods right),
the worst relative errors, and a finding for every (model, method) whose prediction is
off by more than a tolerance (25%).

>>> recs = [{"model": "m", "size": "tiny", "method": k, "status": "ok", "peak_bytes": p,
...          "predicted_peak_bytes": q} for k, p, q in [("a", 100, 100), ("b", 200, 140), ("c", 300, 310)]]
>>> f = fidelity(recs)
>>> f["peak"]["spearman"], [x["method"] for x in f["findings"]]
(1.0, ['b'])
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.stats import spearmanr

TOLERANCE = 0.25

QUANTITIES = {
    # name: (measured field, predicted field, unit divisor, unit)
    "peak": ("peak_bytes", "predicted_peak_bytes", float(1 << 20), "MiB"),
    "step time": ("step_ms", "predicted_step_ms", 1.0, "ms"),
    "saved bytes": ("saved_activation_bytes", "predicted_saved_activation_bytes", float(1 << 20), "MiB"),
}


def _val(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation, None when undefined."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    r = spearmanr(x, y).statistic
    return None if r is None or math.isnan(r) else float(r)


def rel_error(measured: float, predicted: float) -> float:
    """``(predicted - measured) / measured`` (inf when the measurement is 0 and the prediction not)."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / measured


def pairs(records: Sequence[dict], quantity: str) -> list[dict]:
    meas_f, pred_f, _, _ = QUANTITIES[quantity]
    out = []
    for r in records:
        if r.get("status") != "ok":
            continue
        m, p = _val(r.get(meas_f)), _val(r.get(pred_f))
        if m is None or p is None:
            continue
        out.append({"model": r.get("model"), "size": r.get("size"), "method": r.get("method"),
                    "measured": m, "predicted": p, "error": rel_error(m, p)})
    return out


def fidelity(records: Sequence[dict], tolerance: float = TOLERANCE, worst: int = 5) -> dict:
    """Rank correlations, worst errors and findings per quantity; see the module docstring."""
    out: dict = {"tolerance": tolerance, "findings": []}
    for q in QUANTITIES:
        ps = pairs(records, q)
        within = []
        by_model: dict = {}
        for p in ps:
            by_model.setdefault((p["model"], p["size"]), []).append(p)
        for (model, size), group in by_model.items():
            rho = spearman([p["measured"] for p in group], [p["predicted"] for p in group])
            if rho is not None and len(group) >= 3:
                within.append({"model": model, "size": size, "n": len(group), "spearman": rho})
        errs = [abs(p["error"]) for p in ps if math.isfinite(p["error"])]
        out[q.split()[0] if q != "saved bytes" else "saved"] = {
            "n": len(ps),
            "spearman": spearman([p["measured"] for p in ps], [p["predicted"] for p in ps]),
            "within_model_spearman": (float(np.mean([w["spearman"] for w in within])) if within else None),
            "within_model": within,
            "median_abs_error": float(np.median(errs)) if errs else None,
            "worst": sorted(ps, key=lambda p: -abs(p["error"]))[:worst],
        }
        for p in ps:
            if abs(p["error"]) > tolerance:
                out["findings"].append({**p, "quantity": q})
    return out


def _fmt(x, digits=2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _pct(e: float) -> str:
    return "inf" if not math.isfinite(e) else f"{e * 100:+.0f}%"


def markdown(records: Sequence[dict], tolerance: float = TOLERANCE) -> str:
    """The fidelity section as Markdown (written to ``fidelity.md`` by the runner and CLI)."""
    f = fidelity(records, tolerance)
    lines = ["## Fidelity: the simulator's predictions against measurements", "",
             "Spearman rank correlation of predicted vs measured over all ok records, the mean of "
             "the per-model correlations (does the simulator order a model's methods right?), "
             "and the median and worst relative errors ((predicted - measured) / measured).", "",
             "| quantity | n | Spearman (all) | Spearman (within model, mean) | median abs error | worst |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for q, (_, _, div, unit) in QUANTITIES.items():
        s = f[q.split()[0] if q != "saved bytes" else "saved"]
        worst = "; ".join(f"{w['model']}/{w['method']} {_pct(w['error'])} "
                          f"({w['predicted'] / div:.2f} vs {w['measured'] / div:.2f} {unit})"
                          for w in s["worst"][:3])
        med = "n/a" if s["median_abs_error"] is None else f"{s['median_abs_error'] * 100:.0f}%"
        lines.append(f"| {q} | {s['n']} | {_fmt(s['spearman'])} | {_fmt(s['within_model_spearman'])} "
                     f"| {med} | {worst} |")
    lines += ["", f"### Findings: predictions off by more than {tolerance * 100:.0f}%", ""]
    if not f["findings"]:
        lines.append("None.")
    else:
        lines += ["| model | size | method | quantity | measured | predicted | error |",
                  "| --- | --- | --- | --- | ---: | ---: | ---: |"]
        for p in sorted(f["findings"], key=lambda p: (p["quantity"], -abs(p["error"]))):
            _, _, div, unit = QUANTITIES[p["quantity"]]
            lines.append(f"| {p['model']} | {p['size']} | {p['method']} | {p['quantity']} | "
                         f"{p['measured'] / div:.3f} {unit} | {p['predicted'] / div:.3f} {unit} | "
                         f"{_pct(p['error'])} |")
    return "\n".join(lines) + "\n"
