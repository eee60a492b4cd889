"""Griewank & Walther's binomial checkpointing (REVOLVE) on a chain, as snapshot sets.

A chain of ``l`` steps maps state ``x_{j-1}`` to ``x_j``; ``x_0`` is always available (in
remat it is a primal input). Reversing step ``j`` (running its backward) needs ``x_{j-1}``.
With ``s`` snapshot slots besides ``x_0``, the fewest forward steps that reverse the whole
chain are ``F(l, s)``::

    F(1, s) = 0,   F(l, 0) = l (l - 1) / 2,
    F(l, s) = min over 1 <= m < l of  m + F(l - m, s - 1) + F(m, s)

(advance ``m`` steps and snapshot ``x_m``; reverse the right part with one slot fewer; then
the left part with the slot back). This is Griewank's binomial bound: ``F(l, s) = t(l, s+1)``
with ``t(l, c) = r l - C(c + r, r - 1)`` for the ``r`` with ``C(c + r - 1, c) < l <= C(c + r, c)``
(``c`` counting the slot of ``x_0``, as REVOLVE does). ``F`` counts every advance, the first
sweep included: in a training step the first sweep is the forward pass itself, so a chain
recomputes ``F(l, s) - (l - 1)`` steps.

:func:`revolve_snapshots` replays the optimal recursion (treeverse) and reports which states
are held as snapshots when each step is reversed; :mod:`remat.solvers.baselines` turns that
into a checkpoint matrix. Pure Python and numpy: no torch, no remat imports.

>>> revolve_steps(4, 1), closed_form_steps(4, 2)
(4, 4)
>>> sorted(revolve_snapshots(4, 1)[3])  # reversing step 3 (needs x_2) with x_1 snapshotted
[1]
"""

from __future__ import annotations

from math import comb

import numpy as np


_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def revolve_table(l: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """``(F, split)``: ``F[c, k]`` is the optimal number of forward steps to reverse ``k``
    steps with ``c`` free slots (``0 <= c <= s``, ``0 <= k <= l``); ``split[c, k]`` the
    first advance ``m`` of an optimal schedule (0 where none is needed). Rows do not depend
    on ``s``, so one table per ``l`` is kept and grown on demand (read-only views)."""
    have = _TABLES.get(l)
    if have is None or have[0].shape[0] <= s:
        start = 0 if have is None else have[0].shape[0]
        F = np.zeros((s + 1, l + 1), dtype=np.int64)
        split = np.zeros((s + 1, l + 1), dtype=np.int64)
        if have is not None:
            F[:start], split[:start] = have
        ks = np.arange(l + 1, dtype=np.int64)
        for c in range(start, s + 1):
            if c == 0:
                F[0] = ks * (ks - 1) // 2
                F[0, 0] = 0
                continue
            row, prev = F[c], F[c - 1]
            for k in range(2, l + 1):
                m = np.arange(1, k)
                total = m + prev[k - m] + row[1:k]
                best = int(np.argmin(total))  # ties: the shortest first advance
                row[k] = total[best]
                split[c, k] = best + 1
        F.setflags(write=False)
        split.setflags(write=False)
        have = _TABLES[l] = (F, split)
    return have[0][: s + 1], have[1][: s + 1]


def revolve_steps(l: int, s: int) -> int:
    """``F(l, s)``: forward steps (first sweep included) of the optimal schedule."""
    if l <= 1:
        return 0
    s = min(s, l - 1)  # more slots than states buy nothing
    return int(revolve_table(l, s)[0][s, l])


def closed_form_steps(l: int, c: int) -> int:
    """Griewank's closed form ``t(l, c)`` with ``c >= 1`` checkpoints counting ``x_0``."""
    if l <= 1:
        return 0
    if c < 1:
        raise ValueError("the closed form needs at least the checkpoint holding x_0")
    r = 0
    while comb(c + r, c) < l:
        r += 1
    return r * l - comb(c + r, r - 1)


def revolve_snapshots(l: int, s: int) -> dict[int, frozenset[int]]:
    """For each step ``j`` (``1..l``), the states (``1..l-1``) held as snapshots while step
    ``j`` is reversed under the optimal schedule with ``s`` free slots. ``x_0`` is not listed
    (it is always available). Snapshots held when step ``l`` is reversed are the ones taken
    during the first sweep (the forward pass)."""
    out: dict[int, frozenset[int]] = {}
    if l <= 0:
        return out
    s = max(0, min(s, l - 1))
    _, split = revolve_table(l, s) if l > 1 else (None, None)
    held: list[int] = []
    # explicit stack instead of recursion: ("tv", a, b, c) reverses steps a+1..b from x_a
    # with c free slots; ("drop", m) releases the snapshot of x_m
    stack: list[tuple] = [("tv", 0, l, s)]
    while stack:
        item = stack.pop()
        if item[0] == "drop":
            held.remove(item[1])
            continue
        _, a, b, c = item
        k = b - a
        if k <= 0:
            continue
        if k == 1 or c == 0:
            snap = frozenset(held)
            for j in range(b, a, -1):
                out[j] = snap
            continue
        m = a + int(split[c, k])
        held.append(m)
        # run order: treeverse(m, b, c-1), drop m, treeverse(a, m, c)
        stack.append(("tv", a, m, c))
        stack.append(("drop", m))
        stack.append(("tv", m, b, c - 1))
    return out
