"""The joint forward+backward graph that every layer of remat speaks.

A :class:`Graph` is a DAG of :class:`Node` in topological order. It knows nothing of torch:
capture builds one from an fx joint graph, the JSON readers build one from a file, and the
solvers read it. Example::

    >>> from remat.graph import Graph, Node
    >>> g = Graph([
    ...     Node("x", "placeholder", (), role="input", bytes=400, category="input"),
    ...     Node("cos", "cos", ("x",), role="forward", bytes=400, category="pointwise"),
    ...     Node("tangent", "placeholder", (), role="tangent", bytes=400, category="input"),
    ...     Node("sin", "sin", ("x",), role="forward", bytes=400, category="pointwise"),
    ...     Node("neg", "neg", ("sin",), role="forward", bytes=400, category="pointwise"),
    ...     Node("grad_x", "mul", ("tangent", "neg"), role="backward", bytes=400,
    ...          category="pointwise"),
    ... ])
    >>> [n.name for n in g.users("x")]
    ['cos', 'sin']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator, Sequence

from .errors import GraphError

ROLES = ("input", "param", "tangent", "forward", "backward")
"""``input``/``param``: primal inputs of the step; ``tangent``: incoming gradients;
``forward``: computable from primals alone; ``backward``: needs a tangent (or must run in
the backward for another reason)."""

CATEGORIES = ("input", "pointwise", "reduction", "view", "compute", "random", "other")
"""How an op behaves for planning: ``compute`` ops (matmul, conv, attention) are expensive to
recompute, ``random`` ops must never be recomputed, ``pointwise``/``reduction``/``view`` ops
fuse into neighbouring kernels, ``other`` is everything else (not fusible)."""

FUSIBLE_CATEGORIES = frozenset({"pointwise", "reduction", "view"})
PRIMAL_ROLES = frozenset({"input", "param"})
FORWARD_ROLES = frozenset({"input", "param", "forward"})


@dataclass(frozen=True)
class Node:
    """One value of the joint graph: the op that produces it and what planning needs to know.

    ``bytes`` is the size of the output; ``flops`` the work to compute it; ``cost`` a profiled
    compute time where one is known (Checkmate's graphs carry one). ``fusible`` defaults
    from the category (pointwise, reduction and view ops fuse). Flags: ``must_save`` (never
    recompute, e.g. user-tagged or effectful), ``must_recompute`` (never save), ``is_output``
    (an output of the forward pass, so it is written to memory anyway) and
    ``backward_output`` (a gradient the backward returns that is computable from primals).
    """

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    role: str = "forward"
    bytes: int = 0
    flops: float = 0.0
    category: str = "other"
    cost: float | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    fusible: bool | None = None
    must_save: bool = False
    must_recompute: bool = False
    is_output: bool = False
    backward_output: bool = False
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.fusible is None:
            object.__setattr__(self, "fusible", self.category in FUSIBLE_CATEGORIES)

    @property
    def is_primal(self) -> bool:
        return self.role in PRIMAL_ROLES

    @property
    def is_forward(self) -> bool:
        """Computable from the primal inputs alone (the paper's V_f)."""
        return self.role in FORWARD_ROLES

    def replace(self, **changes) -> "Node":
        return dataclasses.replace(self, **changes)


class Graph:
    """A validated joint graph in topological order.

    Nodes may be given in any order; they are sorted topologically (stable: the given order
    is kept where the data flow allows). Raises :class:`GraphError` on duplicate names,
    unknown inputs, cycles, negative sizes, unknown roles or categories, and role
    inconsistencies (a forward node that reads a tangent or backward value).
    """

    def __init__(self, nodes: Iterable[Node], name: str = "graph") -> None:
        self.name = name
        given = list(nodes)
        _check_fields(given)
        self.nodes: tuple[Node, ...] = tuple(_toposort(given))
        self._index = {n.name: i for i, n in enumerate(self.nodes)}
        _check_roles(self)

    # -- lookup -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __getitem__(self, name: str) -> Node:
        try:
            return self.nodes[self._index[name]]
        except KeyError:
            raise KeyError(f"no node named {name!r} in graph {self.name!r}") from None

    def index(self, name: str) -> int:
        return self._index[name]

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"

    # -- structure ----------------------------------------------------------------------
    @cached_property
    def _users(self) -> tuple[tuple[int, ...], ...]:
        users: list[list[int]] = [[] for _ in self.nodes]
        for i, n in enumerate(self.nodes):
            for inp in dict.fromkeys(n.inputs):
                users[self._index[inp]].append(i)
        return tuple(tuple(u) for u in users)

    @cached_property
    def input_indices(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of its distinct inputs."""
        return tuple(tuple(self._index[i] for i in dict.fromkeys(n.inputs)) for n in self.nodes)

    @property
    def user_indices(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of the nodes that read it."""
        return self._users

    def users(self, name: str) -> list[Node]:
        return [self.nodes[j] for j in self._users[self._index[name]]]

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(i, n.name) for n in self.nodes for i in dict.fromkeys(n.inputs)]

    def select(self, *, roles: Sequence[str] | None = None) -> list[Node]:
        return [n for n in self.nodes if roles is None or n.role in roles]

    def total_bytes(self, names: Iterable[str]) -> int:
        return sum(self[n].bytes for n in names)

    def replace_nodes(self, nodes: Iterable[Node]) -> "Graph":
        return Graph(nodes, name=self.name)


def _check_fields(nodes: list[Node]) -> None:
    seen: set[str] = set()
    for n in nodes:
        if not isinstance(n.name, str) or not n.name:
            raise GraphError(f"node {n!r} has no name: every node needs a unique non-empty name")
        if n.name in seen:
            raise GraphError(f"duplicate node name {n.name!r}: node names must be unique")
        seen.add(n.name)
        if n.role not in ROLES:
            raise GraphError(f"node {n.name!r} has unknown role {n.role!r}; use one of {ROLES}")
        if n.category not in CATEGORIES:
            raise GraphError(
                f"node {n.name!r} has unknown category {n.category!r}; use one of {CATEGORIES}"
            )
        if not isinstance(n.bytes, int) or isinstance(n.bytes, bool) or n.bytes < 0:
            raise GraphError(
                f"node {n.name!r} has bytes={n.bytes!r}: output size must be an integer >= 0"
            )
        if n.cost is not None and n.cost < 0:
            raise GraphError(f"node {n.name!r} has cost={n.cost!r}: compute cost must be >= 0")
        if n.flops < 0:
            raise GraphError(f"node {n.name!r} has flops={n.flops!r}: FLOPs must be >= 0")
        if n.must_save and n.must_recompute:
            raise GraphError(f"node {n.name!r} is flagged both must_save and must_recompute")
    for n in nodes:
        for inp in n.inputs:
            if inp not in seen:
                raise GraphError(f"node {n.name!r} reads unknown input {inp!r}")
            if inp == n.name:
                raise GraphError(f"node {n.name!r} reads itself: the graph has a cycle")


def _toposort(nodes: list[Node]) -> list[Node]:
    """Kahn's algorithm, keeping the given order among ready nodes."""
    import heapq

    position = {n.name: i for i, n in enumerate(nodes)}
    indegree = [len(set(n.inputs)) for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for inp in set(n.inputs):
            users[position[inp]].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = [nodes[i].name for i, d in enumerate(indegree) if d > 0]
        cycle = _find_cycle(nodes, set(stuck))
        raise GraphError(
            "the graph has a cycle: " + " -> ".join(cycle)
            + "; a training graph must be a DAG (check the 'inputs' of these nodes)"
        )
    return [nodes[i] for i in order]


def _find_cycle(nodes: list[Node], stuck: set[str]) -> list[str]:
    by_name = {n.name: n for n in nodes}
    start = sorted(stuck)[0]
    path, seen, cur = [], {}, start
    while cur not in seen:
        seen[cur] = len(path)
        path.append(cur)
        cur = next(i for i in by_name[cur].inputs if i in stuck)
    cycle = path[seen[cur]:] + [cur]
    return list(reversed(cycle))


def _check_roles(g: Graph) -> None:
    for n in g.nodes:
        if n.is_primal or n.role == "tangent":
            if n.inputs:
                raise GraphError(
                    f"node {n.name!r} has role {n.role!r} but reads {list(n.inputs)}: "
                    "inputs, params and tangents are placeholders with no inputs"
                )
            continue
        if n.role == "forward":
            bad = [i for i in n.inputs if not g[i].is_forward]
            if bad:
                raise GraphError(
                    f"node {n.name!r} has role 'forward' but reads {bad[0]!r} "
                    f"(role {g[bad[0]].role!r}); a node that depends on a tangent or backward "
                    "value must have role 'backward'"
                )
