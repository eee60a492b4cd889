"""The forward and backward phases of a Schedule, and the saved set that crosses between them.

The backward starts with the schedule's first tangent (in a graph without tangents, its first
backward node); the statements before it form the forward pass. The values resident at that
point which the backward reads before computing them again are the saved set. A value the
forward offloads and the backward reloads crosses as its host copy (``offloaded``, a part of
the saved set). Lowering
(:mod:`remat.lower.fx`) builds the two fx graphs from these phases.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PlanError
from ..graph.graph import Graph
from .schedule import Schedule, Statement


@dataclass(frozen=True)
class Split:
    forward: list[Statement]
    backward: list[Statement]
    saved: list[str]
    offloaded: list[str] = ()  # saved values that cross as host copies (offload ... reload)


def split_schedule(schedule: Schedule) -> Split:
    """Cut a schedule into forward and backward statements and find the saved set."""
    g: Graph = schedule.graph
    stmts = schedule.statements
    # the backward starts when its first tangent arrives (or, in a graph without tangents,
    # with its first backward node): what it computes from then on, forward values included,
    # is the backward's
    cut = next((k for k, s in enumerate(stmts)
                if s.op == "compute" and g[s.node].role in ("tangent", "backward")), len(stmts))
    fw = stmts[:cut]
    bw = [s for s in stmts[cut:] if not (s.op == "compute" and g[s.node].role == "tangent")]
    resident: set[str] = set()
    host: set[str] = set()  # host copies the forward made
    for s in fw:
        if s.op in ("compute", "reload"):
            resident.add(s.node)
        elif s.op == "free":
            resident.discard(s.node)
        elif s.op == "offload":
            host.add(s.node)
    saved: list[str] = []
    offloaded: list[str] = []
    valid = set(resident)  # the forward's values still current in the backward
    for s in bw:
        if s.op == "free":
            valid.discard(s.node)
            continue
        if s.op == "reload":
            if s.node in host and s.node not in valid and s.node not in saved:
                saved.append(s.node)  # crosses as the forward's host copy
                offloaded.append(s.node)
            host.discard(s.node)
            valid.discard(s.node)
            continue
        if s.op == "offload":
            if s.node in valid and s.node not in saved:
                saved.append(s.node)
            continue
        for i in g[s.node].inputs:
            n = g[i]
            if (i in valid or n.is_primal) and i not in saved and n.role != "tangent":
                saved.append(i)
        valid.discard(s.node)  # computed again in the backward: a new value
    for n in g.nodes:  # forward values the backward returns as they are
        if n.backward_output and n.name in resident and n.name not in saved:
            saved.append(n.name)
    fw, saved = _save_items_not_tuples(g, fw, saved)
    return Split(fw, bw, saved, offloaded)


def _save_items_not_tuples(g: Graph, fw: list[Statement], saved: list[str]):
    """A tuple cannot cross to the backward: save the items the backward reads instead
    (computing them in the forward if the schedule did not)."""
    fw = list(fw)
    out: list[str] = []
    computed = {s.node for s in fw if s.op == "compute"}
    stuck = []
    for name in saved:
        if g[name].can_save or g[name].is_primal:
            out.append(name)
            continue
        items = [u.name for u in g.users(name) if u.op == "getitem"]
        if not items and (g[name].is_output or g[name].backward_output):
            continue  # kept to the end anyway (an output, a gradient): the backward reads it
        if not items:
            stuck.append(name)
            continue
        for it in items:
            if it not in computed:
                fw.append(Statement("compute", it))
                computed.add(it)
            if it not in out:
                out.append(it)
    if stuck:  # every such value, in name order (not the schedule's, which a re-ordering changes)
        names = ", ".join(repr(n) for n in sorted(stuck))
        raise PlanError(f"schedule saves {names}, which cannot cross to the backward")
    return fw, out
