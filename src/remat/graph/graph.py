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
import gc
import heapq
import itertools
import numbers
import operator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Iterator, Sequence

import numpy as np

from ..errors import GraphError
from .limits import MAX_DIM, MAX_NODE_BYTES, MAX_RANK, MAX_TOTAL_BYTES, MAX_WORK, check_shape

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
    recompute, e.g. user-tagged or effectful), ``must_recompute`` (the user asks that it be
    recomputed, never saved; lifts the bans except on random ops), ``can_save`` (False for values
    that cannot cross to the backward, such as a tuple whose items can; bans still apply), ``is_output``
    (an output of the step: on a forward node a forward output such as the loss, written to
    memory anyway; on a backward node a gradient the backward returns) and
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
    can_save: bool = True
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

    ``meta``: free-form facts about the whole graph (capture records there, under
    ``"dynamic"``, that sizes were symbolic and the hint sizes it was planned at).
    """

    def __init__(self, nodes: Iterable[Node], name: str = "graph", meta: dict | None = None) -> None:
        self.name = name
        self.meta: dict = dict(meta or {})
        given = list(nodes)
        _check_fields(given)
        ordered, self._index, self._input_lens, self._input_idx = _toposort(given)
        self.nodes: tuple[Node, ...] = tuple(ordered)
        roles = map(operator.attrgetter("role"), ordered)
        self._role_code = np.fromiter(map(_ROLE_CODE.__getitem__, roles), dtype=np.int8,
                                      count=len(ordered))
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
        for i, ins in enumerate(self.input_indices):
            for j in ins:
                users[j].append(i)
        return tuple(map(tuple, users))

    @cached_property
    def input_indices(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of its distinct inputs (first occurrences, in order)."""
        a = self._arrays
        deg = np.diff(a.in_ptr)
        out = np.empty(a.n, dtype=object)
        with gc_paused():  # 10^5 small tuples: the cyclic collector would scan the heap
            for d in np.unique(deg).tolist():  # the nodes of one in-degree at a time
                rows = np.flatnonzero(deg == d)
                flat = iter(a.in_idx[(a.in_ptr[rows, None] + np.arange(d)).reshape(-1)].tolist())
                out[rows] = np.fromiter(zip(*[flat] * d) if d else itertools.repeat((), len(rows)),
                                        dtype=object, count=len(rows))
            return tuple(out.tolist())

    @property
    def user_indices(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of the nodes that read it."""
        return self._users

    @cached_property
    def _arrays(self) -> "GraphArrays":
        """The graph as numpy arrays (CSR adjacency and per-node flags) for vectorized passes."""
        return GraphArrays(self)

    @cached_property
    def _memo(self) -> dict:
        """Results of passes that depend on the graph alone (a Graph does not change after
        construction), by name; see :meth:`_derived`."""
        return {}

    def _derived(self, key: str, compute):
        """``compute(self)``, memoized per graph in :attr:`_memo`. Callers must not mutate
        the result."""
        cache = self._memo
        try:
            return cache[key]
        except KeyError:
            value = cache[key] = compute(self)
            return value

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
        return Graph(nodes, name=self.name, meta=self.meta)


class GraphArrays:
    """Per-node fields, flags and CSR adjacency of a :class:`Graph`, computed once and shared
    by the solvers' vectorized passes. Treat every array as read-only.

    ``names``, ``ops``: lists of the nodes' names and op names; ``flops``: float64; ``cost``:
    the profiled cost as float64, NaN where a node has none; ``meta_nodes``: the nodes whose
    ``meta`` is not empty, ascending (passes that read capture's marks visit these alone).

    ``in_ptr``/``in_idx``: node ``i`` reads ``in_idx[in_ptr[i]:in_ptr[i+1]]`` (distinct inputs,
    in :attr:`Graph.input_indices` order). ``user_ptr``/``user_idx``/``user_src``: node ``i`` is
    read by ``user_idx[user_ptr[i]:user_ptr[i+1]]`` (ascending, as in
    :attr:`Graph.user_indices`); ``user_src`` repeats ``i`` for each of those entries.
    ``bytes`` is int64, or an object array of Python ints when the sizes are so large that
    2x their sum times the tie-break weights could overflow int64.

    >>> from remat.graph.examples import cos_cos_graph
    >>> a = cos_cos_graph()._arrays
    >>> a.user_idx[a.user_ptr[4]:a.user_ptr[5]].tolist(), int(a.forward.sum())
    ([5], 13)
    """

    SAFE_TOTAL_BYTES = 2**48

    def __init__(self, g: Graph) -> None:
        # Built from a few big arrays rather than per-node Python objects: allocating many
        # long-lived containers sets off the cyclic garbage collector over the whole heap.
        nodes = g.nodes
        n = self.n = len(nodes)
        # every field the passes read, in one pass over the nodes, then a column per field: a
        # comprehension's attribute reads are specialized, half the time of an attrgetter's,
        # and one pass for them all a third of the time of one pass per field. The rows and
        # columns are gone before the collector runs again (it would scan them all)
        with gc_paused():
            rows = [(x.name, x.op, x.meta, x.flops, x.cost, x.category, x.bytes, x.fusible, x.must_save,
                     x.must_recompute, x.can_save, x.is_output, x.backward_output) for x in nodes]
            col = dict(zip(_COLUMNS, tuple(zip(*rows)) or ((),) * len(_COLUMNS)))
            del rows
            self.names: list[str] = list(col["name"])
            self.ops: list[str] = list(col["op"])
            self.meta_nodes: list[int] = list(itertools.compress(range(n), col["meta"]))
            self.flops = np.array(col["flops"], dtype=np.float64).reshape(n)
            costs = col["cost"]
            self.cost = np.full(n, np.nan) if costs.count(None) == n else \
                np.array([np.nan if c is None else c for c in costs], dtype=np.float64)
            self.category = np.fromiter(map(_CATEGORY_CODE.__getitem__, col["category"]), dtype=np.int8, count=n)
            flags = {name: np.array(col[name], dtype=bool).reshape(n) for name in _COLUMNS[7:]}
            nbytes = col["bytes"]
            if sum(nbytes) < self.SAFE_TOTAL_BYTES:
                self.bytes = np.array(nbytes, dtype=np.int64).reshape(n)
            else:
                self.bytes = np.empty(n, dtype=object)
                self.bytes[:] = nbytes
            del col, costs, nbytes

        lens, in_idx = g._input_lens, g._input_idx  # resolved by the constructor (repeats kept)
        reader = np.repeat(np.arange(n, dtype=np.int64), lens)
        if len(in_idx) and n:
            # a node reading one value twice counts it once (first occurrence kept); the keys
            # come in runs per reader, which the stable sort (timsort) exploits
            key = reader * n + in_idx
            sorted_key = np.sort(key, kind="stable")
            if (sorted_key[1:] == sorted_key[:-1]).any():
                _, first = np.unique(key, return_index=True)
                keep = np.zeros(len(key), dtype=bool)
                keep[first] = True
                in_idx, reader = in_idx[keep], reader[keep]
                lens = np.bincount(reader, minlength=n)
        self.in_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=self.in_ptr[1:])
        self.in_idx = in_idx
        order = np.argsort(in_idx, kind="stable")
        self.user_idx = reader[order]
        self.user_src = in_idx[order]
        self.user_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(in_idx, minlength=n), out=self.user_ptr[1:])

        role = g._role_code  # computed by the constructor
        self.primal = role <= _ROLE_CODE["param"]
        self.forward = role <= _ROLE_CODE["forward"]
        self.view = self.category == _CATEGORY_CODE["view"]
        self.fusible = flags["fusible"]
        self.must_save = flags["must_save"]
        self.must_recompute = flags["must_recompute"]
        self.cannot_save = self.must_recompute | ~flags["can_save"]
        self.is_output = flags["is_output"]
        self.backward_output = flags["backward_output"]

    @cached_property
    def user_lists(self) -> tuple[list[int], list[int]]:
        """(``user_ptr``, ``user_idx``) as Python lists, for sweeps written in Python."""
        return self.user_ptr.tolist(), self.user_idx.tolist()


_COLUMNS = ("name", "op", "meta", "flops", "cost", "category", "bytes", "fusible", "must_save",
            "must_recompute", "can_save", "is_output", "backward_output")
"""The fields :class:`GraphArrays` reads, in the order of its rows."""


@contextmanager
def gc_paused():
    """Building 10^5 small objects at once (a graph's arrays, a schedule's statements): the
    cyclic collector would scan the whole heap many times over (half the time of a schedule of a
    50k-node graph), and none of them cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_ROLE_CODE = {"input": 0, "param": 1, "forward": 2, "tangent": 3, "backward": 4}
_CATEGORY_CODE = {c: i for i, c in enumerate(CATEGORIES)}


def _check_fields(nodes: list[Node]) -> None:
    """Every node's fields against their types and the bounds of :mod:`remat.graph.limits`
    (the one check of a graph's values, whether it came from a file, capture or Python)."""
    seen: set[str] = set()
    total = 0
    for n in nodes:
        if not isinstance(n.name, str) or not n.name:
            raise GraphError(f"node {n!r} has no name: every node needs a unique non-empty name")
        if n.name in seen:
            raise GraphError(f"duplicate node name {n.name!r}: node names must be unique")
        seen.add(n.name)
        if not isinstance(n.op, str):
            raise GraphError(f"node {n.name!r} has op={n.op!r}: the op is its name as text ('add', 'mm')")
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
        if n.bytes > MAX_NODE_BYTES:
            raise GraphError(f"node {n.name!r} has bytes={n.bytes}: more than 1 PiB (2**50 bytes) in one "
                             "tensor, more than any device holds; is the file corrupt?")
        total += n.bytes
        if n.cost is not None and not _is_work(n.cost):
            raise GraphError(f"node {n.name!r} has cost={n.cost!r}: compute cost must be a finite number "
                             f"from 0 to {MAX_WORK:g}")
        if not _is_work(n.flops):
            raise GraphError(f"node {n.name!r} has flops={n.flops!r}: FLOPs must be a finite number from 0 "
                             f"to {MAX_WORK:g}")
        if n.dtype is not None and not isinstance(n.dtype, str):
            raise GraphError(f"node {n.name!r} has dtype={n.dtype!r}: a dtype is its name ('float32') or null")
        if n.shape is not None and (len(n.shape) > MAX_RANK or any(s < 0 for s in n.shape) or
                                    any(s > MAX_DIM for s in n.shape)):
            check_shape(f"node {n.name!r}", n.shape)
        if n.must_save and n.must_recompute:
            raise GraphError(f"node {n.name!r} is flagged both must_save and must_recompute")
    if total > MAX_TOTAL_BYTES:
        raise GraphError(f"the graph's nodes hold {total} bytes together, more than 64 PiB (2**56): no "
                         "training step holds that much; is the file corrupt?")
    for n in nodes:
        for inp in n.inputs:
            if inp not in seen:
                raise GraphError(f"node {n.name!r} reads unknown input {inp!r}")
            if inp == n.name:
                raise GraphError(f"node {n.name!r} reads itself: the graph has a cycle")


def _is_work(x: object) -> bool:
    """A number of FLOPs or a cost: finite, from 0 to :data:`~remat.graph.limits.MAX_WORK`."""
    if type(x) is int or type(x) is float:  # the common case, without the slow ABC check
        return 0 <= x <= MAX_WORK  # NaN and infinity fail
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 <= x <= MAX_WORK


def _toposort(nodes: list[Node]):
    """Kahn's algorithm, keeping the given order among ready nodes.

    Returns the sorted nodes, their name -> index map, and each sorted node's inputs resolved
    to indices (``lens`` per node, then the flat ``idx``; repeated inputs kept).
    """
    position = {n.name: i for i, n in enumerate(nodes)}
    inputs = list(map(operator.attrgetter("inputs"), nodes))
    lens = np.fromiter(map(len, inputs), dtype=np.int64, count=len(nodes))
    idx = np.fromiter(map(position.__getitem__, itertools.chain.from_iterable(inputs)),
                      dtype=np.int64, count=int(lens.sum()))
    if (idx < np.repeat(np.arange(len(nodes)), lens)).all():
        # already topological: Kahn's algorithm (smallest given position first) keeps it
        return nodes, position, lens, idx
    order = _kahn(nodes, position)
    rank = np.empty(len(nodes), dtype=np.int64)
    rank[order] = np.arange(len(nodes))
    given_start = np.concatenate(([0], np.cumsum(lens)[:-1]))
    sorted_lens = lens[order]
    sorted_start = np.concatenate(([0], np.cumsum(sorted_lens)[:-1]))
    gather = np.repeat(given_start[order] - sorted_start, sorted_lens) + np.arange(len(idx))
    ordered = [nodes[i] for i in order]
    return ordered, {n.name: i for i, n in enumerate(ordered)}, sorted_lens, rank[idx[gather]]


def _kahn(nodes: list[Node], position: dict[str, int]) -> list[int]:
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
    return order


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
    # vectorized screen; the node-by-node checks below run only to name a problem found
    role = g._role_code
    placeholder = (role <= _ROLE_CODE["param"]) | (role == _ROLE_CODE["tangent"])
    forward_reader = np.repeat(role == _ROLE_CODE["forward"], g._input_lens)
    if not (placeholder & (g._input_lens > 0)).any() and \
            not (forward_reader & (role[g._input_idx] > _ROLE_CODE["forward"])).any():
        return
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
