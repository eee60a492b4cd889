"""What a saved set means on a Graph: what the backward then computes, and whether it is valid.

A saved set is the set of forward values that cross from the forward pass to the backward
pass (seeds/000 Section 3.2). The backward computes every backward node, plus every forward
value it needs that was not saved: those are recomputed (if the forward computed them too) or
moved (computed only in the backward). A saved set is *valid* when that closure reaches no
primal input (inputs cannot be recomputed, only saved) and no node banned from recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable

import numpy as np

from ..graph.graph import Graph


def required_forward(g: Graph) -> list[bool]:
    """Nodes the forward pass must compute: ancestors of the forward outputs, of the side
    effects nothing reads (a running-statistics update: PyTorch runs it in the forward) and of
    the values flagged ``must_save`` (computed in the forward, never again).

    When no node is flagged ``is_output`` every forward node counts as required.
    """
    return list(_required_forward(g))


def _required_forward(g: Graph) -> list[bool]:
    """:func:`required_forward`, computed once per graph (do not mutate the result)."""
    return g._derived("required_forward", _compute_required_forward)


def _compute_required_forward(g: Graph) -> list[bool]:
    a = g._arrays
    outputs = a.is_output & a.forward
    if not outputs.any():
        return a.forward.tolist()
    # side effects nothing reads run in the forward, and so do values that must be saved
    outputs = outputs | (a.forward & ~a.primal & ((np.diff(a.user_ptr) == 0) | a.must_save))
    # one sweep against the topological order: a forward node is required when a user is
    req = outputs.tolist()
    ptr, users = a.user_lists
    for i in np.flatnonzero(a.forward & ~outputs)[::-1].tolist():
        for u in users[ptr[i]:ptr[i + 1]]:
            if req[u]:
                req[i] = True
                break
    return req


def backward_demand(g: Graph) -> list[int]:
    """Indices the backward pass must have: backward nodes and forward ``backward_output``s."""
    a = g._arrays
    return np.flatnonzero(~a.forward | a.backward_output).tolist()


@dataclass(frozen=True)
class BackwardWork:
    computed: tuple[str, ...]  # forward nodes the backward computes (recomputed + moved)
    recomputed: tuple[str, ...]  # ... of which the forward pass also computes
    missing_inputs: tuple[str, ...]  # primal inputs the backward would need but are not saved
    unread: tuple[str, ...] = ()  # saved values nothing the backward computes reads


def backward_work(g: Graph, saved: Iterable[str]) -> BackwardWork:
    """Forward nodes the backward must compute when ``saved`` crosses from the forward.

    The backward starts from the backward nodes and the forward ``backward_output``s that
    are not saved, and pulls in every forward value they read that is not saved: primal
    inputs it would need are reported missing, the other values are computed. The last answer
    is remembered per graph: a plan and then its schedule ask for the same saved set.
    """
    saved = tuple(saved)
    last = g._memo.get("backward_work")
    if last is not None and last[0] == saved:
        return last[1]
    work = _backward_work(g, saved)
    g._memo["backward_work"] = (saved, work)
    return work


def _backward_work(g: Graph, saved: tuple[str, ...]) -> BackwardWork:
    index = g._index
    saved_idx = [index[s] for s in saved]  # KeyError for an unknown name, like g.index
    a = g._arrays
    n = a.n
    is_saved = np.zeros(n, dtype=bool)
    is_saved[saved_idx] = True
    demand = ~a.forward | a.backward_output
    # a saved demand node (a forward backward_output) is read as is: its inputs are not needed
    expanded = (demand & ~is_saved).tolist()
    primal = a.primal
    ptr, users = a.user_lists
    reached = []
    # one sweep against the topological order: a forward value is needed when a node the
    # backward computes reads it (every user comes later in the order)
    for j in np.flatnonzero(a.forward & ~demand & ~is_saved)[::-1].tolist():
        for u in users[ptr[j]:ptr[j + 1]]:
            if expanded[u]:
                reached.append(j)
                expanded[j] = True  # a primal has no inputs, so marking it changes nothing
                break
    needed = np.zeros(n, dtype=bool)
    needed[reached] = True
    # forward nodes flagged backward_output that are not saved are computed in the backward too
    needed |= a.forward & a.backward_output & ~is_saved
    names = a.names
    computed = np.flatnonzero(needed & ~primal).tolist()
    req = _required_forward(g)
    # a saved value is read when the backward computes one of its users; a saved demand node
    # (a forward backward_output) is read as it is
    runs = (demand & ~is_saved) | (needed & ~primal)
    read = np.zeros(n, dtype=bool)
    read[a.user_src[runs[a.user_idx]]] = True
    unread = np.flatnonzero(is_saved & ~read & ~demand & ~primal).tolist()
    return BackwardWork(
        computed=tuple([names[i] for i in computed]),
        recomputed=tuple([names[i] for i in computed if req[i]]),
        missing_inputs=tuple([names[i] for i in np.flatnonzero(needed & primal).tolist()]),
        unread=tuple([names[i] for i in unread]),
    )


def validity_errors(g: Graph, saved: Collection[str], banned: Collection[str]) -> list[str]:
    """Why ``saved`` is not a valid saved set (empty list when it is valid)."""
    errors = []
    for s in saved:
        if s not in g:
            errors.append(f"saved value {s!r} is not a node of the graph")
        elif not g[s].is_forward:
            errors.append(f"saved value {s!r} is not computable in the forward pass (role {g[s].role})")
        elif g[s].must_recompute or not g[s].can_save:
            errors.append(f"saved value {s!r} cannot be saved (must_recompute or can_save=False)")
    if errors:
        return errors
    work = backward_work(g, saved)
    errors += [f"primal input {m!r} is needed by the backward but not saved" for m in work.missing_inputs]
    banned_set = set(banned)
    errors += [f"node {r!r} is banned from recomputation but the backward would recompute it"
               for r in work.computed if r in banned_set]
    return errors
