"""The dimension graph (D-Graph) of a joint graph: which axes of which nodes are one
"graph-level dimension" (the batch, the heads, ...) that a fission may split (seeds/004
Section 4.1; shared/MAGIS.md 1.1).

Capture stores each op's links in ``Node.meta["dims"]`` (:mod:`remat.capture.dims` gives the
convention): ``[u, i, a]`` says that dimension ``i`` of input ``u`` is the node's axis ``a``
(``a >= 0``: an output dimension; ``a < 0``: a reduce axis, summed over). The D-nodes are the
pairs (node, axis) that links mention, the D-edges the links.

Lengths: a link joins axes of one length, except a reshape's **merge link**, which joins the
outermost dim of a group of dims that the reshape merges into one (or splits one into) with
that one dim: ``[B, T, C] -> [B*T, C]`` links B to B*T (:mod:`remat.capture.dims`). A
component's axes may therefore have different lengths (B, B*T, B*H), and its ``length`` is its
granularity, the smallest of them, of which every other is a multiple: cutting every member's
axis into n contiguous chunks, for n dividing ``length``, cuts each into the same parts (part
k of a merged B*T is the rows of part k of B). :func:`dim_graph` checks each link against the
shapes (equal lengths, or a multiple for a reshape, :data:`RESHAPES`) and never merges two
groups whose lengths would not all be multiples of the smallest (a B*T reshaped into
``[T', B']``, neither a multiple of the other, stays apart).

Components are built as MAGIS's code builds them (``DimGraph.bind_op_graph``): nodes are
visited in reverse topological order (users first), and each axis ``(v, a)`` of ``v`` that a
user links to (``[v, a, b]`` in user ``w``'s links) joins the groups of those ``(w, b)``.
Two groups are never merged where both hold the same node (one axis per node) or where one
holds an ancestor of a node of the other: the path between them does not carry the axis, so
a part would need another part's data (constraint (3) of Section 4.2), or where their lengths
would not all be multiples of the smallest (above). Where some of the user
groups conflict, ``(v, a)`` merges with as many as it can, greedily in the users' topological
order (the forward user before the backward's), skipping a group that conflicts with those
taken; it starts a group of its own only where every user group already holds ``v`` on
another axis. ``v``'s axes are visited in the order 0, 1, ..., then -1, -2, ...

A component therefore holds each node at most once, and its D-nodes are connected by links.
It does not by itself make a region legal (:mod:`remat.transforms.fission` checks that): a
node whose axis no input links to (a convolution's H, the heads axis a view makes by
splitting 64 into 4 x 16, a random op) is in the component of its users, so that a region
may slice it as an input, but cannot compute its parts itself; an edge between two members
need not carry the component's axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd, inf
from typing import Callable, Mapping

from ..errors import GraphError
from .graph import Graph, Node


RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "_reshape_copy",
                      "flatten", "unflatten", "collapse_view", "collapse", "split_dim"})
"""The ops (``Node.op`` up to its overload) whose links may join dims of different lengths
(merge links: the merged dim's length a multiple of the other's)."""


def is_reshape(node: Node) -> bool:
    return node.op.split(".", 1)[0] in RESHAPES


@dataclass(frozen=True)
class Component:
    """One graph-level dimension: ``axis`` maps each member node to its axis in it (exactly
    one per node). ``length`` is its granularity, the smallest of its members' axis lengths:
    every member's axis length is a positive multiple of it (B*T for the batch B after a
    reshape merges it with the sequence), and n parts split every member exactly (member
    ``v``'s part k is the k-th of n contiguous chunks of its axis, ``axis_length / n`` long)
    where n divides ``length``."""

    id: int
    axis: Mapping[str, int]
    length: int

    def __hash__(self) -> int:  # ``axis`` is a dict
        return hash((self.id, self.length, len(self.axis)))


class DimGraph:
    """The components of a graph's dimension graph (:func:`dim_graph`).

    ``components``: those with at least two nodes, largest first (ties: the one whose first
    node comes first in the graph), ``id`` their position in this list.
    """

    def __init__(self, components: list[Component], links_of: dict[str, frozenset]) -> None:
        self.components = components
        self._links = links_of
        self._where = {(v, a): c for c in components for v, a in c.axis.items()}

    def component_of(self, node: str, axis: int) -> Component | None:
        """The component holding ``node``'s axis ``axis``, None if it is in none (alone)."""
        return self._where.get((node, axis))

    def linked(self, u: str, u_axis: int, v: str, v_axis: int) -> bool:
        """Whether dimension ``u_axis`` of input ``u`` is ``v``'s axis ``v_axis`` (a link of
        ``v``'s ``meta["dims"]``)."""
        return (u, u_axis, v_axis) in self._links.get(v, ())

    def __repr__(self) -> str:
        sizes = [len(c.axis) for c in self.components]
        return f"DimGraph({len(sizes)} components, sizes {sizes[:8]}{'...' if len(sizes) > 8 else ''})"


def links(node: Node) -> list[tuple[str, int, int]]:
    """``node.meta["dims"]`` as ``(input, input_dim, axis)`` tuples; [] if it has none."""
    return [(u, int(i), int(a)) for u, i, a in node.meta.get("dims", ())]


def axis_length(g: Graph, node: str, axis: int) -> int | None:
    """The length of ``node``'s axis ``axis``: its shape's for an output dimension, else that
    of an input dimension linked to it (a reduce axis, a multi-output op's loop axis), else
    that of a user's dimension it is linked to (not a reshape's: its merge links join other
    lengths); None if unknown."""
    return _axis_length(g, node, axis, None)


def _axis_length(g: Graph, node: str, axis: int, memo: dict | None) -> int | None:
    if memo is not None and (node, axis) in memo:
        return memo[node, axis]
    n = g[node]
    length = None
    if axis >= 0 and n.shape is not None:
        length = n.shape[axis] if axis < len(n.shape) else None
    else:
        for u, i, a in links(n):
            if a == axis:
                length = _axis_length(g, u, i, memo)
                if length is not None:
                    break
        else:
            for w in g.users(node):
                if is_reshape(w) or w.shape is None:
                    continue
                length = next((w.shape[b] for u, i, b in links(w)
                               if u == node and i == axis and 0 <= b < len(w.shape)), None)
                if length is not None:
                    break
    if memo is not None:
        memo[node, axis] = length
    return length


def dim_graph(g: Graph) -> DimGraph:
    """The dimension graph of ``g`` (memoized per graph). Raises GraphError if a node's
    ``meta["dims"]`` names a value it does not read or links axes whose lengths disagree
    (differ, other than a multiple through a reshape), or a component's length is unknown."""
    return g._derived("dim_graph", _build)


def _build(g: Graph) -> DimGraph:
    nodes = g.nodes
    index = g._index
    user_links: list[dict[int, list[tuple[int, int]]]] = [{} for _ in nodes]  # u -> axis -> [(w, b)]
    links_of: dict[str, frozenset] = {}
    memo: dict[tuple[str, int], int | None] = {}
    for w, node in enumerate(nodes):
        own = links(node)
        if not own:
            continue
        links_of[node.name] = frozenset(own)
        reshape = None
        for u, i, b in own:
            if u not in node.inputs:
                raise GraphError(f"node {node.name!r} links dimension {i} of {u!r}, which it does not "
                                 f"read (meta['dims'] = {node.meta['dims']!r})")
            lu, lw = _axis_length(g, u, i, memo), _axis_length(g, node.name, b, memo)
            if lu is not None and lw is not None and lu != lw:
                if reshape is None:
                    reshape = is_reshape(node)
                if not (reshape and b >= 0 and lu > 0 and lw > 0 and max(lu, lw) % min(lu, lw) == 0):
                    raise GraphError(f"node {node.name!r} links axis {i} of {u!r} (length {lu}) to its axis "
                                     f"{b} (length {lw}): its meta['dims'] disagree with the shapes")
            user_links[index[u]].setdefault(i, []).append((w, b))
    groups = _Groups(_descendants(g), lambda x: _axis_length(g, nodes[x[0]].name, x[1], memo))
    for v in range(len(nodes) - 1, -1, -1):
        axes = user_links[v]
        for a in sorted(axes, key=lambda x: (x < 0, abs(x))):
            groups.join(v, a, [groups.find((w, b)) for w, b in axes[a]])
    return DimGraph(_components(g, groups), links_of)


def _descendants(g: Graph) -> list[int]:
    """For each node, the bitset (a Python int) of the nodes computed from it."""
    users = g.user_indices
    desc = [0] * len(g.nodes)
    for v in range(len(g.nodes) - 1, -1, -1):
        d = 0
        for w in users[v]:
            d |= desc[w] | (1 << w)
        desc[v] = d
    return desc


class _Groups:
    """Union-find over D-nodes (node index, axis); each root keeps its members, the bitset of
    its nodes, the union of its nodes' descendants (``node_desc``: each node's), and the gcd
    and the smallest of its known axis lengths (``length``: a D-node's, None if unknown)."""

    def __init__(self, node_desc: list[int], length: Callable[[tuple[int, int]], int | None]) -> None:
        self.node_desc = node_desc
        self.length = length
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.members: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.nodes: dict[tuple[int, int], int] = {}
        self.desc: dict[tuple[int, int], int] = {}
        self.gcd: dict[tuple[int, int], int] = {}  # 0: no known length
        self.low: dict[tuple[int, int], float] = {}  # inf: no known length

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        parent = self.parent
        if x not in parent:
            parent[x] = x
            self.members[x] = [x]
            self.nodes[x] = 1 << x[0]
            self.desc[x] = self.node_desc[x[0]]
            length = self.length(x)
            self.gcd[x] = length or 0
            self.low[x] = length or inf
            return x
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def join(self, v: int, a: int, candidates: list[tuple[int, int]]) -> None:
        """Merge (v, a) with the candidate groups it can take (module docstring)."""
        me = self.find((v, a))
        bit = 1 << v
        taken: list[tuple[int, int]] = []
        nodes = desc_union = 0
        div, low = self.gcd[me], self.low[me]
        for r in dict.fromkeys(candidates):
            rn, rd = self.nodes[r], self.desc[r]
            if rn & (bit | nodes | desc_union) or nodes & rd:
                continue  # a node twice, or an ancestor of another group's node
            d, m = gcd(div, self.gcd[r]), min(low, self.low[r])
            if m != inf and d != m:
                continue  # lengths that would not all be multiples of the smallest
            taken.append(r)
            nodes |= rn
            desc_union |= rd
            div, low = d, m
        for r in taken:
            me = self._union(me, r)

    def _union(self, x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
        if len(self.members[x]) < len(self.members[y]):
            x, y = y, x
        self.parent[y] = x
        self.members[x] += self.members.pop(y)
        self.nodes[x] |= self.nodes.pop(y)
        self.desc[x] |= self.desc.pop(y)
        self.gcd[x] = gcd(self.gcd[x], self.gcd.pop(y))
        self.low[x] = min(self.low[x], self.low.pop(y))
        return x

    def roots(self) -> list[tuple[int, int]]:
        return [r for r in self.members if len(self.members[r]) > 1]


def _components(g: Graph, groups: _Groups) -> list[Component]:
    found = []
    for r in groups.roots():
        members = sorted(groups.members[r])
        axis = {g.nodes[v].name: a for v, a in members}
        if groups.low[r] == inf:
            raise GraphError(f"the dimension component of {axis!r} has no known length: its nodes need shapes")
        found.append((members[0][0], axis, int(groups.low[r])))  # the gcd too (join)
    found.sort(key=lambda c: (-len(c[1]), c[0]))
    return [Component(i, axis, length) for i, (_, axis, length) in enumerate(found)]
