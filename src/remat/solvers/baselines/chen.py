"""Chen et al. (2016): sqrt(n) checkpoints and the greedy segment budget on a candidate chain."""

from __future__ import annotations

import math
import time
from typing import AbstractSet, Sequence

import numpy as np

from ...cost.model import CostModel, default_cost_model
from ...graph.graph import Graph
from ...plans.plan import Plan
from ..deadline import Deadline
from .policy import _context, _Ctx, _evaluate, _Point, _result, candidate_chain, linearized_candidates


# -- checkpoint selection (Chen et al.) -----------------------------------------------------
def chen_sqrtn_checkpoints(candidates: Sequence[int]) -> list[int]:
    """Every ``floor(sqrt(|C|))``-th candidate (the artifact's ``(idx + 1) % k == 0``)."""
    k = int(math.isqrt(len(candidates)))
    if k == 0:
        return []
    return [v for i, v in enumerate(candidates) if (i + 1) % k == 0]


def chen_greedy_checkpoints(ctx: _Ctx, candidates: AbstractSet[int], b: float) -> list[int]:
    """Chen's greedy: running forward bytes; a candidate past ``b`` becomes a checkpoint."""
    temp = 0
    out = []
    nb = ctx.nbytes
    for v in ctx.fwd_order:
        temp += int(nb[v])
        if v in candidates and temp > b:
            out.append(v)
            temp = 0
    return out


def _chen_sqrtn(name: str, mode: str):
    def solver(g: Graph, budget: float | None = None, *, cost_model: CostModel | None = None,
               time_limit: float | None = None, candidates: str = mode) -> Plan:
        t0 = time.perf_counter()
        cm = cost_model or default_cost_model()
        ctx = _context(g)
        used, C = candidate_chain(g, candidates)
        cps = chen_sqrtn_checkpoints(C)
        p = _evaluate(g, ctx, cps, None, cm, len(cps))
        return _result(name, g, ctx, budget, [p], t0, cm,
                       {"candidates": used, "n_candidates": len(C)})

    solver.__name__ = name.replace("-", "_")
    solver.__doc__ = (f"Chen et al. sqrt(n) on the {mode} candidate chain: every "
                      "floor(sqrt(|C|))-th candidate is a checkpoint.")
    return solver


def greedy_grid(g: Graph, points: int = 100) -> list[float]:
    """Values of Chen's ``b`` to search, independent of the budget: the artifact's
    ``M * (1 + arange(-1, 2, 0.01))`` (``M``: activation peak of linearized sqrt(n)), plus
    ``points`` geometric values up to the total forward bytes."""
    ctx = _context(g)
    cm = default_cost_model()
    sq = _evaluate(g, ctx, chen_sqrtn_checkpoints(linearized_candidates(g)), None, cm, None)
    act = max(0, sq.sim.peak_bytes - sq.sim.constant_bytes)
    grid = set((act * (1.0 + np.arange(-1, 2, 0.01))).tolist())
    total = float(ctx.nbytes[ctx.fwd_order].sum()) if ctx.fwd_order else 0.0
    pos = ctx.nbytes[ctx.fwd_order] if ctx.fwd_order else np.zeros(0)
    pos = pos[pos > 0]
    if total > 0 and len(pos):
        grid |= set(np.geomspace(float(pos.min()) / 2, total, points).tolist())
    grid |= {0.0, total}
    return sorted(grid)


def coarse_to_fine(n: int) -> list[int]:
    """``0..n-1`` with every ``2^k``-th index first, largest ``k`` first, then the indices
    between them: a search stopped early has still sampled the whole range.

    >>> coarse_to_fine(9)
    [0, 8, 4, 2, 6, 1, 3, 5, 7]
    """
    if n <= 0:
        return []
    step = 1 << max(0, (n - 1).bit_length())
    order, seen = [], set()
    while step >= 1:
        for i in range(0, n, step):
            if i not in seen:
                seen.add(i)
                order.append(i)
        step //= 2
    return order


def _chen_greedy(name: str, mode: str):
    def solver(g: Graph, budget: float | None = None, *, cost_model: CostModel | None = None,
               time_limit: float | None = None, candidates: str = mode, b: float | None = None,
               points: int = 100, evaluations: int | None = None) -> Plan:
        clock = Deadline(time_limit)
        cm = cost_model or default_cost_model()
        ctx = _context(g)
        used, C = candidate_chain(g, candidates)
        cset = set(C)
        if b is not None:
            grid = [float(b)]
        elif not ctx.has_backward:  # forward only: every policy frees values at last use
            grid = [0.0]
        else:
            grid = greedy_grid(g, points)
        seen: dict[tuple[int, ...], _Point] = {}
        evaluated: list[tuple[int, _Point]] = []
        for k in coarse_to_fine(len(grid)):  # a time limit leaves an even, coarser search
            if evaluated and (clock.expired() or evaluations is not None and len(evaluated) >= evaluations):
                break  # evaluations: a stop that does not depend on the clock
            cps = tuple(chen_greedy_checkpoints(ctx, cset, grid[k]))
            if cps not in seen:
                seen[cps] = _evaluate(g, ctx, cps, None, cm, grid[k])
                evaluated.append((k, seen[cps]))
        evaluated.sort(key=lambda kp: kp[0])  # grid order: the same choice among ties as a full search
        return _result(name, g, ctx, budget, [p for _, p in evaluated], clock.start, cm,
                       {"candidates": used, "n_candidates": len(C), "grid_size": len(grid)})

    solver.__name__ = name.replace("-", "_")
    solver.__doc__ = (f"Chen et al. greedy on the {mode} candidate chain, searching the segment "
                      "budget b; the cheapest schedule within the budget.")
    return solver
