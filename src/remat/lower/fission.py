"""Lowering a fission (:class:`remat.graph.fission.Fission`) to the joint fx graph.

:func:`fission_joint` copies a joint graph module and unrolls every fission with ``n > 1``: the
region S runs as n parts, one after another, each on a 1/n slice of one dimension (MAGIS,
seeds/004 Section 4.2 and Figure 5). The new nodes carry the names every layer of remat gives
them (:mod:`remat.graph.fission`), so that plans made on the torch-free transform lower onto
this graph by name:

- ``slice_name(u, index, k)``: ``aten.slice.Tensor(u, dim, k*L/n, (k+1)*L/n)`` of each input
  ``u`` in ``sliced`` (``L``: ``u``'s size along ``dim``); other inputs are shared by the parts;
- ``part_name(v, k)``: region node ``v``'s target on part k of its region inputs, the slices
  k and the shared inputs; a size list equal to ``v``'s full output shape (``view``,
  ``expand``, ``new_zeros``, ``full``, ...: an ``int[]`` argument not named ``dim``/``dims``)
  gets the part's shape, dimension ``axis[v]`` divided by n;
- a region output ``v`` keeps its node, name and readers and becomes the merge:
  ``aten.cat.default([part0, ...], dim)``, or for :data:`~remat.graph.fission.SUM` the chain
  ``sum_name(v, 1) = part0 + part1``, ``sum_name(v, 2) = sum_name(v, 1) + part2``, ..., whose
  last add is ``v`` itself (``v = part0 + part1`` when n == 2); each add follows its part, so a
  partial sum is freed as soon as the next one exists; a mean over the split dimension
  (:data:`~remat.graph.fission.MEAN`) runs its parts as ``aten.sum`` over the same dims, and
  ``v`` becomes ``aten.div.Scalar(sum_name(v, n - 1), count)``, count the elements it averages;
- the region's other nodes are erased.

The block (slices, parts, running sums, merges) is placed where the region's last node was;
a reader of a region output that stood before that point moves after its merge (a stable
topological sort, :func:`_sort_stably`).

A ``view``/``_unsafe_view`` part whose input is a slice no strides can view (a slice along an
inner dimension of a flattened group) becomes ``aten._reshape_copy.default`` with the same
arguments: a contiguous copy, which remat's capture counts as a new value (it is one), under
the same name. Every new node's ``meta["val"]`` is computed with the graph's fake mode and
checked (a part: ``v``'s shape with the axis divided by n, or ``v``'s shape for a reduce axis;
a merge: ``v``'s original shape and dtype); its other meta is the original node's (a slice:
its first reader's in the region), and a part's ``meta["fission_part"]`` is ``(index, v, k)``
(:data:`PART_META`: how :mod:`remat.lower.fission_loop` finds the parts again). A merge is
a new contiguous tensor where ``v`` may have been a view with other strides (a permute): the
values of its readers are computed again where their strides follow (:func:`_refresh_strides`).
Random ops inside a region, mutating ops, tuple-valued
region outputs, region nodes read outside the region but not listed as outputs, symbolic
sizes along the split dimension and an n that does not divide them raise
:class:`~remat.errors.PlanError` naming the node. Random ops outside a region are fine: they
draw once for the whole tensor and the parts read slices of it.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.node import map_arg

from ..capture.joint import copy_joint, op_types
from ..capture.to_graph import categorize
from ..errors import PlanError
from ..graph.fission import MEAN, MERGED, Fission, part_name, slice_name, sum_name

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default)
_MEAN_PARTS = {aten.mean.dim: aten.sum.dim_IntList, aten.mean.default: aten.sum.default}
"""The op a part of a mean over the split dimension runs (:data:`~remat.graph.fission.MEAN`)."""
PART_META = "fission_part"
"""``meta[PART_META] = (fission index, region node, k)`` on part k of a region node: how the
loop form (:mod:`remat.lower.fission_loop`) finds a part's nodes in the lowered modules."""
_VALUE_META = ("val", "tensor_meta", "unbacked_bindings", PART_META)
"""Meta a new node must not inherit: its value, and what is derived from the value."""


def fission_joint(gm: fx.GraphModule, fissions: Sequence[Fission]) -> fx.GraphModule:
    """A copy of joint graph module ``gm`` with every fission of ``fissions`` whose ``n > 1``
    unrolled, in order (their regions disjoint; ``index`` keeps their slices' names apart).
    Raises PlanError, naming the node, for a fission it cannot lower."""
    out = copy_joint(gm)
    enabled = [f for f in fissions if f.n != 1]
    if enabled:
        fake_mode = _fake_mode(out.graph)
        relaid: set[fx.Node] = set()
        for fission in enabled:
            relaid |= _Unroll(out.graph, fission, fake_mode).run()
            _sort_stably(out.graph)
        _refresh_strides(out.graph, fake_mode, relaid)
    out.graph.lint()
    out.recompile()
    return out


def _fake_mode(graph: fx.Graph):
    vals = [p.meta.get("val") for p in graph.find_nodes(op="placeholder")]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        raise PlanError("fission needs the joint graph's fake values (meta['val'] of its "
                        "placeholders); this graph has none")
    return mode


class _Unroll:
    """One fission applied to ``graph`` in place."""

    def __init__(self, graph: fx.Graph, fission: Fission, fake_mode):
        self.graph, self.f, self.fake_mode = graph, fission, fake_mode
        self.n = fission.n
        by_name = {node.name: node for node in graph.nodes}
        self.region = _region_nodes(fission, by_name)
        self.members = set(self.region)
        self.sliced = _sliced_inputs(fission, by_name, self.members)
        self.parts: dict[fx.Node, list[fx.Node]] = {}
        self.slices: dict[fx.Node, list[fx.Node]] = {}
        self.relaid: set[fx.Node] = set()

    def run(self) -> set[fx.Node]:
        """Unroll; returns the merges whose strides differ from their node's before."""
        _check_fission(self.f, self.region)
        ot = op_types()
        for v in self.region:
            _check_node(self.f, v, ot)
            self._check_readers(v)
        anchor = self.region[-1].next  # the block goes where the region's last node was
        outputs = [v for v in self.region if v.name in self.f.outputs]
        sums = [v for v in outputs if self.f.outputs[v.name] in MERGED]
        running: dict[fx.Node, fx.Node] = {}
        with self.graph.inserting_before(anchor):
            for k in range(self.n):
                for v in self.region:
                    self.parts.setdefault(v, []).append(self._part(v, k))
                for v in sums:
                    running[v] = self._running_sum(v, k, running.get(v), anchor)
        for v in outputs:
            if self.f.outputs[v.name] not in MERGED:
                self._cat(v, anchor)
        for v in reversed(self.region):
            if v.name not in self.f.outputs:
                self.graph.erase_node(v)
        return self.relaid

    def _check_readers(self, v: fx.Node) -> None:
        """A node read outside the region is one of its outputs, and a tensor."""
        readers = [u for u in v.users if u not in self.members]
        val = v.meta.get("val")
        if v.name in self.f.outputs and isinstance(val, (tuple, list)):
            raise PlanError(f"fission {self.f.index}: region output {v.name!r} is a tuple (a "
                            "multi-output op); make its getitem nodes the outputs")
        if readers and v.name not in self.f.outputs:
            kind = "tuple of a multi-output op" if isinstance(val, (tuple, list)) else "value"
            raise PlanError(f"fission {self.f.index}: region node {v.name!r} ({kind}) is read "
                            f"outside the region by {readers[0].name!r} but is not one of its "
                            "outputs")

    # -- new nodes ------------------------------------------------------------------------

    def _slice(self, u: fx.Node, k: int, reader: fx.Node) -> fx.Node:
        if u not in self.slices:
            self.slices[u] = []
        have = self.slices[u]
        while len(have) <= k:  # slices are made when part k first reads them
            j = len(have)
            dim = self.sliced[u]
            step = _int_size(u, dim, self.f) // self.n
            have.append(self._new(aten.slice.Tensor, (u, dim, j * step, (j + 1) * step), {},
                                  slice_name(u.name, self.f.index, j), reader))
        return have[k]

    def _remap(self, k: int, reader: fx.Node):
        def one(a: fx.Node) -> fx.Node:
            if a in self.members:
                return self.parts[a][k]
            if a in self.sliced:
                return self._slice(a, k, reader)
            return a
        return one

    def _part(self, v: fx.Node, k: int) -> fx.Node:
        args = map_arg(v.args, self._remap(k, v))
        kwargs = map_arg(v.kwargs, self._remap(k, v))
        args, kwargs = _part_sizes(v, args, kwargs, self.f.axis[v.name], self.n)
        target = v.target
        if target is aten.as_strided.default:  # linked only where it is a view (capture.dims)
            target, args, kwargs = aten.view.default, (args[0], args[1]), {}
        if self.f.outputs.get(v.name) == MEAN:
            target = _MEAN_PARTS[target]  # a mean's part is a sum over the same dims
        if target in _VIEWS and not _viewable(args[0], args[1]):
            target = aten._reshape_copy.default  # a slice no strides can view: copy it
        node = self._new(target, args, kwargs, part_name(v.name, k), v)
        node.meta[PART_META] = (self.f.index, v.name, k)  # found again by the loop form
        _check_part(self.f, v, node)
        return node

    def _running_sum(self, v: fx.Node, k: int, prev: fx.Node | None, anchor: fx.Node) -> fx.Node | None:
        """After part k: ``part0`` (k == 0), ``sum_name(v, k) = prev + part k``, or, for the
        last part, ``v`` itself made that add and moved here."""
        part = self.parts[v][k]
        if k == 0:
            return part
        mean = self.f.outputs[v.name] == MEAN
        if k < self.n - 1 or mean:
            total = self._new(aten.add.Tensor, (prev, part), {}, sum_name(v.name, k), v)
            if k == self.n - 1:  # the mean: the parts' sums over the whole count
                self._merge(v, aten.div.Scalar, (total, _mean_count(v)), anchor)
                return v
            return total
        self._merge(v, aten.add.Tensor, (prev, part), anchor)
        return v

    def _cat(self, v: fx.Node, anchor: fx.Node) -> None:
        self._merge(v, aten.cat.default, (list(self.parts[v]), self.f.outputs[v.name]), anchor)

    def _merge(self, v: fx.Node, target, args: tuple, anchor: fx.Node) -> None:
        """Turn region output ``v`` into its merge in place (name and readers kept) and move it
        right before ``anchor``."""
        old = v.meta.get("val")
        v.target, v.args, v.kwargs = target, args, {}
        val = self._fake(v, target, args, {})
        if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(old.shape) \
                or val.dtype != old.dtype:
            raise PlanError(f"fission {self.f.index}: the merge of {v.name!r} gives "
                            f"{_describe(val)}, not its value's {_describe(old)}")
        if val.stride() != old.stride():
            self.relaid.add(v)
        _set_val(v, val)
        anchor.prepend(v)

    def _new(self, target, args: tuple, kwargs: dict, name: str, like: fx.Node) -> fx.Node:
        val = self._fake(like, target, args, kwargs)
        node = self.graph.create_node("call_function", target, args, kwargs, name=name)
        if node.name != name:
            raise PlanError(f"fission {self.f.index}: cannot name a node {name!r} (fx named it "
                            f"{node.name!r}); is the fission applied twice?")
        node.meta.update({key: x for key, x in like.meta.items() if key not in _VALUE_META})
        _set_val(node, val)
        return node

    def _fake(self, like: fx.Node, target, args: tuple, kwargs: dict):
        fake_args, fake_kwargs = map_arg((args, kwargs), lambda a: a.meta["val"])
        try:
            with self.fake_mode:
                return target(*fake_args, **fake_kwargs)
        except Exception as e:  # noqa: BLE001 - any failure names the node
            raise PlanError(f"fission {self.f.index}: {_target_name(target)} for {like.name!r} "
                            f"fails on the parts' shapes: {e}") from e


# -- helpers ------------------------------------------------------------------------------

def _region_nodes(f: Fission, by_name: dict[str, fx.Node]) -> list[fx.Node]:
    """The region's nodes in graph order."""
    if not f.nodes or len(set(f.nodes)) != len(f.nodes):
        raise PlanError(f"fission {f.index}: the region {list(f.nodes)[:4]} is empty or names "
                        "a node twice")
    missing = [v for v in f.nodes if v not in by_name]
    if missing:
        raise PlanError(f"fission {f.index}: region node {missing[0]!r} is not in the graph")
    order = {node: i for i, node in enumerate(by_name.values())}
    return sorted((by_name[v] for v in f.nodes), key=order.__getitem__)


def _sliced_inputs(f: Fission, by_name: dict[str, fx.Node], members: set[fx.Node]) -> dict[fx.Node, int]:
    sliced = {}
    for u, dim in f.sliced.items():
        if u not in by_name:
            raise PlanError(f"fission {f.index}: sliced input {u!r} is not in the graph")
        if by_name[u] in members:
            raise PlanError(f"fission {f.index}: sliced input {u!r} is a region node")
        sliced[by_name[u]] = dim
    return sliced


def _check_fission(f: Fission, region: list[fx.Node]) -> None:
    if f.n < 1:
        raise PlanError(f"fission {f.index}: n = {f.n}; it must be at least 1")
    if f.length % f.n:
        raise PlanError(f"fission {f.index}: n = {f.n} does not divide the dimension's "
                        f"length {f.length} (region {region[0].name!r}, ...)")
    names = {v.name for v in region}
    for v in f.outputs:
        if v not in names:
            raise PlanError(f"fission {f.index}: output {v!r} is not a region node")
    for v in region:
        if v.name not in f.axis:
            raise PlanError(f"fission {f.index}: region node {v.name!r} has no axis")
        out = f.outputs.get(v.name)
        if out == MEAN and v.target not in _MEAN_PARTS:
            raise PlanError(f"fission {f.index}: region output {v.name!r} is merged as a mean "
                            f"but is {_target_name(v.target)}, not aten.mean")
        if out is not None and (out in MERGED) != (f.axis[v.name] < 0):
            raise PlanError(f"fission {f.index}: region output {v.name!r} has axis "
                            f"{f.axis[v.name]} but merge {out} (a reduce axis is summed, an "
                            "output dimension concatenated)")
        if out is not None and out >= 0 and out != f.axis[v.name]:
            raise PlanError(f"fission {f.index}: region output {v.name!r} is split along "
                            f"{f.axis[v.name]} but concatenated along {out}")


def _check_node(f: Fission, v: fx.Node, ot) -> None:
    """A region node the lowering can split: an op (not an input), deterministic, pure."""
    if v.op != "call_function":
        raise PlanError(f"fission {f.index}: region node {v.name!r} is a {v.op!r} node; a region "
                        "holds ops only")
    if categorize(v, ot)[0] == "random":  # the capture's test (seeded inductor_random too)
        raise PlanError(f"fission {f.index}: region node {v.name!r} is a random op "
                        f"({_target_name(v.target)}); each part would draw its own numbers. "
                        "Leave it out of the region (its output can be sliced)")
    schema = getattr(v.target, "_schema", None)
    if schema is not None and schema.is_mutable:
        raise PlanError(f"fission {f.index}: region node {v.name!r} mutates its input "
                        f"({_target_name(v.target)}); a region holds pure ops only")
    val = v.meta.get("val")
    if isinstance(val, torch.Tensor):
        axis = f.axis[v.name]
        if axis >= val.dim():
            raise PlanError(f"fission {f.index}: region node {v.name!r} has {val.dim()} "
                            f"dimensions; it cannot be split along {axis}")
        if axis >= 0:
            _int_size(v, axis, f)
    elif not isinstance(val, (tuple, list)):
        raise PlanError(f"fission {f.index}: region node {v.name!r} has no tensor value "
                        f"({type(val).__name__})")


def _int_size(node: fx.Node, dim: int, f: Fission) -> int:
    """``node``'s static size along ``dim``, divisible by n."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not 0 <= dim < val.dim():
        raise PlanError(f"fission {f.index}: {node.name!r} ({_describe(val)}) has no dimension {dim}")
    size = val.shape[dim]
    if not isinstance(size, int):
        raise PlanError(f"fission {f.index}: {node.name!r} has a symbolic size {size} along "
                        f"dimension {dim}; fission needs a static one")
    if size % f.n:
        raise PlanError(f"fission {f.index}: n = {f.n} does not divide {node.name!r}'s size "
                        f"{size} along dimension {dim}")
    return size


def _part_sizes(v: fx.Node, args: tuple, kwargs: dict, axis: int, n: int) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every size list (an ``int[]`` argument not named dim/dims)
    equal to ``v``'s full output shape replaced by the part's shape."""
    val = v.meta.get("val")
    schema = getattr(v.target, "_schema", None)
    if axis < 0 or schema is None or not isinstance(val, torch.Tensor):
        return args, kwargs
    full = tuple(val.shape)
    args, kwargs = list(args), dict(kwargs)
    for i, a in enumerate(schema.arguments):
        if not _is_size_list(a):
            continue
        if not a.kwarg_only and i < len(args):
            args[i] = _shrunk(args[i], full, axis, n)
        elif a.name in kwargs:
            kwargs[a.name] = _shrunk(kwargs[a.name], full, axis, n)
    return tuple(args), kwargs


def _is_size_list(a) -> bool:
    """A schema argument that lists sizes (``SymInt[] size``), not dimensions."""
    return str(a.type) in ("List[int]", "Optional[List[int]]") and "dim" not in a.name


def _shrunk(value: Any, full: tuple, axis: int, n: int) -> Any:
    if not isinstance(value, (list, tuple)) or len(value) != len(full):
        return value
    if not all(isinstance(x, int) and (x == f or x == -1) for x, f in zip(value, full)):
        return value
    new = list(value)
    if new[axis] != -1:
        new[axis] = full[axis] // n
    return new


def _viewable(base, size) -> bool:
    """Whether some strides express ``view(base, size)`` (none do for a slice along an inner
    dimension of a group the view flattens). Tried on a meta tensor of ``base``'s layout."""
    val = base.meta.get("val") if isinstance(base, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return True
    with unset_fake_temporarily():
        try:
            torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta").view(size)
        except (RuntimeError, ValueError):
            return False
    return True


def _check_part(f: Fission, v: fx.Node, part: fx.Node) -> None:
    val, full = part.meta["val"], v.meta.get("val")
    if not isinstance(full, torch.Tensor):
        return  # a tuple: its getitem nodes are checked
    want = list(full.shape)
    axis = f.axis[v.name]
    if axis >= 0:
        want[axis] //= f.n
    if not isinstance(val, torch.Tensor) or list(val.shape) != want or val.dtype != full.dtype:
        raise PlanError(f"fission {f.index}: part {part.name!r} of {v.name!r} gives "
                        f"{_describe(val)}, not {tuple(want)} {full.dtype} (is {v.name!r} "
                        f"splittable along {axis}?)")


def _mean_count(v: fx.Node) -> float:
    """How many elements mean ``v`` averages: its input's numel over its own."""
    x, out = v.args[0].meta["val"], v.meta["val"]
    return float(x.numel() // max(out.numel(), 1))


def _set_val(node: fx.Node, val) -> None:
    node.meta["val"] = val
    if isinstance(val, torch.Tensor):
        from torch.fx.passes.shape_prop import _extract_tensor_metadata

        node.meta["tensor_meta"] = _extract_tensor_metadata(val)
    else:
        node.meta.pop("tensor_meta", None)


def _describe(val) -> str:
    if isinstance(val, torch.Tensor):
        return f"{tuple(val.shape)} {val.dtype}"
    return type(val).__name__


def _target_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(getattr(target, "__name__", target))


def _sort_stably(graph: fx.Graph) -> None:
    """Move nodes so that each follows its inputs, keeping the present order where it already
    does: a node read before it is computed waits until its last input is placed."""
    nodes = list(graph.nodes)
    placed: set[fx.Node] = set()
    order: list[fx.Node] = []
    waiting: dict[fx.Node, list[fx.Node]] = {}
    missing: dict[fx.Node, int] = {}

    def place(node: fx.Node) -> None:
        stack = [node]
        while stack:
            m = stack.pop()
            order.append(m)
            placed.add(m)
            for w in reversed(waiting.pop(m, [])):
                missing[w] -= 1
                if not missing[w]:
                    stack.append(w)

    for node in nodes:
        need = {i for i in node.all_input_nodes if i not in placed}
        if not need:
            place(node)
            continue
        missing[node] = len(need)
        for i in need:
            waiting.setdefault(i, []).append(node)
    if len(order) != len(nodes):
        raise PlanError("fission left the graph with a cycle; is a region not convex?")
    if order == nodes:
        return
    output = [n for n in order if n.op == "output"]
    order = [n for n in order if n.op != "output"] + output
    for prev, node in zip(order, order[1:]):
        if prev.next is not node:
            prev.append(node)


def _refresh_strides(graph: fx.Graph, fake_mode, relaid: set[fx.Node]) -> None:
    """A merge is a new, contiguous tensor where its node's value may have been a view with
    other strides (a permute): compute the values of the nodes that read it again, and of
    their readers while their strides change, so that every ``meta["val"]`` is what runs."""
    dirty = set(relaid)
    for node in graph.nodes:
        if node.op != "call_function" or node in relaid or not dirty & set(node.all_input_nodes):
            continue
        old = node.meta.get("val")
        args, kwargs = map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        try:
            with fake_mode:
                val = node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure names the node
            raise PlanError(f"{node.name!r} fails on a fission's merged input: {e}") from e
        if _layout(val) != _layout(old):
            if _layout(val, strides=False) != _layout(old, strides=False):
                raise PlanError(f"{node.name!r} gives {_describe(val)} on a fission's merged "
                                f"input, not {_describe(old)}")
            dirty.add(node)
            _set_val(node, val)


def _layout(val, strides: bool = True):
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), val.dtype, tuple(val.stride()) if strides else None)
    if isinstance(val, (tuple, list)):
        return tuple(_layout(x, strides) for x in val)
    return None
