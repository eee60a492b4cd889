"""Memory budgets: parse them, resolve fractions, and plan within them (no torch).

A budget bounds the simulated peak memory of the whole training step, inputs and
parameters included: ``"6GiB"``, ``"512MB"``, ``6e9`` (bytes), or a fraction such as
``0.6`` of the peak with no recomputation (every value the backward reads is saved, as
PyTorch's ``default_partition`` does; :func:`reference_peak`). Because it bounds peak memory and every solver's
schedule is checked by the simulator, a larger budget never yields a higher peak than the
budget, and a budget no schedule fits raises :class:`InfeasibleBudgetError` stating the
smallest budget that remat found feasible.
"""

from __future__ import annotations

import re

import numpy as np

from ..graph.graph import Graph
from .simulator import simulate

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


TORCH_HEADROOM = 0.01
"""Share of a byte budget that ``remat.compile`` keeps free on a real training step for
allocations the cost model does not see (oneDNN's per-thread scratch in a CPU convolution's
backward measured 0.55% of the ConvBN test step; allocator rounding): it plans within
``(1 - TORCH_HEADROOM) * budget``."""


def parse_budget(budget: str | float | int) -> tuple[str, float]:
    """``("bytes", n)`` or ``("fraction", f)`` from ``"6GiB"``, ``6e9``, ``0.6`` or ``"60%"``."""
    if isinstance(budget, bool):
        raise ValueError(f"budget {budget!r}: give bytes (e.g. '6GiB', 6e9) or a fraction (0.6)")
    if isinstance(budget, (int, float)):
        if budget <= 0:
            raise ValueError(f"budget {budget!r} must be positive")
        return ("fraction", float(budget)) if budget <= 1 else ("bytes", float(budget))
    text = str(budget).strip().replace("_", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(%|[kmgt]i?b|b)?", text, flags=re.I)
    if not m:
        raise ValueError(f"budget {budget!r} is not understood: use bytes with a unit "
                         "('6GiB', '512MB', '1e9') or a fraction of the no-recomputation peak (0.6, '60%')")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    if value <= 0:
        raise ValueError(f"budget {budget!r} must be positive")
    if unit == "%":
        return "fraction", value / 100
    if unit == "" and value <= 1:
        return "fraction", value
    return "bytes", value * _UNITS[unit]


def no_recompute_saved(g: Graph) -> list[str]:
    """Every forward value the backward reads (and forward values it returns)."""
    a = g._arrays
    ins = g.input_indices
    saved = {j for i in np.flatnonzero(~a.forward).tolist() for j in ins[i] if a.forward[j]}
    saved |= set(np.flatnonzero(a.backward_output).tolist())
    return [g.nodes[i].name for i in sorted(saved)]


def reference_peak(g: Graph) -> int:
    """Peak of the step with no recomputation, the scale of a fractional budget: every
    value is computed once, in the staged order the budgeted solvers schedule in, and kept
    until its last reader (seeds/001's checkpoint-all)."""
    def peak(g: Graph) -> int:
        from .stages import lifetime_matrix, schedule_from_rs, staged

        st = staged(g)
        return simulate(schedule_from_rs(st, np.eye(st.n, dtype=bool), lifetime_matrix(st))).peak_bytes

    return g._derived("reference_peak", peak)


def resolve_budget(g: Graph, budget: str | float | int) -> int:
    kind, value = parse_budget(budget)
    return int(value * reference_peak(g)) if kind == "fraction" else int(value)


def simulate_constant(g: Graph) -> int:
    a = g._arrays
    return int(a.bytes[a.primal].sum())
