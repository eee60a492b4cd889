"""Hypothesis strategies for random valid joint graphs (seeds/000 Section 3.2). No torch.

A joint graph has primal inputs/params, a random DAG of forward nodes (V_f) over them, tangent
placeholders, and backward nodes that read tangents, forward values and earlier backward
values. Categories, byte sizes (0 included) and the planning flags (is_output,
backward_output, must_save, must_recompute) are drawn at random. Nodes are handed to Graph in a
shuffled order so the topological sort is exercised too.
"""

from __future__ import annotations

from hypothesis import strategies as st

from remat.graph.graph import Graph, Node

FORWARD_CATEGORIES = ("pointwise", "reduction", "view", "compute", "random", "other")
BACKWARD_CATEGORIES = ("pointwise", "reduction", "view", "compute", "other")


def _rare(draw, one_in: int) -> bool:
    # uniform over 0..one_in-1 so shrinking (towards 0) turns the flag off, not on
    return draw(st.integers(0, one_in - 1)) == one_in - 1


@st.composite
def joint_graphs(draw, max_inputs: int = 3, max_forward: int = 8, max_tangents: int = 2,
                 max_backward: int = 4, max_nodes: int | None = None,
                 max_bytes: int = 24) -> Graph:
    """A random valid joint graph; ``max_nodes`` caps the total node count."""
    sizes = st.integers(0, max_bytes)
    n_in = draw(st.integers(1, max_inputs))
    n_tan = draw(st.integers(1, max_tangents))
    n_fw = draw(st.integers(1, max_forward))
    n_bw = draw(st.integers(1, max_backward))
    if max_nodes is not None:
        budget = max_nodes - n_in - n_tan
        n_fw = max(1, min(n_fw, budget - 1))
        n_bw = max(1, min(n_bw, budget - n_fw))

    nodes: list[Node] = []
    for i in range(n_in):
        role = draw(st.sampled_from(("input", "param")))
        nodes.append(Node(f"in{i}", "placeholder", (), role=role, bytes=draw(sizes),
                          category="input"))
    fw_names = [n.name for n in nodes]
    for i in range(n_fw):
        category = draw(st.sampled_from(FORWARD_CATEGORIES))
        k = draw(st.integers(0 if category in ("random", "other") else 1, 3))
        ins = draw(st.lists(st.sampled_from(fw_names), min_size=k, max_size=k))
        flag = draw(st.sampled_from(("none",) * 6 + ("must_save", "must_recompute", "cannot_save")))
        if category == "random" and flag in ("must_recompute", "cannot_save"):
            # random ops are never recomputed, so this pair can be infeasible by design
            # (PlanError); test_mincut_examples covers it
            flag = "none"
        fusible = None
        if _rare(draw, 8):  # an explicit fusibility that disagrees with the category
            fusible = category not in ("pointwise", "reduction", "view")
        nodes.append(Node(
            f"f{i}", category, tuple(ins), role="forward", bytes=draw(sizes), category=category,
            fusible=fusible, is_output=draw(st.booleans()),
            backward_output=_rare(draw, 6),
            must_save=flag == "must_save", must_recompute=flag == "must_recompute",
            can_save=flag != "cannot_save",
        ))
        fw_names.append(f"f{i}")
    bw_sources = []
    for i in range(n_tan):
        nodes.append(Node(f"t{i}", "placeholder", (), role="tangent", bytes=draw(sizes),
                          category="input"))
        bw_sources.append(f"t{i}")
    for i in range(n_bw):
        first = draw(st.sampled_from(bw_sources))
        extra = draw(st.lists(st.sampled_from(fw_names), min_size=0, max_size=3))
        nodes.append(Node(f"b{i}", "grad", (first, *extra), role="backward", bytes=draw(sizes),
                          category=draw(st.sampled_from(BACKWARD_CATEGORIES))))
        bw_sources.append(f"b{i}")
    order = draw(st.permutations(nodes))
    return Graph(order, name="hypothesis")


def small_joint_graphs(max_nodes: int = 14) -> st.SearchStrategy[Graph]:
    """Graphs small enough to brute-force every saved subset of their forward nodes."""
    return joint_graphs(max_inputs=3, max_forward=8, max_tangents=2, max_backward=3,
                        max_nodes=max_nodes)
