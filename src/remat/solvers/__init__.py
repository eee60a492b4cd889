"""Solvers: functions from a :class:`remat.graph.Graph` (+ options) to a :class:`remat.plan.Plan`.

Solvers never import torch. Baselines that need PyTorch's own partitioner (``torch-mincut``,
``no-recompute``) live in :mod:`remat.capture.joint` and run on captured fx graphs.
"""

from __future__ import annotations

from typing import Callable

from ..graph.graph import Graph
from ..plans.plan import Plan
from .mincut.mincut import mincut

SOLVERS: dict[str, Callable[..., Plan]] = {"mincut": mincut}
TORCH_SOLVERS = ("torch-mincut", "no-recompute")


def solve(g: Graph, solver: str = "mincut", **options) -> Plan:
    """Run a graph solver by name: ``solve(graph, "mincut", mode="aggressive")``."""
    try:
        fn = SOLVERS[solver]
    except KeyError:
        hint = (" (it runs on captured PyTorch graphs: use remat.plan on a model)"
                if solver in TORCH_SOLVERS else "")
        raise ValueError(f"unknown solver {solver!r}{hint}; graph solvers: {sorted(SOLVERS)}") from None
    return fn(g, **options)
