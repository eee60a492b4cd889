"""Channels-last copies of graph inputs (``meta["layout_copy"]``): resident from the step's
start to the last statement that reads their input."""

from __future__ import annotations

from ...graph.graph import Graph
from ..schedule import Schedule


def layout_copies(schedule: Schedule, g: Graph) -> dict[int, int]:
    """``{statement: bytes}``: the channels-last copies of graph inputs inductor makes for
    convolutions (``meta["layout_copy"]``, :func:`remat.capture.workspace.layout_copies`),
    made when the step starts and freed after the last statement that reads their input."""
    size = layout_sizes(g)
    if not size:
        return {}
    index = g._index
    ins = g.input_indices
    last: dict[int, int] = {}
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is not None and st.op == "compute":
            for j in ins[i]:
                if j in size:
                    last[j] = k
    ends: dict[int, int] = {}
    for j, k in last.items():
        ends[k] = ends.get(k, 0) + size[j]
    return ends


def layout_sizes(g: Graph) -> dict[int, int]:
    """``{input: bytes}`` of the channels-last copies (empty for most graphs)."""
    nodes = g.nodes
    return g._derived("layout_copy_sizes", lambda g: {
        i: int(nodes[i].meta["layout_copy"]) for i in g._arrays.meta_nodes if nodes[i].meta.get("layout_copy")})
