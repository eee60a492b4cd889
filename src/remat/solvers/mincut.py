"""Fusion-aware min-cut checkpointing (seeds/000 Section 3, Algorithms 1 and 2).

Every forward node ``i`` is split into ``i_in -> i_out`` whose capacity is the memory traffic
of saving it: ``w`` if the node is materialized anyway (an input, a forward output, or a node
with a non-fusible user), ``2w`` otherwise (one extra write in the forward, one read in the
backward). Data flow edges are infinite; backward nodes drain to the sink; inputs and nodes
banned from recomputation hang from the source. The minimum cut is the cheapest valid saved
set (Theorem 3.6). Among equally cheap cuts remat prefers those closest to the backward pass
(seeds/000 Section 3.4), resolved exactly by a second max-flow so the preference can never
raise the cost: first the least new memory (inputs and params are held anyway), then the smallest distance-weighted cost.

>>> from remat.examples import cos_cos_graph
>>> mincut(cos_cos_graph()).saved_names
['add_2']
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import PlanError
from ..graph import Graph
from ..plans import Plan
from ..saved_set import backward_demand, required_forward
from .maxflow import INF, InfiniteCutError, lexicographic_min_cut, min_cut

MODES = ("conservative", "aggressive")
REDUCTION_RATIO = 4
"""A reduction whose output is more than this many times smaller than its inputs is banned."""
_DIST_CAP = 100


@dataclass(frozen=True)
class Analysis:
    """Per-node facts the cut is built from; exposed for tests, plans and explanations."""

    required_fw: list[bool]
    materialized: list[bool]
    capacity: list[int]  # w or 2w, before any tie-break
    ban: dict[str, str]  # node name -> reason it may not be recomputed
    dist_from_bw: list[int]


def analyse(g: Graph, mode: str = "conservative") -> Analysis:
    if mode not in MODES:
        raise ValueError(f"unknown min-cut mode {mode!r}; use one of {MODES}")
    nodes = g.nodes
    users = g.user_indices
    ins = g.input_indices
    req = required_forward(g)

    dist = [0] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        if req[i]:
            d = min((dist[u] + 1 for u in users[i]), default=10**9)
            dist[i] = min(d, 10**9)

    def fusible_with_users(i: int) -> bool:
        return nodes[i].fusible and all(nodes[u].fusible for u in users[i])

    materialized = [n.is_primal or n.is_output or not fusible_with_users(i) for i, n in enumerate(nodes)]
    capacity = [n.bytes if materialized[i] else 2 * n.bytes for i, n in enumerate(nodes)]

    def materialized_in_backward(i: int) -> bool:
        # a user outside the forward pass that cannot fuse with it (looking through views)
        todo, seen = [i], {i}
        while todo:
            cur = todo.pop()
            for u in users[cur]:
                if not req[u] and not (nodes[cur].fusible and nodes[u].fusible):
                    return True
                if nodes[u].category == "view" and u not in seen:
                    seen.add(u)
                    todo.append(u)
        return False

    ban: dict[str, str] = {}
    for i, n in enumerate(nodes):
        if not n.is_forward or n.is_primal:
            continue
        reason = None
        if n.must_save:
            reason = "flagged must_save"
        elif n.must_recompute or n.category == "view" or not req[i]:
            reason = None
        elif n.category == "random":
            reason = "random op (recomputing it would draw fresh randomness)"
        elif n.category == "compute":
            reason = "compute-intensive op"
        elif mode == "conservative":
            in_bytes = sum(nodes[j].bytes for j in ins[i])
            if not n.fusible:
                reason = "not fusible (conservative mode recomputes only fusible ops)"
            elif n.category == "reduction" and n.bytes * REDUCTION_RATIO < in_bytes:
                reason = f"reduction with output over {REDUCTION_RATIO}x smaller than its inputs"
            elif materialized_in_backward(i):
                reason = "materialized in the backward pass anyway"
        if reason:
            ban[n.name] = reason
    return Analysis(req, materialized, capacity, ban, dist)


@dataclass(frozen=True)
class FlowNetwork:
    """The auxiliary graph G' of Algorithm 1 as arc arrays. Vertex 0 is s, 1 is t, node i
    has ``2 + 2i`` (in) and ``3 + 2i`` (out). ``caps`` uses ``maxflow.INF`` for infinity;
    ``memory`` (new bytes a saved value holds: zero for inputs and params, which are held anyway)
    and ``distance`` (capacity re-weighted by 1.1 ** distance to the backward) only break
    ties among the cheapest cuts, in that order."""

    num_vertices: int
    tails: list[int]
    heads: list[int]
    caps: list[int]
    memory: list[int]
    distance: list[int]


def flow_network(g: Graph, a: Analysis) -> FlowNetwork:
    nodes = g.nodes
    tails: list[int] = []
    heads: list[int] = []
    caps: list[int] = []
    sec: list[int] = []
    mem: list[int] = []
    demand = set(backward_demand(g))
    users = g.user_indices
    S, T = 0, 1
    for i, node in enumerate(nodes):
        vin, vout = 2 + 2 * i, 3 + 2 * i
        if not node.is_forward:
            tails.append(vin); heads.append(T); caps.append(INF); sec.append(0); mem.append(0)  # noqa: E702
            continue
        if node.is_primal or node.name in a.ban:
            tails.append(S); heads.append(vin); caps.append(INF); sec.append(0); mem.append(0)  # noqa: E702
        tails.append(vin)
        heads.append(vout)
        mem.append(0 if node.is_primal else node.bytes)
        if node.must_recompute:
            caps.append(INF)
            sec.append(0)
        else:
            c = a.capacity[i]
            caps.append(c)
            sec.append(int(c * 1.1 ** max(min(a.dist_from_bw[i], _DIST_CAP), 1)))
        if i in demand:
            tails.append(vout); heads.append(T); caps.append(INF); sec.append(0); mem.append(0)  # noqa: E702
        for u in users[i]:
            tails.append(vout); heads.append(2 + 2 * u); caps.append(INF); sec.append(0); mem.append(0)  # noqa: E702
    return FlowNetwork(2 + 2 * len(nodes), tails, heads, caps, mem, sec)


def mincut(g: Graph, mode: str = "conservative", tie_break: bool = True) -> Plan:
    """Plan ``g`` with the fusion-aware min cut; returns a saved-set :class:`Plan`.

    ``mode="conservative"`` recomputes only fusible ops (fast step); ``"aggressive"``
    recomputes everything but compute-intensive and random ops (least memory).
    ``tie_break`` prefers, among the cheapest cuts, values closest to the backward pass.
    """
    t0 = time.perf_counter()
    a = analyse(g, mode)
    net = flow_network(g, a)
    t_build = time.perf_counter()
    nodes = g.nodes
    try:
        if tie_break:
            cut = lexicographic_min_cut(net.num_vertices, net.tails, net.heads, net.caps,
                                        net.memory, net.distance, s=0, t=1)
        else:
            cut = min_cut(net.num_vertices, net.tails, net.heads, net.caps, 0, 1)
    except InfiniteCutError as e:
        names = list(dict.fromkeys(nodes[(v - 2) // 2].name for v in e.path if v >= 2))
        raise PlanError(
            "no valid saved set exists: the backward needs "
            + " -> ".join(names)
            + " but each of these is either banned from recomputation or flagged "
            "must_recompute (cannot be saved). Clear one of those flags."
        ) from None
    side = cut.source_side
    saved = [nd.name for i, nd in enumerate(nodes)
             if nd.is_forward and side[2 + 2 * i] and not side[3 + 2 * i]]
    cost = sum(a.capacity[g.index(s)] for s in saved)
    if cost != cut.value:
        raise AssertionError(f"min-cut bookkeeping: saved set costs {cost}, flow is {cut.value}")
    t_end = time.perf_counter()
    return Plan.from_saved_set(
        g, saved, solver="mincut", options={"mode": mode, "tie_break": tie_break},
        cost=float(cost), solve_seconds=t_end - t0, banned=a.ban,
        stats={"build_seconds": t_build - t0, "maxflow_seconds": t_end - t_build,
               "flow_vertices": net.num_vertices, "flow_arcs": len(net.tails)},
    )


def cut_cost(g: Graph, saved, mode: str = "conservative") -> int:
    """The seeds' cost of a saved set: sum of w (materialized) or 2w over the saved nodes."""
    a = analyse(g, mode)
    return sum(a.capacity[g.index(s)] for s in saved)


def banned(g: Graph, mode: str = "conservative") -> dict[str, str]:
    return analyse(g, mode).ban


__all__ = ["mincut", "analyse", "cut_cost", "banned", "MODES"]
