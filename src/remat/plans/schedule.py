"""Schedules: the order in which a training step computes and frees values.

A :class:`Schedule` is a list of statements over a :class:`~remat.graph.Graph`:
``compute v`` evaluates node ``v`` (computing it a second time is a recomputation) and
``free v`` releases its memory (seeds/001 Section 4.9, Algorithm 1). ``offload v`` copies a
resident value to host memory on the copy stream (its device memory is released by the next
``free v``, once the copy is done) and ``reload v`` copies it back before a use (seeds/004
Section 5.2's Store and Load; JSON ``{"op": "offload", "node": "v"}``). Inputs and parameters
are resident from the start and are never computed or freed; a tangent is computed (it
costs nothing and reads nothing) when the backward starts. Every solver's plan lowers to a
Schedule so that one simulator (:mod:`remat.plans.simulator`) judges all of them.

>>> from remat.graph.examples import cos_cos_graph
>>> s = schedule_from_saved_set(cos_cos_graph(), ["add_2"])
>>> [str(st) for st in s.statements][:4]
['compute add', 'compute add_1', 'free add', 'compute add_2']
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import PlanError
from ..graph.graph import Graph
from .saved_set import _required_forward, backward_work

OPS = ("compute", "free", "offload", "reload")
"""Statement kinds: compute and free (recomputation), offload and reload (swapping)."""

COPIES = ("offload", "reload")
"""The statements that run on the copy stream."""


class Statement(NamedTuple):
    """One statement: ``op`` (one of :data:`OPS`) of ``node``."""

    op: str
    node: str

    def __str__(self) -> str:
        return f"{self.op} {self.node}"


@dataclass
class Schedule:
    """An ordered list of statements; ``meta`` holds what the solver wants to report."""

    graph: Graph = field(repr=False)
    statements: list[Statement]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.statements)

    @property
    def computes(self) -> list[str]:
        return [s.node for s in self.statements if s.op == "compute"]

    def compute_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in self.computes:
            counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def recomputed(self) -> list[str]:
        """Nodes computed more than once, in first-computation order."""
        return [n for n, c in self.compute_counts().items() if c > 1]

    @property
    def offloaded(self) -> list[str]:
        """Nodes the schedule offloads to host memory, in first-offload order."""
        return list(dict.fromkeys(s.node for s in self.statements if s.op == "offload"))

    def to_list(self) -> list[dict[str, str]]:
        return [{"op": s.op, "node": s.node} for s in self.statements]

    @classmethod
    def from_list(cls, g: Graph, items: Iterable[Mapping[str, str]] | Iterable[Sequence[str]],
                  meta: Mapping[str, Any] | None = None) -> "Schedule":
        """Statements from ``[{"op": "compute", "node": "x"}, ...]`` or ``[("compute", "x"), ...]``."""
        stmts = []
        for k, it in enumerate(items):
            op, node = (it["op"], it["node"]) if isinstance(it, Mapping) else tuple(it)
            if op not in OPS:
                raise PlanError(f"statement {k}: unknown op {op!r}; use one of {OPS}")
            if node not in g:
                raise PlanError(f"statement {k}: {op} {node!r} names no node of graph {g.name!r}")
            stmts.append(Statement(op, node))
        return cls(g, stmts, dict(meta or {}))

    def __str__(self) -> str:
        return "\n".join(map(str, self.statements))


def kept_to_end(g: Graph) -> np.ndarray:
    """Values that live until the step ends: forward outputs (the loss), values the backward
    returns (gradients) and primal inputs and parameters. A schedule never frees them."""
    a = g._arrays
    return a.primal | a.is_output | a.backward_output


def dropped_outputs(g: Graph) -> np.ndarray:
    """Forward outputs the caller drops as the forward returns (``g.meta["outputs"] ==
    "dropped"``, remat.compile's ``outputs="dropped"``): a schedule keeps them to the forward's
    end, then frees them, or after the backward's last read of those the backward reads."""
    a = g._arrays
    if (g.meta or {}).get("outputs") != "dropped":
        return np.zeros(a.n, dtype=bool)
    return a.is_output & a.forward & ~a.primal & ~a.backward_output


def never_recomputed(g: Graph) -> np.ndarray:
    """Nodes a schedule may compute only once: random ops (a second run would draw fresh
    randomness) and nodes flagged ``must_save``."""
    a = g._arrays
    random = np.array([n.category == "random" for n in g.nodes], dtype=bool)
    return (random | a.must_save) & ~a.primal


def required_nodes(g: Graph) -> np.ndarray:
    """Nodes every schedule must compute at least once: the forward values the outputs need
    and every backward node (tangents included); primals are resident, not computed."""
    a = g._arrays
    req = np.array(_required_forward(g), dtype=bool) | ~a.forward
    return req & ~a.primal


@contextmanager
def _gc_paused():
    """Making a large schedule allocates ~10^5 small objects; the cyclic collector would scan
    the whole heap many times over (half the time on a 50k-node graph). None of them cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def schedule_from_saved_set(g: Graph, saved: Iterable[str]) -> Schedule:
    """Lower a saved-set plan to a Schedule, as PyTorch runs it.

    Forward: the required forward nodes (:func:`~remat.plans.saved_set.required_forward`:
    what the outputs and the side effects need) in graph order, each value freed after its
    last forward use unless it is saved or kept to the end. Backward: tangents first, then the
    backward nodes in graph order from the first one that reads a tangent, each preceded by
    the values it needs that are not computed yet (unsaved forward values recomputed on
    demand), in graph order, as PyTorch's partitioner orders the backward to mimic the
    autograd engine; every value is freed after its last backward use.
    """
    with _gc_paused():
        return _schedule_from_saved_set(g, saved)


def _schedule_from_saved_set(g: Graph, saved: Iterable[str]) -> Schedule:
    saved = list(dict.fromkeys(saved))
    work = backward_work(g, saved)
    if work.missing_inputs:
        raise PlanError(f"saved set of {g.name!r} misses primal inputs the backward needs: "
                        f"{list(work.missing_inputs)[:5]}")
    a = g._arrays
    n = a.n
    ins = g.input_indices
    keep = kept_to_end(g)
    is_saved = np.zeros(n, dtype=bool)
    is_saved[[g.index(s) for s in saved]] = True
    req = required_nodes(g)

    # the forward computes what its outputs and side effects need (required_nodes) and every
    # saved value, with its ancestors
    in_fwd = req & a.forward
    stack = [i for i in np.flatnonzero(is_saved & ~in_fwd & ~a.primal).tolist()]
    while stack:
        i = stack.pop()
        if in_fwd[i] or a.primal[i]:
            continue
        in_fwd[i] = True
        stack.extend(ins[i])
    fwd = np.flatnonzero(in_fwd).tolist()
    bwd_work = set(g.index(c) for c in work.computed)
    bwd_roots = np.flatnonzero(~a.forward).tolist()  # tangents and backward nodes, graph order

    # backward order, as PyTorch's reordering_to_mimic_autograd_engine runs it: from the first
    # user of a tangent on, each node the backward runs in graph order, preceded by the not yet computed
    # values it needs (unsaved forward values recomputed on demand, backward nodes that do not
    # read a tangent) in graph order
    bwd: list[int] = []
    done = np.zeros(n, dtype=bool)
    tangents = [i for i in bwd_roots if g.nodes[i].role == "tangent"]
    for t in tangents:
        done[t] = True
        bwd.append(t)
    users = g._users
    first = min((u for t in tangents for u in users[t]), default=n)

    def needed(j: int) -> bool:
        held = is_saved[j] or (keep[j] and in_fwd[j])  # saved, or an output kept anyway
        return not done[j] and not a.primal[j] and (not a.forward[j] or (j in bwd_work and not held))

    # what the backward runs: its own nodes and the forward values it computes (a forward
    # backward_output that is not saved included) that something it runs reads.
    # backward_work computes an unsaved output again, but this backward reads it, kept to the
    # end: what only that output needed is not run (a tanh head's matmul was scheduled once
    # more at the backward's end, read by nothing)
    bwd_out = a.backward_output
    reach = set(bwd_roots) | {i for i in bwd_work if bwd_out[i] and needed(i)}
    stack = list(reach)
    while stack:
        for j in ins[stack.pop()]:
            if j not in reach and needed(j):
                reach.add(j)
                stack.append(j)
    members = sorted(set(bwd_roots) | {i for i in bwd_work if i in reach})
    for root in [r for r in members if r >= first] + [r for r in members if r < first]:
        if done[root]:
            continue
        found = {root}
        stack = [root]
        while stack:
            for j in ins[stack.pop()]:
                if j not in found and needed(j):
                    found.add(j)
                    stack.append(j)
        for i in sorted(found):
            done[i] = True
            bwd.append(i)

    stmts: list[Statement] = []
    names = a.names
    _emit(stmts, names, ins, fwd, keep | is_saved, first_phase=True)
    # the backward reads each saved value, then frees it after its last backward use; so too
    # each output the caller drops as the forward returns
    dropped = dropped_outputs(g)
    _emit(stmts, names, ins, bwd, keep & ~dropped,
          carried=np.flatnonzero((is_saved | dropped) & ~a.primal).tolist())
    return Schedule(g, stmts, {"lowered_from": "saved_set", "saved": saved})


def _emit(stmts: list[Statement], names: list[str], ins, order: list[int], keep: np.ndarray,
          first_phase: bool = False, carried: Sequence[int] = ()) -> None:
    """Append ``compute`` statements for ``order`` with ``free`` after each value's last use
    within this phase; values in ``keep`` are not freed. ``carried`` values (computed in an
    earlier phase) are freed after their last use here, or at once if unused."""
    last_use: dict[int, int] = {}
    for pos, i in enumerate(order):
        for j in ins[i]:
            last_use[j] = pos
    keep = keep.tolist()
    frees_at: list[list[int]] = [[] for _ in order]
    get = last_use.get
    for pos, i in enumerate(order):
        if not keep[i]:
            end = get(i, pos)
            frees_at[end if end > pos else pos].append(i)  # recomputed after its last user: cannot happen
    append = stmts.append
    for j in carried:
        if not keep[j]:
            if j in last_use:
                frees_at[last_use[j]].append(j)
            else:
                append(Statement("free", names[j]))
    for pos, i in enumerate(order):
        append(Statement("compute", names[i]))
        for j in frees_at[pos]:
            append(Statement("free", names[j]))
