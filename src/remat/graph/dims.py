"""The dimension graph (D-Graph) of a joint graph: which axes of which nodes are one
"graph-level dimension" (the batch, the heads, ...) that a fission may split (seeds/004
Section 4.1; shared/MAGIS.md 1.1).

Capture stores each op's links in ``Node.meta["dims"]`` (:mod:`remat.capture.dims` gives the
convention): ``[u, i, a]`` says that dimension ``i`` of input ``u`` is the node's axis ``a``
(``a >= 0``: an output dimension; ``a < 0``: a reduce axis, summed over). The D-nodes are the
pairs (node, axis) that links mention, the D-edges the links.

Lengths: a link joins axes of one length, except a reshape's **merge link**, which joins the
outermost dim of a group of dims that the reshape merges into one (or splits one into) with
that one dim: ``[B, T, C] -> [B*T, C]`` links B to B*T (:mod:`remat.capture.dims`,
:func:`is_merge_link`). A component's axes may therefore have different lengths (B, B*T,
B*H), and its ``length`` is its granularity, the smallest of them, of which every other is a
multiple: cutting every member's axis into n contiguous chunks, for n dividing ``length``,
cuts each into the same parts (part k of a merged B*T is the rows of part k of B).
:func:`dim_graph` checks each link against the shapes (equal lengths, or a merge link of a
reshape, :data:`RESHAPES`) and never merges two groups whose lengths would not all be
multiples of the smallest (``[4, 6] -> [24] -> [6, 4]``: 4 and 6 stay apart, n = 4 would not
split the 6).

Components are built as MAGIS's code builds them (``DimGraph.bind_op_graph``): nodes are
visited in reverse topological order (users first), and each axis ``(v, a)`` of ``v`` that a
user links to (``[v, a, b]`` in user ``w``'s links) joins the groups of those ``(w, b)``.
Two groups are never merged where both hold the same node (one axis per node) or where one
holds an ancestor of a node of the other: the path between them does not carry the axis, so
a part would need another part's data (constraint (3) of Section 4.2), or where their lengths
would not all be multiples of the smallest (above). Where some of the user groups conflict,
``(v, a)`` merges with as many as it can, greedily in the users' topological order (the
forward user before the backward's), skipping a group that conflicts with those taken; it
starts a group of its own only where every user group already holds ``v`` on another axis.
``v``'s axes are visited in the order 0, 1, ..., then -1, -2, ...

**Label-side values** (:func:`label_side`): a value computed only from the step's integer or
boolean inputs (labels, token ids, masks), about as large as the largest of them, is in no
component. A region never splits it: it is computed whole before any region, at no more than
its inputs' memory, and a region slices it or shares it. This is what lets a loss's backward
join its forward along the tokens: mean cross-entropy's count of valid targets (``sum(labels
!= ignore_index)``) is a sum over every token that the backward of every token reads (``grad
/ count``); in a component it would be an ancestor, through no split axis, of the backward's
nodes, and the forward and backward would stay apart. Inputs and label-side values are also
nobody's ancestor for that rule: what a region reads from them is computed before it.

A component therefore holds each node at most once, and its D-nodes are connected by links.
It does not by itself make a region legal (:mod:`remat.transforms.fission` checks that): a
node whose axis no input links to (a convolution's H, the head_dim axis a view makes by
splitting 64 into 4 x 16, a random op) is in the component of its users, so that a region
may slice it as an input, but cannot compute its parts itself; an edge between two members
need not carry the component's axes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd, inf, prod
from typing import Callable, Mapping, Sequence

from ..errors import GraphError
from .graph import Graph, Node


RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "_reshape_copy", "as_strided",
                      "flatten", "unflatten", "collapse_view", "collapse", "split_dim"})
"""The ops (``Node.op`` up to its overload) whose links may join dims of different lengths
(merge links: the merged dim's length a multiple of the other's)."""


def is_reshape(node: Node) -> bool:
    return node.op.split(".", 1)[0] in RESHAPES


def is_merge_link(in_shape: Sequence[int], i: int, out_shape: Sequence[int], a: int) -> bool:
    """Whether dim ``i`` of a reshape's input (``in_shape``) and dim ``a`` of its output
    (``out_shape``) make a merge link: the smaller of the two is the outermost dim of a run of
    dims on its side whose product is the larger, starting at the same element offset.
    ``[2, 16, 64] -> [32, 64]``: dims 0 and 0 do (2 is the outermost of 2 x 16 = 32); dims 1
    and 0 do not (16 is not outermost)."""
    big, bi, small, si = ((in_shape, i, out_shape, a) if in_shape[i] > out_shape[a]
                          else (out_shape, a, in_shape, i))
    if small[si] <= 1 or big[bi] % small[si]:
        return False
    start = prod(big[:bi])
    if prod(small[:si]) != start:
        return False
    end, p = start * big[bi], start
    for size in small[si:]:
        p *= size
        if p >= end:
            break
    return p == end


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
    return _Lengths(g)(node, axis)


class _Lengths:
    """:func:`axis_length`, memoized, reading each node's links once."""

    def __init__(self, g: Graph, links_of: dict[str, list[tuple[str, int, int]]] | None = None) -> None:
        self.g = g
        self.links_of = {} if links_of is None else links_of
        self.memo: dict[tuple[str, int], int | None] = {}

    def _links(self, node: Node) -> list[tuple[str, int, int]]:
        own = self.links_of.get(node.name)
        if own is None:
            own = self.links_of[node.name] = links(node)
        return own

    def __call__(self, node: str, axis: int) -> int | None:
        key = (node, axis)
        memo = self.memo
        if key in memo:
            return memo[key]
        n = self.g[node]
        shape = n.shape
        if axis >= 0 and shape is not None:
            length = shape[axis] if axis < len(shape) else None
        else:
            memo[key] = None  # a cycle of links (a malformed graph) ends here
            length = next((x for u, i, a in self._links(n) if a == axis
                           for x in (self(u, i),) if x is not None), None)
            if length is None:
                for w in self.g.users(node):
                    if w.shape is None or is_reshape(w):
                        continue
                    length = next((w.shape[b] for u, i, b in self._links(w)
                                   if u == node and i == axis and 0 <= b < len(w.shape)), None)
                    if length is not None:
                        break
        memo[key] = length
        return length


_FLOATING = ("float", "bfloat", "half", "complex")

LABEL_SIDE_GROWTH = 2
"""How much larger than the largest integer input it comes from a label-side value may be
(labels padded by one for the shift of a causal LM's loss, int32 ids widened to int64)."""


def label_side(g: Graph) -> frozenset[str]:
    """The label-side values of ``g`` (module docstring): ops whose every ancestor placeholder
    is a step input (not a parameter or tangent) of integer or boolean dtype, with at most
    :data:`LABEL_SIDE_GROWTH` times the bytes of the largest of those placeholders (memoized
    per graph)."""
    return g._derived("label_side", _label_side)


def _label_side(g: Graph) -> frozenset[str]:
    data: dict[str, int] = {}  # label-side node -> bytes of its largest ancestor placeholder
    for n in g.nodes:
        if n.op == "placeholder":
            dtype = str(n.dtype or "")
            if n.role == "input" and dtype and not any(f in dtype for f in _FLOATING):
                data[n.name] = n.bytes
            continue
        if not n.inputs and n.category != "random":
            data[n.name] = 0  # a constant: label-side for its readers, itself never split
            continue
        if n.category == "random" or any(u not in data for u in n.inputs):
            continue
        largest = max(data[u] for u in n.inputs)
        if n.bytes <= LABEL_SIDE_GROWTH * largest:
            data[n.name] = largest
    return frozenset(v for v in data if g[v].inputs)


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
    lengths = _Lengths(g)
    shapes = [n.shape for n in nodes]
    hoisted = label_side(g)

    def length(v: int, a: int) -> int | None:
        shape = shapes[v]
        if a >= 0 and shape is not None:
            return shape[a] if a < len(shape) else None
        return lengths(nodes[v].name, a)

    for w, node in enumerate(nodes):
        own = lengths._links(node)
        if not own:
            continue
        if node.name in hoisted:
            links_of[node.name] = frozenset(own)
            continue
        links_of[node.name] = frozenset(own)
        reshape = None
        for u, i, b in own:
            if u not in node.inputs:
                raise GraphError(f"node {node.name!r} links dimension {i} of {u!r}, which it does not "
                                 f"read (meta['dims'] = {node.meta['dims']!r})")
            lu, lw = length(index[u], i), length(w, b)
            if lu != lw and lu is not None and lw is not None:
                if reshape is None:
                    reshape = is_reshape(node)
                us = shapes[index[u]]
                if not (reshape and i >= 0 and b >= 0 and us is not None and node.shape is not None
                        and is_merge_link(us, i, node.shape, b)):
                    raise GraphError(f"node {node.name!r} links axis {i} of {u!r} (length {lu}) to its axis "
                                     f"{b} (length {lw}): its meta['dims'] disagree with the shapes")
            if u not in hoisted:
                user_links[index[u]].setdefault(i, []).append((w, b))
    desc = _descendants(g)
    for v, node in enumerate(nodes):  # what a region reads from these is computed before it
        if node.op == "placeholder" or node.name in hoisted:
            desc[v] = 0
    groups = _Groups(desc, length)
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
    """Union-find over D-nodes (node index, axis). Each root keeps ``[members, nodes, desc,
    gcd, low]``: its members, the bitset of its nodes, the union of its nodes' descendants
    (``node_desc``: each node's), and the gcd (0: none) and the smallest (inf: none) of its
    known axis lengths (``length(v, a)``: a D-node's, None if unknown)."""

    def __init__(self, node_desc: list[int], length: Callable[[int, int], int | None]) -> None:
        self.node_desc = node_desc
        self.length = length
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.data: dict[tuple[int, int], list] = {}

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        parent = self.parent
        if x not in parent:
            parent[x] = x
            length = self.length(*x)
            self.data[x] = [[x], 1 << x[0], self.node_desc[x[0]], length or 0, length or inf]
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
        data = self.data
        bit = 1 << v
        nodes = desc_union = 0
        div, low = data[me][3], data[me][4]
        taken: list[tuple[int, int]] = []
        for r in dict.fromkeys(candidates):
            _, rn, rd, rdiv, rlow = data[r]
            if rn & (bit | nodes | desc_union) or nodes & rd:
                continue  # a node twice, or an ancestor of another group's node
            d, m = gcd(div, rdiv), min(low, rlow)
            if d != m and m != inf:
                continue  # lengths that would not all be multiples of the smallest
            taken.append(r)
            nodes |= rn
            desc_union |= rd
            div, low = d, m
        for r in taken:
            me = self._union(me, r)

    def _union(self, x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
        data = self.data
        if len(data[x][0]) < len(data[y][0]):
            x, y = y, x
        self.parent[y] = x
        dx, dy = data[x], data.pop(y)
        dx[0] += dy[0]
        dx[1] |= dy[1]
        dx[2] |= dy[2]
        dx[3] = gcd(dx[3], dy[3])
        dx[4] = min(dx[4], dy[4])
        return x

    def roots(self) -> list[tuple[int, int]]:
        return [r for r, d in self.data.items() if len(d[0]) > 1]


def _components(g: Graph, groups: _Groups) -> list[Component]:
    found = []
    for r in groups.roots():
        members, _, _, _, low = groups.data[r]
        members = sorted(members)
        axis = {g.nodes[v].name: a for v, a in members}
        if low == inf:
            raise GraphError(f"the dimension component of {axis!r} has no known length: its nodes need shapes")
        found.append((members[0][0], axis, int(low)))  # also the gcd of its lengths (join)
    found.sort(key=lambda c: (-len(c[1]), c[0]))
    return [Component(i, axis, length) for i, (_, axis, length) in enumerate(found)]
