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

from .graph import Graph


def required_forward(g: Graph) -> list[bool]:
    """Nodes the forward pass must compute: ancestors of the forward outputs.

    When no node is flagged ``is_output`` every forward node counts as required.
    """
    outputs = [i for i, n in enumerate(g.nodes) if n.is_output and n.is_forward]
    if not outputs:
        return [n.is_forward for n in g.nodes]
    req = [False] * len(g)
    stack = list(outputs)
    ins = g.input_indices
    while stack:
        i = stack.pop()
        if req[i]:
            continue
        req[i] = True
        stack.extend(j for j in ins[i] if not req[j] and g.nodes[j].is_forward)
    return req


def backward_demand(g: Graph) -> list[int]:
    """Indices the backward pass must have: backward nodes and forward ``backward_output``s."""
    return [i for i, n in enumerate(g.nodes) if not n.is_forward or n.backward_output]


@dataclass(frozen=True)
class BackwardWork:
    computed: tuple[str, ...]  # forward nodes the backward computes (recomputed + moved)
    recomputed: tuple[str, ...]  # ... of which the forward pass also computes
    missing_inputs: tuple[str, ...]  # primal inputs the backward would need but are not saved


def backward_work(g: Graph, saved: Iterable[str]) -> BackwardWork:
    """Forward nodes the backward must compute when ``saved`` crosses from the forward."""
    saved_idx = {g.index(s) for s in saved}
    req = required_forward(g)
    ins = g.input_indices
    seen: set[int] = set()
    stack = backward_demand(g)
    computed, missing = [], []
    for i in stack:
        seen.add(i)
    while stack:
        i = stack.pop()
        for j in ins[i]:
            if j in seen or j in saved_idx or not g.nodes[j].is_forward:
                continue
            seen.add(j)
            if g.nodes[j].is_primal:
                missing.append(j)
                continue
            computed.append(j)
            stack.append(j)
    # forward nodes flagged backward_output that are not saved are computed in the backward too
    for i in backward_demand(g):
        n = g.nodes[i]
        if n.is_forward and i not in saved_idx:
            if n.is_primal:
                missing.append(i)
            else:
                computed.append(i)
    computed = sorted(set(computed))
    name = lambda i: g.nodes[i].name  # noqa: E731
    return BackwardWork(
        computed=tuple(map(name, computed)),
        recomputed=tuple(name(i) for i in computed if req[i]),
        missing_inputs=tuple(map(name, sorted(set(missing)))),
    )


def validity_errors(g: Graph, saved: Collection[str], banned: Collection[str]) -> list[str]:
    """Why ``saved`` is not a valid saved set (empty list when it is valid)."""
    errors = []
    for s in saved:
        if s not in g:
            errors.append(f"saved value {s!r} is not a node of the graph")
        elif not g[s].is_forward:
            errors.append(f"saved value {s!r} is not computable in the forward pass (role {g[s].role})")
        elif g[s].must_recompute:
            errors.append(f"saved value {s!r} is flagged must_recompute (it cannot be saved)")
    if errors:
        return errors
    work = backward_work(g, saved)
    errors += [f"primal input {m!r} is needed by the backward but not saved" for m in work.missing_inputs]
    banned_set = set(banned)
    errors += [f"node {r!r} is banned from recomputation but the backward would recompute it"
               for r in work.computed if r in banned_set]
    return errors
