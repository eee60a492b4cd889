"""Griewank & Walther's REVOLVE on the candidate chain, searched over the number of slots."""

from __future__ import annotations

import numpy as np

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.plan import Plan
from ..deadline import Deadline
from .chen import coarse_to_fine
from .policy import _context, _evaluate, _result, candidate_chain
from .revolve import revolve_snapshots, revolve_steps


def griewank_slot_grid(l: int, limit: int = 64) -> list[int]:
    """Slot counts to search: all of ``0..l-1`` up to ``limit`` values, else every count up
    to 32 and a geometric spread to ``l - 1``."""
    if l <= 1:
        return [0]
    if l <= limit:
        return list(range(l))
    rest = np.unique(np.geomspace(33, l - 1, limit - 33).astype(int)).tolist()
    return sorted(set(range(33)) | set(rest) | {l - 1})


def griewank(g: Graph, budget: float | None = None, *, cost_model: CostModel | None = None,
             time_limit: float | None = None, candidates: str = "auto", slots: int | None = None,
             evaluations: int | None = None) -> Plan:
    """Griewank & Walther's REVOLVE on the candidate chain (articulation points when the
    graph has any, else linearized): for ``s`` snapshot slots the optimal binomial schedule,
    its snapshot sets written into ``S`` stage by stage; ``s`` searched over ``0..l-1``
    (``slots=`` runs one; ``evaluations=``: at most that many counts of the grid, sampled
    coarse to fine: a stop that does not depend on the clock). See the module docstring."""
    clock = Deadline(time_limit)
    cm = cost_model or default_cost_model()
    ctx = _context(g)
    used, C = candidate_chain(g, candidates)
    tail = bool(ctx.fwd_order) and (not C or ctx.fwd_order[-1] > C[-1])
    l = len(C) + (1 if tail else 0)
    if slots is not None:
        grid = [int(slots)]
    elif not ctx.has_backward:  # forward only: every policy frees values at last use
        grid = [0]
    else:
        grid = griewank_slot_grid(l)
    if evaluations is not None and len(grid) > evaluations:
        grid = [grid[k] for k in sorted(coarse_to_fine(len(grid))[:max(1, int(evaluations))])]
    evaluated = []
    for s in grid:
        if evaluated and clock.expired():
            break
        s_eff = max(0, min(s, l - 1)) if l >= 1 else 0
        snaps = revolve_snapshots(l, s_eff)
        cps = sorted({C[k - 1] for v in snaps.values() for k in v})
        p = _evaluate(g, ctx, C, snaps, cm, s, checkpoints=cps)
        evaluated.append(p)
    details = {"candidates": used, "n_candidates": len(C), "chain_steps": l,
               "revolve_steps": {int(s): revolve_steps(l, s) for s in grid} if l <= 4096 else None}
    return _result("griewank", g, ctx, budget, evaluated, clock.start, cm, details)
