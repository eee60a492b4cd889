"""Which dimensions of an op's inputs are which of its own axes: the per-op link tables of
MAGIS's dimension graph (seeds/004 Section 4.1; shared/MAGIS.md 1.1 and Section 5 rows 1-3).

:func:`dim_links` reads one call_function node of a captured joint graph (aten ops after
AOTAutograd's decompositions, shapes from the FakeTensors in ``node.meta["val"]``) and returns
its links, which capture stores as ``Node.meta["dims"]`` and :mod:`remat.graph.dims` builds the
D-graph from. A link is ``[input_name, input_dim, axis]``:

- ``input_dim``: a dimension (0-based) of the input tensor ``input_name``;
- ``axis >= 0``: the node's own output dimension that is the same spatial axis: cutting the
  node's output into parts along ``axis`` needs the same cut of the input along ``input_dim``;
- ``axis < 0``: the node's reduce axis ``-1, -2, ...``: the input dimension is summed over, so
  the node's value is the sum of its values over parts of that dimension. Only sum-like
  reductions have one: ``sum``, the k of mm/bmm/matmul, a convolution's input channels (without
  a bias), the batch of a convolution's weight gradient and its output channels for its input
  gradient, layer norm's weight/bias gradients over the leading dims, an embedding gradient's
  index positions (a scatter-add into zeros), and ``mean`` (a fission runs its parts as sums
  and divides their total by the whole count: :data:`remat.graph.fission.MEAN`).
  Max/min/argmax, softmax's axis, variance, norms, cumsum and sort link nothing there (their
  parts do not add up).

Which links exist (and which do not, deliberately):

- pointwise ops (PyTorch's ``pointwise`` tag and a few untagged ones): identity on every output
  dim, aligned from the right; an input dim of size 1 broadcast to a larger output dim and a
  missing leading dim link nothing;
- views: permute/transpose/t, (un)squeeze, expand (only the dims that keep their size),
  slice/narrow/select (every dim but the sliced one), alias/detach;
- reshapes (view, _unsafe_view, reshape, flatten, unflatten, ...): greedy prefix-product
  alignment of the non-unit dims into groups of input and output dims with the same product.
  A group of one dim on each side links them (equal sizes). A group that merges several dims
  into one, or splits one into several, links the one dim and the **outermost** dim of the
  several: ``[B, T, C] -> [B*T, C]`` links input dim 0 (B) to output dim 0 (B*T), and C to C;
  ``[B*T, C] -> [B, T, C]`` links input dim 0 (B*T) to output dim 0 (B);
  ``[B, H, T, d] -> [B*H, T, d]`` links B to B*H; ``[B, T, C] -> [B, T, H, C/H]`` links C to
  H. These **merge links** are the only links between dims of different sizes: slicing the
  outermost dim (length L) into n contiguous parts is slicing the merged dim (a multiple of L)
  into n contiguous chunks, the same elements, exactly when n divides L. The inner dims of
  such a group (T of ``[B, T, C] -> [B*T, C]``) and groups of several dims on both sides
  (``[4, 6] -> [6, 4]``) link nothing;
- mm/bmm/matmul ``[*b, m, k] x [*b, k, n]``: batch dims, m and n, k -> reduce axis -1 from both
  inputs. addmm/baddbmm/linear with a bias: no k (a sum of parts would add the bias n times);
  the bias links by broadcasting;
- convolution: input N -> 0, weight C_out -> 1, bias -> 1, input and weight C_in -> -1 (no bias
  only); H and W never link; grouped convolutions link N only;
- reductions: the kept dims (``keepdim`` respected); the reduced dims of a ``sum`` only ->
  -1, -2, ... in ascending order;
- softmax/log-softmax and their backwards, cumsum, sort, flip, roll, cat, gather, scatter, pad:
  every dim but the op's ``dim`` (the padded/concatenated one);
- layer norm: the leading (non-normalised) dims only; batch norm: the channel dim only, never
  the batch (its statistics change per part). Decomposed norms (``var_mean`` + pointwise ops)
  follow from the rules above: ``var_mean`` links the kept dims only;
- embedding: indices dims -> leading output dims, the table's embedding dim -> the last;
  its backward (``embedding_dense_backward`` or an accumulating index_put into zeros): index
  positions -> reduce axes, embedding dim -> output dim 1;
- pooling/upsampling and their backwards: N and C only;
- fused attention (``_scaled_dot_product_*``, dropout 0): batch and heads of every 3-D and 4-D
  input; never sequence or head_dim. With dropout it is a random op;
- random ops, in-place ops and every op not listed: nothing (None), so fission never crosses
  them.

Every link is checked against the shapes: an input dim of size 1 (broadcast) does not link; an
input dim whose size is neither 1 nor the axis's length drops the axis altogether (the op reads
that input positionally, e.g. a gather from a larger table); all inputs linked to one reduce
axis must agree on its length; axes of length 1 are never linked (they cannot be split). A
reshape's merge link (the only exception) links sizes of which the larger (the merged dim) is
a multiple of the smaller, the outermost dim of its group (:func:`remat.graph.dims.is_merge_link`).

Containers (ops with several outputs: ``var_mean``, ``native_layer_norm``, ``split``,
``convolution_backward``, attention, ...): the tuple node's axes are the op's **loop axes**:
``a >= 0`` is dimension ``a`` of the op's loop shape, which is the shape of its first output
(``convolution_backward``: its input's, the first output's shape even when that output is not
computed), and ``a < 0`` the op's reduce axes. The tuple node's links map inputs to loop axes.
Each ``getitem`` links ``[tuple_name, loop_axis, own_axis]``: ``own_axis`` is the item's
output dim (``>= 0``) or its own reduce axis (``< 0``, the item is the sum over parts of that
loop axis: the weight gradient of a convolution over N: ``[conv_bwd, 0, -1]``), and a negative
loop axis may be a spatial axis of an item (the weight gradient's C_out, the input gradient's
reduce axis: ``[conv_bwd, -1, 0]``). A loop axis is linked only if every item the op computes
can follow it (a convolution backward that computes a bias gradient does not split C_in).

Example: ``mm = aten.mm(a[12, 16], b[16, 32])`` gives
``[["a", 0, 0], ["a", 1, -1], ["b", 0, -1], ["b", 1, 1]]``.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
import torch.fx as fx

from ..graph.dims import is_merge_link

aten = torch.ops.aten
prims = torch.ops.prims


@dataclass
class _Table:
    """An op's links before checking: ``links`` as (input node, input dim, axis); ``shape``:
    the op's loop shape; for a container, ``items`` gives each output's (loop axis, own axis)
    pairs (None: an output not split with the op, such as a random seed) and ``vals`` the
    outputs' values."""

    links: list[tuple[fx.Node, int, int]]
    shape: tuple
    items: list[list[tuple[int, int]] | None] | None = None
    vals: tuple = ()
    merged: frozenset = frozenset()  # a reshape's merge links, sizes a multiple (not equal)


def dim_links(node: fx.Node) -> list[list] | None:
    """The links ``[input_name, input_dim, axis]`` of ``node`` (see the module docstring), or
    None where it links nothing: an op without a table, a random or in-place op, symbolic
    sizes."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return _item_links(node) or None
    table = _table(node)
    return (_checked(table)[0] or None) if table is not None else None


def _table(node: fx.Node) -> _Table | None:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    if packet is None or target._schema.is_mutable:
        return None
    name = packet.__name__
    if name.startswith("_scaled_dot_product_"):
        return _attention(node)
    if torch.Tag.nondeterministic_seeded in target.tags:
        return None
    rule = _TABLES.get(packet)
    if rule is None and _POOLING.match(name):
        rule = _pooling
    if rule is not None:
        return rule(node)
    rule = _RULES.get(packet) or (_pointwise if torch.Tag.pointwise in target.tags else None)
    shape = _out_shape(node)
    if rule is None or shape is None:
        return None
    val = _val(node)
    if isinstance(val, (tuple, list)):  # a reduction's values and indices, sort, var_mean
        return _Table(rule(node, shape), shape, [[(a, a) for a in range(len(shape))]] * len(val), tuple(val))
    return _Table(rule(node, shape), shape)


# -- checking -------------------------------------------------------------------------------


def _checked(table: _Table) -> tuple[list[list], dict[int, int]]:
    """The links that pass the size checks (module docstring) and each linked axis's length."""
    shape = table.shape
    shapes: dict[fx.Node, tuple] = {}
    sized = []
    for inp, d, a in table.links:
        if inp not in shapes:
            val = _val(inp)
            shapes[inp] = tuple(val.shape) if isinstance(val, torch.Tensor) else ()
        xs = shapes[inp]
        if 0 <= d < len(xs) and type(xs[d]) is int and xs[d] > 1:
            sized.append((inp, d, a, xs[d], (inp, d, a) in table.merged))
    lengths: dict[int, int] = {}
    dropped: set[int] = set()
    merges = []  # the merge links that pass (a reshape's, module docstring)
    for inp, d, a, size, merge in sized:
        length = (shape[a] if a < len(shape) else None) if a >= 0 else lengths.get(a, size)
        if merge:
            if type(length) is int and is_merge_link(shapes[inp], d, shape, a):
                merges.append((inp.name, d, a))
        elif length != size:
            dropped.add(a)  # read positionally at another length (a size-1 dim broadcasts)
        else:
            lengths[a] = size
    for a in dropped:
        lengths.pop(a, None)
    if table.items is not None:
        for item, val in zip(table.items, table.vals):
            if item is None or not isinstance(val, torch.Tensor):
                continue
            own = dict(item)
            for a in list(lengths):  # an axis some computed output cannot follow
                b = own.get(a)
                if b is None or (b >= 0 and (b >= val.dim() or type(val.shape[b]) is not int
                                             or val.shape[b] != lengths[a])):
                    del lengths[a]
    links = dict.fromkeys((inp.name, d, a) for inp, d, a, size, merge in sized
                          if not merge and lengths.get(a) == size)
    links.update(dict.fromkeys(link for link in merges if link[2] not in dropped))
    return [list(link) for link in links], lengths


def _item_links(node: fx.Node) -> list[list]:
    """A getitem of a container: the container's loop axes its item follows."""
    src, index = node.args[0], node.args[1]
    shape = _shape(node)
    if not isinstance(src, fx.Node) or src.op != "call_function" or shape is None or not isinstance(index, int):
        return []
    table = _table(src)
    if table is None or table.items is None or index >= len(table.items) or table.items[index] is None:
        return []
    lengths = _checked(table)[1]
    return [[src.name, a, b] for a, b in table.items[index]
            if a in lengths and (b < 0 or (b < len(shape) and shape[b] == lengths[a]))]


# -- shapes and arguments ---------------------------------------------------------------------


def _val(n) -> object:
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _shape(n) -> tuple | None:
    """The shape of a tensor-valued node with static sizes, else None."""
    val = _val(n)
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(val.shape)
    return shape if all(type(s) is int for s in shape) else None


def _out_shape(node: fx.Node) -> tuple | None:
    """The loop shape: the output's shape, or a container's first tensor output's."""
    val = _val(node)
    if isinstance(val, (tuple, list)):
        val = next((v for v in val if isinstance(v, torch.Tensor)), None)
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(val.shape)
    return shape if all(type(s) is int for s in shape) else None


def _size(n: fx.Node, d: int) -> int | None:
    val = _val(n)
    if not isinstance(val, torch.Tensor) or not 0 <= d < val.dim():
        return None
    s = val.shape[d]
    return s if type(s) is int else None


def _ndim(n) -> int:
    val = _val(n)
    return val.dim() if isinstance(val, torch.Tensor) else -1


def _tensors(node: fx.Node) -> list[fx.Node]:
    """The node's tensor inputs, in argument order (lists flattened)."""
    out = []
    for a in (*node.args, *node.kwargs.values()):
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, fx.Node) and isinstance(_val(x), torch.Tensor):
                out.append(x)
    return out


@lru_cache(maxsize=None)
def _positions(target) -> dict[str, tuple[int | None, object]]:
    """Argument name -> (position, None if keyword-only; default) from an op's schema."""
    return {a.name: (None if a.kwarg_only else i, a.default_value if a.has_default_value() else None)
            for i, a in enumerate(target._schema.arguments)}


def _arg(node: fx.Node, name: str, default=None):
    """The value of ``node``'s argument ``name`` (positional, keyword or the schema's default)."""
    pos = _positions(node.target).get(name)
    if pos is None:
        return default
    i, schema_default = pos
    if i is not None and i < len(node.args):
        return node.args[i]
    if name in node.kwargs:
        return node.kwargs[name]
    return default if schema_default is None else schema_default


def _dims(value, ndim: int) -> list[int]:
    """A ``dim`` argument as sorted non-negative dims; None or [] means every dim."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return list(range(ndim))
    dims = value if isinstance(value, (list, tuple)) else [value]
    return sorted({d % ndim for d in dims}) if ndim else []


def _is_zeros(n) -> bool:
    """A tensor the op makes full of zeros (an accumulating scatter's destination)."""
    if not isinstance(n, fx.Node) or n.op != "call_function":
        return False
    packet = getattr(n.target, "overloadpacket", None)
    if packet in (aten.zeros, aten.new_zeros, aten.zeros_like):
        return True
    return packet in (aten.full, aten.new_full, aten.full_like) and len(n.args) > 1 and n.args[1] == 0


# -- one-output ops: rule(node, shape) -> links -------------------------------------------------


def _aligned(x: fx.Node, out_ndim: int, skip=frozenset()) -> list:
    """Identity aligned from the right (broadcasting), except ``x``'s dims in ``skip``."""
    off = out_ndim - _ndim(x)
    return [(x, i, i + off) for i in range(_ndim(x)) if i + off >= 0 and i not in skip]


def _pointwise(node, shape):
    return [link for x in _tensors(node) for link in _aligned(x, len(shape))]


def _except_dim(node, shape, name="dim"):
    """Same-rank inputs, identity except the op's ``dim`` (softmax, cat, gather, cumsum...)."""
    skip = set(_dims(_arg(node, name), len(shape)))
    return [link for x in _tensors(node) if _ndim(x) == len(shape) for link in _aligned(x, len(shape), skip)]


def _permute(node, shape):
    x, r = node.args[0], _ndim(node.args[0])
    if r < 1:
        return []
    perm = list(range(r))
    if node.target.overloadpacket is aten.permute:
        perm = [d % r for d in node.args[1]]
    elif node.target.overloadpacket is aten.transpose:
        d0, d1 = node.args[1] % r, node.args[2] % r
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:  # t
        perm.reverse()
    return [(x, d, j) for j, d in enumerate(perm)]


def _unsqueeze(node, shape):
    x, d = node.args[0], node.args[1] % len(shape)
    return [(x, i, i if i < d else i + 1) for i in range(_ndim(x))]


def _squeeze(node, shape):
    x = node.args[0]
    xs = _shape(x) or ()
    gone = {d for d in _dims(node.args[1] if len(node.args) > 1 else None, len(xs)) if xs[d] == 1}
    return [(x, i, j) for j, i in enumerate(i for i in range(len(xs)) if i not in gone)]


def _select(node, shape):
    x = node.args[0]
    d = node.args[1] % _ndim(x)
    return [(x, i, i if i < d else i - 1) for i in range(_ndim(x)) if i != d]


def _reshape(node) -> _Table | None:
    """Greedy prefix-product alignment of the non-unit dims into groups (input dims, output
    dims) of one product: a group of one dim on each side links them; a group of one dim on
    one side and several on the other links the one and the outermost of the several (a merge
    link, sizes a multiple); other groups link nothing (module docstring)."""
    x = node.args[0] if node.args else None
    xs, shape = _shape(x), _shape(node)
    if xs is None or shape is None or node.target._overloadname == "dtype" or 0 in xs or 0 in shape:
        return None  # view(dtype), symbolic sizes, empty tensors
    a = [(i, s) for i, s in enumerate(xs) if s != 1]
    b = [(j, s) for j, s in enumerate(shape) if s != 1]
    links, merged, i, j = [], set(), 0, 0
    while i < len(a) and j < len(b):
        i0, j0 = i, j
        pa, pb = a[i][1], b[j][1]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa, i = pa * a[i][1], i + 1
            elif pb < pa and j < len(b):
                pb, j = pb * b[j][1], j + 1
            else:
                i = j = len(a) + len(b)  # no common boundary left (not a reshape)
                break
        else:
            if i - i0 == 1 or j - j0 == 1:
                link = (x, a[i0][0], b[j0][0])
                links.append(link)
                if i - i0 != j - j0:
                    merged.add(link)
    return _Table(links, shape, merged=frozenset(merged))


def _as_strided(node) -> _Table | None:
    """An ``as_strided`` that is a view (a contiguous input, contiguous strides of its size,
    no offset: how group norm's decomposition reshapes its statistics) links as a reshape; any
    other links nothing. A fission runs its parts as ``view`` (:mod:`remat.lower.fission`)."""
    x = node.args[0] if node.args else None
    val, out = _val(x), _val(node)
    if not isinstance(val, torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
    if not val.is_contiguous() or not out.is_contiguous() or offset not in (None, 0) \
            or val.storage_offset() != 0 or val.numel() != out.numel():
        return None
    return _reshape(node)


def _matmul(a, b, out_ndim, k=True):
    """``a @ b`` with numpy's rules (1-D operands, broadcast batch dims); k -> -1."""
    ra, rb = _ndim(a), _ndim(b)
    links = []
    if ra >= 2:
        links += [(a, i, i + out_ndim - ra) for i in range(ra - 2)]  # batch, right-aligned
        links.append((a, ra - 2, out_ndim - 1 - (rb >= 2)))  # m
    if rb >= 2:
        links += [(b, i, i + out_ndim - rb) for i in range(rb - 2)]
        links.append((b, rb - 1, out_ndim - 1))  # n
    if k:
        links += [(a, ra - 1, -1), (b, max(rb - 2, 0), -1)]
    return links


def _mm(node, shape):
    return _matmul(node.args[0], node.args[1], len(shape))


def _addmm(node, shape):
    """addmm/baddbmm: the bias broadcasts; no k (summing parts would add the bias n times)."""
    bias, a, b = node.args[:3]
    return _aligned(bias, len(shape)) + _matmul(a, b, len(shape), k=False)


def _linear(node, shape):
    x, w = node.args[:2]
    bias = _arg(node, "bias")
    if _ndim(w) != 2:
        return []
    links = [(t, 1 - d if t is w else d, a) for t, d, a in _matmul(x, w, len(shape), k=bias is None)]
    return links + (_aligned(bias, len(shape)) if isinstance(bias, fx.Node) else [])


def _convolution(node, shape):
    x, w, bias = node.args[:3]
    if _ndim(x) != _ndim(w):
        return []  # unbatched
    links = [(x, 0, 0)]
    if _arg(node, "groups") == 1:
        c_out, c_in = (1, 0) if _arg(node, "transposed") else (0, 1)
        links.append((w, c_out, 1))
        if bias is None:
            links += [(x, 1, -1), (w, c_in, -1)]
    if isinstance(bias, fx.Node):
        links.append((bias, 0, 1))
    return links


_MEANS = (aten.mean.dim, aten.mean.default)
"""Means a fission can merge (their parts run as sums over the same dims)."""


def _reduction(node, shape):
    """Kept dims; a sum's reduced dims -> -1, -2, ... (max.other/min.other are pointwise)."""
    if node.target._overloadname == "other":
        return _pointwise(node, shape)
    x = node.args[0]
    r = _ndim(x)
    reduced = _dims(_arg(node, "dim", _arg(node, "dims")), r)
    keep = _arg(node, "keepdim", False)
    links = [(x, i, i if keep else j) for j, i in enumerate(i for i in range(r) if i not in reduced)]
    if node.target.overloadpacket in (aten.sum, prims.sum) or node.target in _MEANS:
        links += [(x, i, -(k + 1)) for k, i in enumerate(reduced)]
    return links


def _embedding(node, shape):
    w, idx = node.args[:2]
    return [(idx, i, i) for i in range(_ndim(idx))] + [(w, 1, len(shape) - 1)]


def _embedding_backward(node, shape):
    grad, idx = node.args[:2]
    k = _ndim(idx)
    links = [(grad, k, 1)]
    if not _arg(node, "scale_grad_by_freq"):
        links += [(t, i, -(i + 1)) for t in (grad, idx) for i in range(k)]
    return links


def _index_put(node, shape):
    """An index_put on dim 0 with one index tensor (an embedding's backward): the trailing dims;
    the index positions are reduce axes when it accumulates into zeros."""
    self, indices, values = _arg(node, "self"), _arg(node, "indices"), _arg(node, "values")
    if len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return []
    idx = indices[0]
    k, rv = _ndim(idx), _ndim(values)
    if rv != k + len(shape) - 1:
        return []
    links = [(t, j + (k - 1 if t is values else 0), j) for t in (self, values) for j in range(1, len(shape))]
    accumulate = node.target is aten._unsafe_masked_index_put_accumulate.default or _arg(node, "accumulate")
    if accumulate and _is_zeros(self):
        links += [(t, i, -(i + 1)) for t in (values, idx) for i in range(k)]
        mask = _arg(node, "mask")
        if isinstance(mask, fx.Node):  # broadcast against values
            off = rv - _ndim(mask)
            links += [(mask, i - off, -(i + 1)) for i in range(max(off, 0), k)]
    return links


def _index(node, shape):
    """``self[idx]`` with one index tensor on dim 0: like an embedding."""
    self, indices = node.args[:2]
    if len(indices) != 1 or not isinstance(indices[0], fx.Node):
        return []
    k = _ndim(indices[0])
    return [(indices[0], i, i) for i in range(k)] + [(self, j, k + j - 1) for j in range(1, _ndim(self))]


def _scatter(node, shape):
    """Every dim but ``dim``; ``scatter_add`` into zeros sums over ``dim`` of index and src."""
    links = _except_dim(node, shape)
    if node.target.overloadpacket is aten.scatter_add and shape and _is_zeros(node.args[0]):
        d = node.args[1] % len(shape)
        links += [(t, d, -1) for t in node.args[2:4]]
    return links


def _stack(node, shape):
    d = _arg(node, "dim") % len(shape)
    return [(t, i, i if i < d else i + 1) for t in node.args[0] for i in range(_ndim(t))]


def _pad(node, shape):
    x, pad = node.args[:2]
    r = _ndim(x)
    padded = {r - 1 - k for k in range(len(pad) // 2) if pad[2 * k] or pad[2 * k + 1]}
    return _aligned(x, len(shape), padded)


def _select_scatter(node, shape):
    x, src, d = node.args[0], node.args[1], node.args[2] % len(shape)
    return _aligned(x, len(shape), {d}) + [(src, i, i if i < d else i + 1) for i in range(_ndim(src))]


# -- containers: rule(node) -> _Table -----------------------------------------------------------


def _convolution_backward(node):
    """Loop axes: the input gradient's [N, C_in, ...]; reduce axis -1: C_out."""
    grad_out, x, w = node.args[:3]
    shape = _shape(x)
    if shape is None or _ndim(w) != len(shape):
        return None
    c_out, c_in = (1, 0) if _arg(node, "transposed") else (0, 1)
    links = [(grad_out, 0, 0), (x, 0, 0)]
    if _arg(node, "groups") == 1:
        links += [(grad_out, 1, -1), (w, c_out, -1), (x, 1, 1), (w, c_in, 1)]
    items = [[(0, 0), (1, 1), (-1, -1)], [(0, -1), (-1, c_out), (1, c_in)], [(0, -1), (-1, 0)]]
    return _Table(links, shape, items, tuple(_val(node)))


def _layer_norm(node):
    """The leading dims; the backward's weight and bias gradients sum over them."""
    backward = node.target.overloadpacket is aten.native_layer_norm_backward
    shape = _shape(_arg(node, "input"))
    if shape is None:
        return None
    lead = len(shape) - len(_arg(node, "normalized_shape"))
    names = ("grad_out", "input", "mean", "rstd") if backward else ("input",)
    links = [(t, i, i) for t in map(partial(_arg, node), names) if isinstance(t, fx.Node)
             for i in range(min(lead, _ndim(t)))]
    spatial = [(i, i) for i in range(lead)]
    summed = [(i, -(i + 1)) for i in range(lead)] if backward else spatial
    return _Table(links, shape, [spatial, summed, summed], tuple(_val(node)))


def _batch_norm(node):
    """The channel dim (1) of every input, dim 0 of the per-channel vectors; never the batch."""
    inputs = _tensors(node)
    shape = _shape(inputs[0]) if inputs else None
    if shape is None or len(shape) < 2:
        return None
    links = [(t, 1 if _ndim(t) >= 2 else 0, 1) for t in inputs if _ndim(t) >= 1]
    vals = tuple(_val(node))
    items = [None if not isinstance(v, torch.Tensor) or v.numel() == 0 else [(1, 1)] if v.dim() >= 2
             else [(1, 0)] for v in vals]
    return _Table(links, shape, items, vals)


def _pooling(node):
    """N and C (every dim before the pooled ones) of every input and output."""
    name = node.target.overloadpacket.__name__
    m = re.search(r"(\d)d", name)
    k = len(node.args[1]) if name.startswith("_low_memory_max_pool") else int(m.group(1)) if m else None
    shape = _out_shape(node)
    if k is None or shape is None:
        return None
    lead = list(range(len(shape) - k))
    links = [(t, i, i) for t in _tensors(node) if _ndim(t) == len(shape) for i in lead]
    val = _val(node)
    if isinstance(val, (tuple, list)):  # max pool's values and indices (or offsets)
        return _Table(links, shape, [[(i, i) for i in lead]] * len(val), tuple(val))
    return _Table(links, shape)


def _attention(node):
    """Batch and heads (dims 0, 1) of every 3-D and 4-D input and output; dropout 0 only."""
    if _arg(node, "dropout_p", 0.0) != 0:
        return None  # random
    shape = _out_shape(node)
    val = _val(node)
    if shape is None or len(shape) < 3 or not isinstance(val, (tuple, list)):
        return None
    links = [(t, i, i) for t in _tensors(node) if _ndim(t) >= 3 for i in (0, 1)]
    items = [[(0, 0), (1, 1)] if isinstance(v, torch.Tensor) and v.dim() >= 3 else None for v in val]
    return _Table(links, shape, items, tuple(val))


def _split(node):
    """split/unbind/chunk: the input's dims but the split one (unbind removes it)."""
    x = node.args[0]
    shape = _shape(x)
    if shape is None or not shape:
        return None
    d = _arg(node, "dim", 0) % len(shape)
    removes = node.target.overloadpacket is aten.unbind
    item = [(i, i - (removes and i > d)) for i in range(len(shape)) if i != d]
    return _Table([(x, i, i) for i, _ in item], shape, [item] * len(_val(node)), tuple(_val(node)))


_POOLING = re.compile(r"_?(adaptive_)?(max|avg)_pool|_low_memory_max_pool|_?upsample_|reflection_pad|replication_pad")

_TABLES = {
    aten.convolution_backward: _convolution_backward,
    aten.native_layer_norm: _layer_norm, aten.native_layer_norm_backward: _layer_norm,
    aten.native_batch_norm: _batch_norm, aten._native_batch_norm_legit: _batch_norm,
    aten._native_batch_norm_legit_functional: _batch_norm,
    aten._native_batch_norm_legit_no_training: _batch_norm, aten.native_batch_norm_backward: _batch_norm,
    aten.split: _split, aten.split_with_sizes: _split, aten.unbind: _split, aten.chunk: _split,
    **dict.fromkeys((aten.view, aten._unsafe_view, aten.reshape, aten.view_copy, aten._reshape_alias,
                     aten._reshape_copy, aten.flatten, aten.unflatten, prims.reshape, prims.collapse_view,
                     prims.collapse, prims.split_dim), _reshape),
    aten.as_strided: _as_strided,
}

_RULES = {
    # not tagged pointwise, but elementwise
    **dict.fromkeys((aten._to_copy, aten.copy, aten.alias, aten.detach, aten.lift_fresh_copy, aten.expand,
                     aten.where, aten.masked_fill, aten.rsub, aten.fill, aten.zeros_like, aten.ones_like,
                     aten.full_like, aten.empty_like, aten.hardtanh_backward, aten.leaky_relu_backward,
                     aten.elu_backward, aten.hardswish), _pointwise),
    aten.permute: _permute, aten.transpose: _permute, aten.t: _permute,
    aten.unsqueeze: _unsqueeze, aten.squeeze: _squeeze, aten.select: _select,
    **dict.fromkeys((aten.slice, aten.narrow, aten.cat, aten.gather, aten.slice_scatter, aten._softmax,
                     aten._log_softmax, aten.softmax, aten.log_softmax, aten._softmax_backward_data,
                     aten._log_softmax_backward_data, aten.cumsum, aten.cumprod, aten.logcumsumexp,
                     aten.sort, aten.topk), _except_dim),
    aten.flip: partial(_except_dim, name="dims"), aten.roll: partial(_except_dim, name="dims"),
    aten.constant_pad_nd: _pad, aten.stack: _stack, aten.select_scatter: _select_scatter,
    aten.scatter: _scatter, aten.scatter_add: _scatter,
    aten.mm: _mm, aten.bmm: _mm, aten.matmul: _mm, aten.addmm: _addmm, aten.baddbmm: _addmm,
    aten.linear: _linear, aten.convolution: _convolution,
    **dict.fromkeys((aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.var, aten.var_mean,
                     aten.std, aten.std_mean, aten.prod, aten.any, aten.all, aten.argmax, aten.argmin,
                     aten.logsumexp, aten.norm, aten.linalg_vector_norm, aten.aminmax,
                     prims.sum, prims.var, prims.amax, prims.amin, prims.prod), _reduction),
    aten.embedding: _embedding, aten.embedding_dense_backward: _embedding_backward,
    aten.index_put: _index_put, aten._unsafe_index_put: _index_put,
    aten._unsafe_masked_index_put_accumulate: _index_put, aten.index: _index,
}
