"""Fission as a graph transform (seeds/004 Section 4.2): which regions may be split, and the
graph in which they are.

:func:`fission` builds the :class:`~remat.graph.fission.Fission` of a node set along one
component of the dimension graph (:mod:`remat.graph.dims`) and :func:`illegal` says why a
fission may not run, or None. The rules, from the paper's constraints and MAGIS.md Section 5:

- the region is weakly connected and convex (no path leaves it and comes back);
- every node has exactly one axis (the component gives one), every edge inside the region
  carries that axis (a D-edge), and every node is an op whose dimensions remat knows
  (``meta["dims"]``); placeholders and random ops are never split (a random op outside a
  region draws once and the parts read slices of what it drew);
- forward and backward nodes may share a region: a forward node's parts are forward values,
  which the forward computes and saves, or the backward computes again, part by part, beside
  the backward's own parts (how a region that spans both phases saves memory here);
- n divides the dimension's length, at most :data:`MAX_PARTS` parts (a node whose axis merges
  the dimension with others, such as B*T after a linear layer's view, is a multiple of it:
  its parts are n contiguous chunks, the same split);
- every node computes its part from a part of an input: some input carries its axis (a node
  that makes its axis, such as an ``expand`` of a scalar, is sliced as an input instead);
- batch norm never splits its batch (its statistics would change per part);
- an external input is sliced for every reader in the region, or for none (shared);
- an output merged by adding is a sum-like reduce axis; a multi-output op's tuple is never an
  output (its items are).

:func:`apply_fissions` returns the Graph in which every enabled fission runs as its parts
(names in :mod:`remat.graph.fission`): each part is ``1/n`` of its node's bytes and work
(a partial sum is as large as the whole), slices are views, outputs are merged. The graph is
ordered part by part, so that a schedule in graph order frees a part's intermediates before
the next part runs. Every solver, the simulator and the lowering then see a plain graph.
"""

from __future__ import annotations

from collections import deque
from math import gcd
from typing import Iterable, Sequence

from ..errors import PlanError
from ..graph.dims import Component, axis_length, links
from ..graph.fission import MEAN, MERGED, SUM, Fission, part_name, part_op, slice_name, sum_name
from ..graph.graph import Graph, Node
from ..plans.budget import REFERENCE_OF, reference_figures

MAX_PARTS = 16
"""The most parts a fission runs as (the lowering writes each part; identical parts are then
compiled once, as calls of one subgraph: :mod:`remat.lower.fission_loop`)."""


def fission(g: Graph, component: Component, nodes: Iterable[str], n: int = 1, *,
            index: int = 0, label: str = "") -> Fission:
    """The fission of ``nodes`` (kept in graph order) along ``component``'s dimension, in
    ``n`` parts. Raises :class:`~remat.errors.PlanError` if a node has no axis there or an
    input would be both sliced and shared; :func:`illegal` checks the rest."""
    members = sorted(set(nodes), key=g.index)
    axis = {}
    for v in members:
        if v not in component.axis:
            raise PlanError(f"node {v!r} has no axis in dimension component {component.id}")
        axis[v] = component.axis[v]
    inside = set(members)
    sliced: dict[str, int] = {}
    shared: set[str] = set()
    outputs: dict[str, int] = {}
    for v in members:
        linked = {u: i for u, i, a in links(g[v]) if a == axis[v]}
        for u in dict.fromkeys(g[v].inputs):
            if u in inside:
                continue
            if u in linked:
                if sliced.get(u, linked[u]) != linked[u]:
                    raise PlanError(f"input {u!r} of the region would be sliced along two dimensions")
                sliced[u] = linked[u]
            else:
                shared.add(u)
        node = g[v]
        if node.is_output or node.backward_output or any(w.name not in inside for w in g.users(v)):
            outputs[v] = axis[v] if axis[v] >= 0 else MEAN if node.op.startswith("mean.") else SUM
    both = shared & set(sliced)
    if both:
        raise PlanError(f"input {sorted(both)[0]!r} of the region is sliced for one reader and "
                        "shared by another")
    return Fission(tuple(members), axis, n, region_length(g, component, axis, sliced), sliced,
                   outputs, index, label)


def region_length(g: Graph, component: Component, axis: dict[str, int], sliced: dict[str, int]) -> int:
    """The granularity of a region: the gcd of its nodes' axis lengths and of its sliced
    inputs' lengths along the sliced dimension, a multiple of the component's. A region of
    the tokens alone (B*T) splits finer than its component, which also holds the batch (B)."""
    length = 0
    for v, a in axis.items():
        length = gcd(length, axis_length(g, v, a) or component.length)
    for u, d in sliced.items():
        shape = g[u].shape
        length = gcd(length, shape[d] if shape and 0 <= d < len(shape) else component.length)
    return length if length and length % component.length == 0 else component.length


def illegal(g: Graph, f: Fission) -> str | None:
    """Why ``f`` may not run on ``g``, or None when it may."""
    if f.n < 1 or f.length % f.n:
        return f"{f.n} parts do not divide the dimension's length {f.length}"
    if f.n > MAX_PARTS:
        return f"{f.n} parts: at most {MAX_PARTS}"
    if not f.nodes:
        return "the region is empty"
    missing = [v for v in f.nodes if v not in g]
    if missing:
        return f"node {missing[0]!r} is not in the graph"
    inside = set(f.nodes)
    for v in f.nodes:
        node = g[v]
        why = _node_reason(g, node, f)
        if why:
            return why
        for u in dict.fromkeys(node.inputs):
            if u in inside and (u, f.axis[u], f.axis[v]) not in set(links(node)):
                return (f"edge {u!r} -> {v!r} does not carry the split dimension (axis "
                        f"{f.axis[u]} of {u!r} is not axis {f.axis[v]} of {v!r})")
    if not _connected(g, f.nodes, glue={u for u in f.sliced if g[u].role == "tangent"}):
        return "the region is not connected"
    back = _re_entry(g, inside)
    if back:
        return f"the region is not convex: {back!r} is computed from it and feeds it"
    for v in f.outputs:
        if g[v].meta.get("container"):
            return f"{v!r} is a multi-output op read outside the region; its items must be the outputs"
    for u in f.sliced:
        readers = [v for v in f.nodes if u in g[v].inputs]
        if any((u, f.sliced[u], f.axis[v]) not in set(links(g[v])) for v in readers):
            return f"input {u!r} is sliced for one reader and shared by another"
    return None


def _node_reason(g: Graph, node: Node, f: Fission) -> str | None:
    a = f.axis[node.name]
    if node.op == "placeholder":
        return f"{node.name!r} is an input of the step; inputs are sliced, never split"
    if node.category == "random":
        return f"{node.name!r} is a random op: it must draw once for the whole tensor"
    if "batch_norm" in node.op and a == 0:
        return f"{node.name!r} is a batch norm: its batch statistics cannot be split"
    if "dims" not in node.meta:
        return f"{node.name!r} ({node.op}) is an op whose dimensions remat does not know"
    if not any(b == a for _, _, b in links(node)):
        return (f"{node.name!r} cannot compute a part of its axis {a}: no input carries it "
                "(it can be sliced as an input of the region instead)")
    if node.must_save and node.name not in f.outputs:
        return f"{node.name!r} must be saved, so it must be an output of the region"
    length = axis_length(g, node.name, a)
    if length is not None and length % f.length:
        return f"{node.name!r} has length {length} along its axis {a}, not a multiple of {f.length}"
    return None


def _connected(g: Graph, nodes: Sequence[str], glue: set[str] = frozenset()) -> bool:
    """Whether ``nodes`` are weakly connected, also through ``glue`` (the tangents the region
    slices: the gradient of the region's forward is what its backward starts from)."""
    inside = set(nodes) | set(glue)
    seen = {nodes[0]}
    todo = [nodes[0]]
    while todo:
        v = todo.pop()
        for w in [*g[v].inputs, *(u.name for u in g.users(v))]:
            if w in inside and w not in seen:
                seen.add(w)
                todo.append(w)
    return set(nodes) <= seen


def _re_entry(g: Graph, inside: set[str]) -> str | None:
    """A node outside the region that is computed from it and feeds it (None: convex)."""
    last = max(map(g.index, inside))
    start = [w.name for v in inside for w in g.users(v) if w.name not in inside]
    seen = set(start)
    todo = deque(start)
    while todo:
        w = todo.popleft()
        for x in g.users(w):
            if x.name in inside:
                return w
            if x.name not in seen and g.index(x.name) < last:
                seen.add(x.name)
                todo.append(x.name)
    return None


# -- the transformed graph ------------------------------------------------------------------

def apply_fissions(g: Graph, fissions: Sequence[Fission]) -> Graph:
    """``g`` with every enabled fission (n > 1) run as its parts. Regions must be disjoint.
    Raises :class:`~remat.errors.PlanError` naming the reason if one is illegal."""
    enabled = [f for f in fissions if f.enabled]
    if not enabled:
        return g
    owner: dict[str, Fission] = {}
    for f in enabled:
        why = illegal(g, f)
        if why:
            raise PlanError(f"fission {f.label or f.index}: {why}")
        for v in f.nodes:
            if v in owner:
                raise PlanError(f"node {v!r} is in two fission regions; regions must be disjoint")
            owner[v] = f
    nodes = list(g.nodes)
    for f in enabled:
        nodes = _unrolled(g, nodes, f)
    meta = dict(g.meta)
    meta["fissions"] = [f.to_dict() for f in enabled]
    meta[REFERENCE_OF] = reference_figures(g)  # the step's reference is the unsplit graph's
    return Graph(nodes, name=g.name, meta=meta)


def _unrolled(g: Graph, nodes: list[Node], f: Fission) -> list[Node]:
    """``nodes`` with ``f``'s region replaced by its block (slices, parts in part order,
    merges) at the region's last node; nodes between that depend on the region follow it."""
    inside = set(f.nodes)
    position = {n.name: i for i, n in enumerate(nodes)}
    last = max(position[v] for v in inside)
    after: set[str] = set()
    for node in nodes[:last]:
        if node.name not in inside and any(i in inside or i in after for i in node.inputs):
            after.add(node.name)
    before = [n for n in nodes[:last] if n.name not in inside and n.name not in after]
    between = [n for n in nodes[:last] if n.name in after]
    return before + _block(g, f) + between + nodes[last + 1:]


def _block(g: Graph, f: Fission) -> list[Node]:
    """Slices and parts, part by part; a summed output adds each part in as soon as it is
    computed (so one partial sum is alive, not n), a concatenated one after the last part."""
    out: list[Node] = []
    summed = [v for v, d in f.outputs.items() if d in MERGED]
    for k in range(f.n):
        for u, dim in f.sliced.items():
            out.append(_slice(g[u], dim, f, k))
        for v in f.nodes:
            out.append(_part(g, g[v], f, k))
        if k:
            out.extend(_sum_step(g[v], f, k) for v in summed)
    out.extend(_mean(g[v], f) for v, d in f.outputs.items() if d == MEAN)
    out.extend(_cat(g[v], f) for v, d in f.outputs.items() if d not in MERGED)
    return out


def _rename(u: str, f: Fission, k: int) -> str:
    if u in f.axis:
        return part_name(u, k)
    if u in f.sliced:
        return slice_name(u, f.index, k)
    return u


def _part_shape(shape, axis: int, n: int):
    if shape is None or axis < 0 or axis >= len(shape):
        return shape
    return tuple(s // n if d == axis else s for d, s in enumerate(shape))


def _slice(u: Node, dim: int, f: Fission, k: int) -> Node:
    step = (u.shape[dim] if u.shape else f.length) // f.n  # u's own size along dim: a multiple
    meta = {"alias_of": u.meta.get("alias_of", u.name), "slice": [dim, k * step, (k + 1) * step]}
    return Node(slice_name(u.name, f.index, k), "slice.Tensor", (u.name,),
                role="forward" if u.is_forward else "backward", bytes=u.bytes // f.n,
                category="view", shape=_part_shape(u.shape, dim, f.n), dtype=u.dtype, meta=meta)


def _part(g: Graph, v: Node, f: Fission, k: int) -> Node:
    a = f.axis[v.name]
    meta = {key: val for key, val in v.meta.items() if key not in ("alias_of", "dims", "strides")}
    alias = v.meta.get("alias_of")
    if alias is not None:
        meta["alias_of"] = part_name(alias, k) if alias in f.axis else alias
    if "dims" in v.meta:
        meta["dims"] = [[_rename(u, f, k), i, ax] for u, i, ax in v.meta["dims"]]
    meta["fission_part"] = [v.name, k]
    if v.meta.get("container"):
        nbytes = _container_part_bytes(g, v, f)
    else:
        nbytes = v.bytes // f.n if a >= 0 else v.bytes
    return Node(part_name(v.name, k), part_op(v.op) if a < 0 else v.op, tuple(_rename(u, f, k) for u in v.inputs),
                role=v.role, bytes=nbytes, flops=v.flops / f.n,
                category=v.category, cost=None if v.cost is None else v.cost / f.n,
                shape=_part_shape(v.shape, a, f.n), dtype=v.dtype, fusible=v.fusible,
                can_save=v.can_save, must_recompute=v.must_recompute, meta=meta)


def _container_part_bytes(g: Graph, v: Node, f: Fission) -> int:
    """A multi-output op's part: each item's part (1/n of an item split along the axis, all
    of a partial sum), and 1/n of what no getitem names where the op itself splits. Counted
    whole, a convolution backward's part looked as large as the whole op."""
    items = [w for w in g.users(v.name) if w.op == "getitem"]
    named = sum(w.bytes for w in items)
    parts = sum(w.bytes // f.n if f.axis.get(w.name, -1) >= 0 else w.bytes for w in items)
    rest = max(0, v.bytes - named)
    return parts + (rest // f.n if f.axis[v.name] >= 0 else rest)


def _merged_meta(v: Node) -> dict:
    return {key: val for key, val in v.meta.items()
            if key not in ("alias_of", "dims", "strides", "container")}


def _cat(v: Node, f: Fission) -> Node:
    """``v`` as the concatenation of its parts (it keeps its name, flags and readers)."""
    meta = {**_merged_meta(v), "merge": ["cat", f.outputs[v.name]]}
    return Node(v.name, "cat.default", tuple(part_name(v.name, k) for k in range(f.n)),
                role=v.role, bytes=v.bytes, category="other", shape=v.shape, dtype=v.dtype,
                must_save=v.must_save, can_save=v.can_save, is_output=v.is_output,
                backward_output=v.backward_output, meta=meta)


def _sum_step(v: Node, f: Fission, k: int) -> Node:
    """Part ``k`` of ``v`` added to the sum of the parts before it; the last step is ``v``
    (a mean's is ``sum_name(v, n - 1)``, which :func:`_mean` divides)."""
    acc = part_name(v.name, 0) if k == 1 else sum_name(v.name, k - 1)
    numel = float(v.bytes) if not v.shape else float(_prod(v.shape))
    if k < f.n - 1 or f.outputs[v.name] == MEAN:
        return Node(sum_name(v.name, k), "add.Tensor", (acc, part_name(v.name, k)), role=v.role,
                    bytes=v.bytes, flops=numel, category="pointwise", shape=v.shape, dtype=v.dtype,
                    meta={"merge": ["sum", k]})
    return Node(v.name, "add.Tensor", (acc, part_name(v.name, k)), role=v.role, bytes=v.bytes,
                flops=numel, category="pointwise", shape=v.shape, dtype=v.dtype,
                must_save=v.must_save, can_save=v.can_save, is_output=v.is_output,
                backward_output=v.backward_output, meta={**_merged_meta(v), "merge": ["sum", k]})


def _mean(v: Node, f: Fission) -> Node:
    """A mean over the split dimension: the sum of its parts' sums over the whole count."""
    total = sum_name(v.name, f.n - 1)
    numel = float(v.bytes) if not v.shape else float(_prod(v.shape))
    return Node(v.name, "div.Scalar", (total,), role=v.role, bytes=v.bytes, flops=numel,
                category="pointwise", shape=v.shape, dtype=v.dtype, must_save=v.must_save,
                can_save=v.can_save, is_output=v.is_output, backward_output=v.backward_output,
                meta={**_merged_meta(v), "merge": ["mean", f.n]})


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out
