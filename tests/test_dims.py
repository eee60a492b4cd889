"""The dimension graph (seeds/004 Section 4.1, shared/MAGIS.md 1.1 and 5): capture's per-op link
tables (remat.capture.dims) and the D-graph's components (remat.graph.dims).

A link ``[u, i, a]`` of node v says that dimension i of input u is v's axis a (a < 0: a
reduce axis, summed over). The tables are checked op by op on small aten graphs, then the
components on captured joint graphs: an MLP, a hand-written attention block, GPT-2 tiny and a
CNN with batch norm. A reshape that merges dims (``[B, T, C] -> [B*T, C]``) or splits one links
the outermost of the merged dims to the merged one (a merge link, B to B*T): a component's
axes are then multiples of its ``length``, the smallest.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import remat
from remat.capture.dims import dim_links
from remat.errors import GraphError
from remat.graph.dims import axis_length, dim_graph, is_merge_link, links
from remat.graph.graph import Graph, Node
from remat.graph.io import graph_from_dict, graph_to_dict

aten = torch.ops.aten


def traced(fn, *args, mode="fake"):
    """{node name: dim_links} of the call_function nodes of ``fn``'s aten graph, its inputs
    named a, b, c, ... in order."""
    gm = make_fx(fn, tracing_mode=mode)(*args)
    rename = {n.name: "abcdefgh"[k] for k, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            found = dim_links(n)
            out[n.name] = None if found is None else {(rename.get(u, u), i, a) for u, i, a in found}
    return out


def only(fn, *args):
    """The links of the single op ``fn`` runs."""
    (found,) = traced(fn, *args).values()
    return found


def captured(step, *inputs) -> Graph:
    (plan,) = remat.plan_all(step, *inputs, solver="auto", cache=False, for_compiler="eager")
    return plan.graph


def ops(g: Graph, op: str, shape=None) -> list[Node]:
    return [n for n in g if n.op == op and (shape is None or n.shape == tuple(shape))]


def members(c, nodes) -> dict[str, int]:
    """The axes of ``nodes`` in component ``c`` (those that are in it)."""
    return {n.name: c.axis[n.name] for n in nodes if n.name in c.axis}


r = torch.randn


# -- link tables, op by op ----------------------------------------------------------------------


def test_matmul_links_m_and_n_and_sums_over_k():
    """The paper's example: c[m,n] = sum_k a[m,k] b[k,n] gives (a1,c1), (a2,c-1), (b1,c-1), (b2,c2)."""
    assert only(torch.mm, r(12, 16), r(16, 32)) == {("a", 0, 0), ("a", 1, -1), ("b", 0, -1), ("b", 1, 1)}
    assert only(torch.bmm, r(3, 4, 5), r(3, 5, 6)) == {
        ("a", 0, 0), ("b", 0, 0), ("a", 1, 1), ("b", 2, 2), ("a", 2, -1), ("b", 1, -1)}
    # addmm's bias broadcasts; no k: summing parts over k would add the bias n times
    assert only(torch.addmm, r(32), r(12, 16), r(16, 32)) == {("a", 0, 1), ("b", 0, 0), ("c", 1, 1)}


def test_pointwise_broadcasting_links_only_equal_sizes():
    """Aligned from the right; a size-1 dim broadcast to a larger one and a missing leading dim
    link nothing; scalars link nothing."""
    assert only(torch.add, r(4, 1, 8), r(3, 8)) == {("a", 0, 0), ("a", 2, 2), ("b", 0, 1), ("b", 1, 2)}
    assert only(lambda a: a * 2.0, r(4, 8)) == {("a", 0, 0), ("a", 1, 1)}
    found = traced(lambda a, b: torch.where(a > 0, b, 0.0), r(5, 1), r(3, 5, 4))
    assert found["gt"] == {("a", 0, 0)} and found["where"] == {("gt", 0, 1), ("b", 0, 0), ("b", 1, 1), ("b", 2, 2)}
    assert only(lambda a, b: torch.ops.aten.threshold_backward(a, b, 0.0), r(2, 3), r(2, 3)) == {
        ("a", 0, 0), ("a", 1, 1), ("b", 0, 0), ("b", 1, 1)}


def test_views_link_the_dims_they_keep():
    assert only(lambda a: a.permute(2, 0, 1), r(2, 3, 4)) == {("a", 2, 0), ("a", 0, 1), ("a", 1, 2)}
    assert only(lambda a: a.expand(4, 8), r(1, 8)) == {("a", 1, 1)}  # the expanded dim: no
    assert only(lambda a: a.unsqueeze(1), r(2, 3)) == {("a", 0, 0), ("a", 1, 2)}
    assert only(lambda a: aten.select(a, 1, 0), r(2, 3, 4)) == {("a", 0, 0), ("a", 2, 1)}
    assert only(lambda a: aten.slice(a, 1, 0, 2), r(2, 3, 4)) == {("a", 0, 0), ("a", 2, 2)}
    # reshape: dims whose boundaries align; a merged group links its outermost dim (below)
    assert only(lambda a: a.view(2, 16, 4, 16), r(2, 16, 64)) == {("a", 0, 0), ("a", 1, 1), ("a", 2, 2)}
    assert only(lambda a: a.view(6, 4), r(2, 3, 4)) == {("a", 0, 0), ("a", 2, 1)}
    assert only(lambda a: a.view(4, 6), r(2, 3, 4)) is None  # [2, 3, 4] -> [4, 6]: no single dim


def test_reshapes_link_the_outermost_dim_of_a_merged_group():
    """Flattening [B, T, C] -> [B*T, C] links B to B*T (its first B/n rows are the first B*T/n
    rows), unflattening [B*T, C] -> [B, T, C] links B*T to B; never T to B*T; unit dims are
    skipped; the heads split of C links C to the heads (the outermost of H x d)."""
    flat = only(lambda a: a.view(32, 64), r(2, 16, 64))
    assert flat == {("a", 0, 0), ("a", 2, 1)} and ("a", 1, 0) not in flat
    assert only(lambda a: a.view(2, 16, 64), r(32, 64)) == {("a", 0, 0), ("a", 1, 2)}
    assert only(lambda a: aten._unsafe_view(a, [32, 64]), r(2, 16, 64)) == {("a", 0, 0), ("a", 2, 1)}
    assert only(lambda a: a.flatten(0, 1), r(2, 16, 64)) == {("a", 0, 0), ("a", 2, 1)}
    assert only(lambda a: a.reshape(-1), r(2, 16, 64)) == {("a", 0, 0)}
    # bmm's [B, H, T, d] -> [B*H, T, d]: B links to dim 0, H nowhere
    assert only(lambda a: a.reshape(8, 16, 16), r(2, 4, 16, 16)) == {("a", 0, 0), ("a", 2, 1), ("a", 3, 2)}
    assert only(lambda a: a.view(1, 32, 1, 64), r(2, 16, 64)) == {("a", 0, 1), ("a", 2, 3)}
    # [2, 3] -> [6] merges; [4, 6] -> [6, 4] has several dims on both sides: nothing
    assert only(lambda a: a.view(6, 4), r(2, 3, 4)) == {("a", 0, 0), ("a", 2, 1)}
    assert only(lambda a: a.view(6, 4), r(4, 6)) is None
    found = traced(lambda a: a.view(torch.float16), r(2, 16))
    assert found["view"] is None  # view(dtype)
    # the rule the tables and the D-graph check: the smaller dim is the outermost of a run of
    # dims whose product is the larger, starting at the same offset
    assert is_merge_link((2, 16, 64), 0, (32, 64), 0) and is_merge_link((32, 64), 0, (2, 16, 64), 0)
    assert not is_merge_link((2, 16, 64), 1, (32, 64), 0)  # T is not the outermost of B x T
    assert not is_merge_link((32, 64), 0, (2, 16, 64), 1)
    assert is_merge_link((2, 16, 64), 2, (2, 16, 4, 16), 2) and not is_merge_link((2, 16, 64), 2, (2, 16, 4, 16), 3)
    assert not is_merge_link((4, 6), 0, (6, 4), 0)


def test_reductions_sum_over_reduce_axes_only_for_sum():
    """sum's and mean's reduced dims become reduce axes -1, -2, ... in order (a mean's parts
    run as sums, divided by the whole count at the merge); max, var and softmax's axis link
    nothing; the kept dims link (keepdim respected)."""
    assert only(lambda a: a.sum([0, 2]), r(4, 5, 6)) == {("a", 1, 0), ("a", 0, -1), ("a", 2, -2)}
    assert only(lambda a: a.sum([1], keepdim=True), r(4, 5, 6)) == {("a", 0, 0), ("a", 2, 2), ("a", 1, -1)}
    assert only(lambda a: a.mean(1), r(4, 5, 6)) == {("a", 0, 0), ("a", 2, 1), ("a", 1, -1)}
    assert only(lambda a: aten.amax(a, [2], True), r(4, 5, 6)) == {("a", 0, 0), ("a", 1, 1)}
    assert only(lambda a: aten._softmax(a, 1, False), r(4, 5, 6)) == {("a", 0, 0), ("a", 2, 2)}
    found = traced(lambda a: torch.var_mean(a, 1, keepdim=True), r(4, 5, 6))
    assert found["var_mean"] == {("a", 0, 0), ("a", 2, 2)}  # a container's loop axes
    assert found["getitem"] == found["getitem_1"] == {("var_mean", 0, 0), ("var_mean", 2, 2)}


def test_convolution_links_batch_and_channels_never_height_or_width():
    no_bias = only(lambda a, b: aten.convolution(a, b, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                   r(2, 3, 8, 8), r(5, 3, 3, 3))
    assert no_bias == {("a", 0, 0), ("b", 0, 1), ("a", 1, -1), ("b", 1, -1)}
    with_bias = only(lambda a, b, c: aten.convolution(a, b, c, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                     r(2, 3, 8, 8), r(5, 3, 3, 3), r(5))
    assert with_bias == {("a", 0, 0), ("b", 0, 1), ("c", 0, 1)}  # no C_in: the bias would add up
    grouped = only(lambda a, b: aten.convolution(a, b, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2),
                   r(2, 4, 8, 8), r(6, 2, 3, 3))
    assert grouped == {("a", 0, 0)}


def test_convolution_backward_items_follow_its_loop_axes():
    """Loop axes: the input gradient's N (0) and C_in (1), reduce axis -1 = C_out. The weight
    gradient sums over N and has C_out as its dim 0; a computed bias gradient cannot split C_in."""
    def bwd(mask):
        return lambda a, b, c: aten.convolution_backward(a, b, c, [5], [1, 1], [1, 1], [1, 1], False,
                                                          [0, 0], 1, mask)
    args = r(2, 5, 8, 8), r(2, 3, 8, 8), r(5, 3, 3, 3)
    found = traced(bwd([True, True, False]), *args)
    t = "convolution_backward"
    assert found[t] == {("a", 0, 0), ("b", 0, 0), ("a", 1, -1), ("c", 0, -1), ("b", 1, 1), ("c", 1, 1)}
    assert found["getitem"] == {(t, 0, 0), (t, 1, 1), (t, -1, -1)}  # grad_input
    assert found["getitem_1"] == {(t, 0, -1), (t, -1, 0), (t, 1, 1)}  # grad_weight
    found = traced(bwd([True, True, True]), *args)
    assert found["getitem_1"] == {(t, 0, -1), (t, -1, 0)}
    assert found["getitem_2"] == {(t, 0, -1), (t, -1, 0)}  # grad_bias


def test_norms_link_what_their_statistics_allow():
    """Layer norm: the leading dims (its weight gradient sums over them); batch norm: the
    channel dim only, never the batch."""
    found = traced(lambda a, b, c: aten.native_layer_norm(a, [8], b, c, 1e-5), r(2, 3, 8), r(8), r(8))
    assert found["native_layer_norm"] == {("a", 0, 0), ("a", 1, 1)}
    assert found["getitem_2"] == {("native_layer_norm", 0, 0), ("native_layer_norm", 1, 1)}  # rstd
    found = traced(lambda g, x, m, s, w: aten.native_layer_norm_backward(g, x, [8], m, s, w, w, [True] * 3),
                   r(2, 3, 8), r(2, 3, 8), r(2, 3, 1), r(2, 3, 1), r(8))
    t = "native_layer_norm_backward"
    assert found["getitem"] == {(t, 0, 0), (t, 1, 1)}
    assert found["getitem_1"] == found["getitem_2"] == {(t, 0, -1), (t, 1, -2)}
    found = traced(lambda x, w, b, m, v: aten._native_batch_norm_legit_functional(x, w, b, m, v, True, 0.1, 1e-5),
                   r(4, 8, 5, 5), r(8), r(8), r(8), r(8))
    t = "_native_batch_norm_legit_functional"
    assert found[t] == {("a", 1, 1), ("b", 0, 1), ("c", 0, 1), ("d", 0, 1), ("e", 0, 1)}
    assert found["getitem"] == {(t, 1, 1)} and found["getitem_1"] == {(t, 1, 0)}


def test_embedding_and_its_backward_sum_over_index_positions():
    assert only(lambda a, b: aten.embedding(a, b), r(10, 6), torch.randint(0, 10, (2, 3))) == {
        ("b", 0, 0), ("b", 1, 1), ("a", 1, 2)}
    found = only(lambda a, b: aten.embedding_dense_backward(a, b, 10, -1, False),
                 r(2, 3, 6), torch.randint(0, 10, (2, 3)))
    assert found == {("a", 2, 1), ("a", 0, -1), ("a", 1, -2), ("b", 0, -1), ("b", 1, -2)}


def test_attention_links_batch_and_heads_only_without_dropout():
    q, k, v = r(2, 4, 16, 8), r(2, 4, 16, 8), r(2, 4, 16, 8)
    found = traced(lambda a, b, c: aten._scaled_dot_product_flash_attention_for_cpu(a, b, c, 0.0, True), q, k, v)
    t = "_scaled_dot_product_flash_attention_for_cpu"
    assert found[t] == {(x, i, i) for x in "abc" for i in (0, 1)}
    assert found["getitem"] == found["getitem_1"] == {(t, 0, 0), (t, 1, 1)}
    found = traced(lambda a, b, c: aten._scaled_dot_product_flash_attention_for_cpu(a, b, c, 0.1), q, k, v)
    assert all(links is None for links in found.values())  # a random op


def test_unknown_random_in_place_and_symbolic_ops_link_nothing():
    found = traced(lambda a: a.cumsum(0).as_strided((2, 2), (1, 1)), r(4, 8))
    assert found["cumsum"] == {("a", 1, 1)} and found["as_strided"] is None  # cumsum's axis: no
    found = traced(lambda a: nn.functional.dropout(a, 0.5), r(4, 8))
    assert found["bernoulli_"] is None and found["div_"] is None
    assert only(lambda a: torch.rand_like(a), r(4, 8)) is None
    assert only(torch.add, r(4, 8), r(4, 8)) is not None
    assert traced(torch.add, r(4, 8), r(4, 8), mode="symbolic") == {"add": None}


# -- the D-graph on captured graphs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    return captured(lambda x: m(x).pow(2).sum(), torch.randn(12, 16))


def test_mlp_batch_links_through_both_layers_into_the_weight_gradients(mlp):
    g = mlp
    dg = dim_graph(g)
    (x,) = [n for n in g if n.role == "input" and n.shape == (12, 16)]
    batch = dg.component_of(x.name, 0)
    assert batch is dg.components[0] and batch.length == 12
    fc1, fc2 = ops(g, "addmm.default")
    assert members(batch, [fc1, fc2]) == {fc1.name: 0, fc2.name: 0}
    assert members(batch, ops(g, "erf.default")) == {ops(g, "erf.default")[0].name: 0}  # GELU
    grad_x = ops(g, "mm.default", (12, 32))  # the backward through fc2
    assert members(batch, grad_x) == {grad_x[0].name: 0}
    # the weight gradients sum over the batch: it is their reduce axis
    weight_grads = ops(g, "mm.default", (8, 32)) + ops(g, "mm.default", (32, 16))
    assert members(batch, weight_grads) == {w.name: -1 for w in weight_grads}
    for w in weight_grads:
        assert axis_length(g, w.name, -1) == 12
        assert any(a == -1 and g[u].shape[i] == 12 for u, i, a in links(w))
    bias_grads = [n for n in ops(g, "sum.dim_IntList") if n.shape in ((1, 8), (1, 32))]
    assert members(batch, bias_grads) == {b.name: -1 for b in bias_grads}
    # hidden features are another dimension
    hidden = dg.component_of(fc1.name, 1)
    assert hidden is not None and hidden is not batch and hidden.length == 32
    assert all(axis_length(g, v, a) == 12 for v, a in batch.axis.items())
    # no reshape merges dims here: every link joins equal lengths, every component has one
    assert all(axis_length(g, u, i) == axis_length(g, n.name, a) for n in g for u, i, a in links(n))
    for c in dg.components:
        assert {axis_length(g, v, a) for v, a in c.axis.items()} == {c.length}


@pytest.fixture(scope="module")
def attention_block():
    """Pre-norm attention with explicit matmuls (bmm after AOT) and heads, then an MLP."""

    class Block(nn.Module):
        def __init__(self, d=32, heads=4):
            super().__init__()
            self.heads = heads
            self.ln = nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln(x)).split(c, dim=2)
            q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
            y = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(x)

    torch.manual_seed(0)
    m = Block()
    return captured(lambda x: m(x).sum(), torch.randn(3, 8, 32))  # batch 3, sequence 8, 4 heads


def test_attention_block_dimensions(attention_block):
    """What links in a transformer block whose matmuls AOT writes as [B*T, C] mm and [B*H, T, T]
    bmm: the batch spans the layer norm and, through the merge links of the views around them,
    the linear layers ([B*T, C] addmm and mm) and the bmm ([B*H, T, d]); the heads link the
    q/k/v views (and C, which they split); the query and key sequence axes are different
    components, never both in one bmm's component; the key axis is the reduce axis of
    probs @ v but does not link across the softmax."""
    g = attention_block
    dg = dim_graph(g)
    (x,) = [n for n in g if n.role == "input"]
    (ln_stats,) = [n for n in ops(g, "var_mean.correction") if n.role == "forward"]
    batch = dg.component_of(x.name, 0)
    assert batch is dg.components[0] and batch.length == 3 and ln_stats.name in batch.axis
    # the projections and the MLP: B*T (24) rows, the batch's first B/n rows its first B*T/n
    linear = ops(g, "addmm.default")
    assert len(linear) == 4 and members(batch, linear) == {n.name: 0 for n in linear}
    assert all(axis_length(g, n.name, 0) == 24 for n in linear)
    grad_inputs = ops(g, "mm.default", (24, 32)) + ops(g, "mm.default", (24, 128))
    assert len(grad_inputs) == 4 and members(batch, grad_inputs) == {n.name: 0 for n in grad_inputs}
    weight_grads = [n for n in ops(g, "mm.default") if n.shape in ((32, 128), (128, 32), (32, 32), (96, 32))]
    assert len(weight_grads) == 4 and members(batch, weight_grads) == {n.name: -1 for n in weight_grads}
    assert all(axis_length(g, n.name, -1) == 24 for n in weight_grads)  # summed over B*T
    # the bmm's batch B*H (12): the q/k/v views [B, H, T, d] -> [B*H, T, d] link B to it
    bmms = ops(g, "bmm.default")
    assert len(bmms) == 6 and members(batch, bmms) == {n.name: 0 for n in bmms}
    assert all(axis_length(g, n.name, 0) == 12 for n in bmms)
    assert {axis_length(g, v, a) for v, a in batch.axis.items()} == {3, 12, 24}
    # a flattening view [B, T, C] -> [B*T, C] in the batch: B links to B*T, T to nothing
    flatten = [n for n in ops(g, "view.default", (24, 32)) if g[n.inputs[0]].shape == (3, 8, 32)]
    assert flatten and all(dg.linked(n.inputs[0], 0, n.name, 0) and batch.axis[n.name] == 0 for n in flatten)
    assert not any(dg.linked(n.inputs[0], 1, n.name, 0) for n in flatten)
    # layer norm's normalised dim links nothing into its statistics
    assert {i for u, i, a in links(ln_stats) if u == x.name} == {0, 1}
    # heads: q/k/v's view splits C into heads x head_dim; the heads axis links the transposes
    # (and, through the split of C, q/k/v's C: 32, a multiple of 4)
    (qkv,) = [n for n in g if n.op == "split.Tensor" and n.role == "forward"]
    q, k, v = (n for n in g.nodes if n.op == "getitem" and n.inputs == (qkv.name,))
    k_heads = next(n for n in g.users(g.users(k.name)[0].name) if n.op == "permute.default")
    heads = dg.component_of(k_heads.name, 1)
    assert heads.length == 4 and heads.axis.get(k.name) == 2 and axis_length(g, k.name, 2) == 32
    assert all(axis_length(g, n, a) in (4, 32) for n, a in heads.axis.items())
    assert not members(heads, ops(g, "bmm.default") + ops(g, "var_mean.correction"))
    # scores = q @ k^T (forward bmm [12, 8, 8]): m = query positions, n = key positions
    scores, out = [n for n in ops(g, "bmm.default") if n.role == "forward"]
    query, key = dg.component_of(scores.name, 1), dg.component_of(scores.name, 2)
    assert query is not key and query.length == key.length == 8
    assert q.name in query.axis and k.name in key.axis and k.name not in query.axis
    for c in (query, key):  # one dimension per op: no bmm with two axes in one component
        assert all(list(c.axis).count(b.name) <= 1 for b in ops(g, "bmm.default"))
    # probs @ v sums over the key positions, which v's sequence and probs' last dim link to ...
    assert dg.component_of(out.name, -1) is dg.component_of(v.name, 1)
    # ... but the softmax over keys breaks the link: scores' key axis is not probs' key axis
    assert dg.component_of(out.name, -1) is not key
    (probs,) = [n for n in ops(g, "div.Tensor") if n.role == "forward" and n.shape == (3, 4, 8, 8)]
    assert dg.component_of(probs.name, 3) is not key
    (denominator,) = [n for n in ops(g, "sum.dim_IntList") if n.role == "forward" and n.shape == (3, 4, 8, 1)]
    assert key.axis.get(denominator.name) == -1  # the denominator is a sum over parts of the keys


@pytest.fixture(scope="module")
def gpt2():
    from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny

    torch.manual_seed(0)
    return captured(GPT2Loss(gpt2_tiny()), torch.randint(0, 256, (2, 16)))


def test_gpt2_attention_links_batch_and_heads(gpt2):
    g = gpt2
    dg = dim_graph(g)
    attention = ops(g, "_scaled_dot_product_flash_attention_for_cpu.default")
    assert len(attention) == 2
    for sdpa in attention:
        q = g[sdpa.inputs[0]]
        assert dg.linked(q.name, 0, sdpa.name, 0) and dg.linked(q.name, 1, sdpa.name, 1)
        assert not any(dg.linked(q.name, i, sdpa.name, a) for i in (2, 3) for a in range(-2, 4))
        assert dg.component_of(sdpa.name, 2) is None  # the sequence: never split inside attention
        heads = dg.component_of(sdpa.name, 1)
        assert heads.length == 4 and heads.axis[q.name] == 1
        assert not members(heads, ops(g, "var_mean.correction") + ops(g, "addmm.default"))
    backward = ops(g, "_scaled_dot_product_flash_attention_for_cpu_backward.default")
    assert len(backward) == 2
    for sdpa in backward:  # grad_out, q, k, v, out, logsumexp: batch and heads
        assert {(i, a) for _, i, a in links(sdpa)} == {(0, 0), (1, 1)}
        assert {u for u, _, _ in links(sdpa)} == set(sdpa.inputs)


def test_gpt2_batch_links_through_the_linear_layers(gpt2):
    """The forward's batch (length 2) runs from the tokens through the embedding, every layer
    norm, every linear layer ([B*T, C] addmm: 32 rows), the q/k/v views into attention's batch
    and the language-model head, and on into the backward: the linear layers' input and
    weight gradients, the latter summed over B*T (the loss's mean divides by a count computed
    from the labels alone, which no region splits)."""
    g = gpt2
    dg = dim_graph(g)
    (tokens,) = [n for n in g if n.role == "input"]
    batch = dg.component_of(tokens.name, 0)
    assert batch.length == 2 and batch in dg.components[:2]
    linear = ops(g, "addmm.default")
    assert len(linear) == 8 and members(batch, linear) == {n.name: 0 for n in linear}
    assert all(axis_length(g, n.name, 0) == 32 for n in linear)
    (head,) = [n for n in ops(g, "mm.default", (32, 256)) if n.role == "forward"]
    assert batch.axis.get(head.name) == 0
    stats = [n for n in ops(g, "var_mean.correction") if n.role == "forward"]
    assert len(stats) == 5 and members(batch, stats) == {n.name: 0 for n in stats}
    for sdpa in ops(g, "_scaled_dot_product_flash_attention_for_cpu.default"):
        assert batch.axis.get(sdpa.name) == 0
        assert all(batch.axis.get(u) == 0 for u in sdpa.inputs[:3])  # q, k, v
    # the flattening views [B, T, C] -> [B*T, C] before the linear layers link B to B*T
    flatten = [n for n in ops(g, "view.default") if n.shape == (32, 64) and g[n.inputs[0]].shape == (2, 16, 64)]
    assert len(flatten) >= 4
    for n in flatten:
        assert dg.linked(n.inputs[0], 0, n.name, 0) and not dg.linked(n.inputs[0], 1, n.name, 0)
        assert dg.component_of(n.name, 0) is dg.component_of(n.inputs[0], 0)
    assert {axis_length(g, v, a) for v, a in batch.axis.items()} == {2, 32}
    # the backward's batch is the same dimension: the loss's count of valid targets is a
    # label-side value, computed whole before any region, so the backward of every token
    # joins its forward (the gradients of the linear layers: input gradients along B*T,
    # weight gradients summed over it)
    backward = batch
    grad_inputs = [n for n in ops(g, "mm.default") if n.role == "backward" and n.shape[0] == 32]
    weight_grads = [n for n in ops(g, "mm.default") if n.role == "backward" and n.shape[0] != 32]
    assert len(grad_inputs) == len(weight_grads) == 9
    assert members(backward, grad_inputs) == {n.name: 0 for n in grad_inputs}
    assert members(backward, weight_grads) == {n.name: -1 for n in weight_grads}
    assert all(axis_length(g, n.name, -1) == 32 for n in weight_grads)


def test_gpt2_layer_norm_loss_and_embedding_gradient(gpt2):
    g = gpt2
    dg = dim_graph(g)
    (tokens,) = [n for n in g if n.role == "input"]
    emb = next(n for n in ops(g, "embedding.default") if tokens.name in n.inputs)
    batch = dg.component_of(emb.name, 0)
    stats = next(n for n in ops(g, "var_mean.correction") if n.role == "forward")
    assert batch.length == 2 and batch.axis[stats.name] == 0  # the first layer norm
    for n in ops(g, "var_mean.correction"):  # never the normalised dim
        assert {i for _, i, _ in links(n)} == {0, 1}
    # the token embedding's gradient sums over batch and sequence (a scatter-add into zeros)
    (grad_table,) = [n for n in g if n.op == "_unsafe_masked_index_put_accumulate.default" and n.shape == (256, 64)]
    assert {a for _, _, a in links(grad_table)} == {-1, -2, 1}
    assert axis_length(g, grad_table.name, -1) == 2 and axis_length(g, grad_table.name, -2) == 16
    # the loss's log-softmax over the vocabulary: the logits' vocab axis links to the
    # denominator's sum, not to the log-probabilities past it
    (logits,) = [n for n in ops(g, "mm.default", (32, 256)) if n.role == "forward"]
    vocab = dg.component_of(logits.name, 1)
    log_probs = next(n for n in ops(g, "sub.Tensor", (32, 256)) if any(g[u].op == "log.default" for u in n.inputs))
    assert vocab is not None and log_probs.name not in vocab.axis
    assert any(a == -1 for n, a in vocab.axis.items() if g[n].op == "sum.dim_IntList")


def test_gpt2_components_hold_each_node_once_and_are_linked(gpt2):
    """Every component: nodes once each (an axis map), lengths multiples of the smallest (its
    length), connected by its links, sorted largest first; every link of a member whose input
    is a member on the linked dim joins them (the components are unions of D-edges)."""
    g = gpt2
    dg = dim_graph(g)
    sizes = [len(c.axis) for c in dg.components]
    assert sizes == sorted(sizes, reverse=True) and min(sizes) >= 2 and len(sizes) > 20
    assert [c.id for c in dg.components] == list(range(len(sizes)))
    for c in dg.components:
        lengths = {axis_length(g, v, a) for v, a in c.axis.items()}
        assert min(lengths) == c.length and all(n % c.length == 0 for n in lengths)
        edges = {v: set() for v in c.axis}
        for v, a in c.axis.items():
            for u, i, b in links(g[v]):
                if b == a and c.axis.get(u) == i:
                    edges[v].add(u)
                    edges[u].add(v)
                    assert dg.linked(u, i, v, a)
        seen, todo = set(), [next(iter(c.axis))]
        while todo:
            v = todo.pop()
            if v not in seen:
                seen.add(v)
                todo += edges[v]
        assert seen == set(c.axis), f"component {c.id} is not connected by its links"
        for v, a in c.axis.items():
            assert dg.component_of(v, a) is c


def test_meta_dims_survive_json(gpt2):
    g = gpt2
    again = graph_from_dict(graph_to_dict(g))
    assert [dict(c.axis) for c in dim_graph(again).components] == [dict(c.axis) for c in dim_graph(g).components]
    assert dim_graph(g) is dim_graph(g)  # memoized per graph
    assert len(set(dim_graph(g).components)) == len(dim_graph(g).components)  # hashable


@pytest.fixture(scope="module")
def conv_bn():
    from remat.zoo.cnn import ConvBN

    torch.manual_seed(0)
    m = ConvBN()
    return captured(lambda x: m(x).sum(), torch.randn(4, 3, 16, 16))


def test_cnn_batch_links_convolutions_not_batch_statistics(conv_bn):
    """AOT decomposes batch norm into var_mean over (N, H, W) and pointwise ops: the batch
    links through the convolutions, the normalisation and the ReLUs, but never into the
    statistics (var_mean links the channel only), so a region along the batch cannot compute
    them; channels link across the statistics; H and W never cross a convolution."""
    g = conv_bn
    dg = dim_graph(g)
    convs = ops(g, "convolution.default")
    relus = ops(g, "relu.default")
    assert len(convs) == 3 and len(relus) == 3
    batch = dg.component_of(convs[0].name, 0)
    assert batch.length == 4
    assert members(batch, convs + relus) == {n.name: 0 for n in convs + relus}
    stats = ops(g, "var_mean.correction")
    statistics = stats + [u for s in stats for u in g.users(s.name)]
    statistics += [u for s in statistics if s.op == "getitem" for u in g.users(s.name) if u.shape == (1, 8, 1, 1)]
    assert len(statistics) >= 12 and not members(batch, statistics)
    for s in stats:
        assert {(i, a) for _, i, a in links(s)} == {(1, 1)}
        assert dg.component_of(s.name, 1) is dg.component_of(g[s.inputs[0]].name, 1)  # channels
    channels = dg.component_of(convs[0].name, 1)
    assert channels.length == 8 and stats[0].name in channels.axis
    for conv in convs:
        x = g[conv.inputs[0]]
        for d in (2, 3):
            assert not dg.linked(x.name, d, conv.name, d)
            assert dg.component_of(x.name, d) is None or dg.component_of(x.name, d) is not dg.component_of(conv.name, d)
    # the per-channel statistics ([1, 8, 1, 1]) broadcast over N, H, W: only their channel links
    sub = next(u for u in g.users(convs[0].name) if u.op == "sub.Tensor")
    mean = next(u for u in sub.inputs if u != convs[0].name)
    assert {(i, a) for u, i, a in links(sub) if u == mean} == {(1, 1)}
    assert all("dims" not in n.meta for n in g if n.op == "copy_.default")  # in place


# -- the D-graph itself -----------------------------------------------------------------------------


def _node(name, inputs, shape, dims=None, op="add.Tensor"):
    role = "input" if not inputs else "forward"
    return Node(name, "placeholder" if not inputs else op, inputs, role=role, bytes=4,
                category="input" if not inputs else "pointwise", shape=shape,
                meta={"dims": dims} if dims else {})


def test_groups_holding_a_node_twice_or_an_ancestor_of_another_are_not_merged():
    """MAGIS's group construction: x's axis joins its users' groups unless two of them hold the
    same node or nodes one of which is the other's ancestor; then it joins the first user's."""
    # a = 2x, b = x - mean(x, 0): a and b share the batch axis of x
    def graph(stat_of):
        return Graph([
            _node("x", (), (4, 8)),
            _node("a", ("x",), (4, 8), [["x", 0, 0], ["x", 1, 1]]),
            _node("s", (stat_of,), (8,), [[stat_of, 1, 0]], op="mean.dim"),
            _node("b", ("x", "s"), (4, 8), [["x", 0, 0], ["x", 1, 1], ["s", 0, 1]]),
        ])
    assert dim_graph(graph("x")).component_of("x", 0).axis == {"x": 0, "a": 0, "b": 0}
    # with s = mean(a, 0), a is an ancestor of b through s, which does not carry the batch:
    # a region holding a and b would need s, computed from all of a
    dg = dim_graph(graph("a"))
    assert dg.component_of("x", 0).axis == {"x": 0, "a": 0} and dg.component_of("b", 0) is None
    # z = x + y^T, y = f(x): x's axis 0 is y's axis 0 but z's axis ... 0 and 1 at once
    g = Graph([
        _node("x", (), (4, 4)),
        _node("y", ("x",), (4, 4), [["x", 0, 0], ["x", 1, 1]]),
        _node("z", ("x", "y"), (4, 4), [["x", 0, 0], ["x", 1, 1], ["y", 0, 1], ["y", 1, 0]]),
    ])
    dg = dim_graph(g)
    assert dg.component_of("x", 0).axis == {"x": 0, "y": 0, "z": 1}
    assert dg.component_of("x", 1).axis == {"x": 1, "y": 1, "z": 0}
    assert not dg.linked("x", 0, "z", 1)  # an edge inside a component need not carry its axes


def test_bad_links_are_refused():
    g = Graph([_node("x", (), (4,)), _node("w", (), (4,)), _node("y", ("x",), (4,), [["w", 0, 0]])])
    with pytest.raises(GraphError, match="does not read"):
        dim_graph(g)
    g = Graph([_node("x", (), (4,)), _node("y", ("x",), (8,), [["x", 0, 0]])])
    with pytest.raises(GraphError, match="length"):  # a multiple, but not a reshape
        dim_graph(g)
    # a reshape [2, 16, 8] -> [32, 8] links B (dim 0) to B*T, never T (dim 1)
    for bad in (["x", 1, 0], ["x", 2, 0]):
        g = Graph([_node("x", (), (2, 16, 8)), _node("y", ("x",), (32, 8), [bad], op="view.default")])
        with pytest.raises(GraphError, match="length"):
            dim_graph(g)


def _reshape(name, x, shape, dims):
    return _node(name, (x,), shape, dims, op="view.default")


def test_merge_links_join_multiples_of_the_smallest_length():
    """[B, T, C] -> [B*T, C] -> f -> [B, T, C]: the batch component holds B and B*T axes, its
    length is B; a group whose lengths would not all be multiples of the smallest is not merged
    ([4, 6] -> [24] -> [6, 4]: 4 and 6)."""
    g = Graph([
        _node("x", (), (2, 16, 8)),
        _reshape("flat", "x", (32, 8), [["x", 0, 0], ["x", 2, 1]]),
        _node("f", ("flat",), (32, 8), [["flat", 0, 0], ["flat", 1, 1]], op="relu.default"),
        _reshape("y", "f", (2, 16, 8), [["f", 0, 0], ["f", 1, 2]]),
        _node("s", ("y",), (2,), [["y", 0, 0], ["y", 1, -1], ["y", 2, -2]], op="sum.dim_IntList"),
    ])
    dg = dim_graph(g)
    batch = dg.component_of("x", 0)
    assert batch.axis == {"x": 0, "flat": 0, "f": 0, "y": 0, "s": 0} and batch.length == 2
    assert [axis_length(g, v, 0) for v in batch.axis] == [2, 32, 32, 2, 2]
    # T: x's links nothing (B*T merges it); y's (made by the unflattening) is the sum's reduce axis
    assert dg.component_of("x", 1) is None and dg.component_of("y", 1).axis == {"y": 1, "s": -1}
    g = Graph([
        _node("x", (), (4, 6)),
        _reshape("flat", "x", (24,), [["x", 0, 0]]),
        _reshape("y", "flat", (6, 4), [["flat", 0, 0]]),
    ])
    dg = dim_graph(g)
    assert dg.component_of("flat", 0).axis == {"flat": 0, "y": 0} and dg.component_of("flat", 0).length == 6
    assert dg.component_of("x", 0) is None  # 4 and 6: n = 4 would not split y's 6 rows


def test_dim_graph_on_a_5000_node_graph():
    """Ancestry as Python-int bitsets: the D-graph of a 5,000-node graph is built quickly."""
    import random

    rnd = random.Random(0)
    nodes = [_node("x", (), (8, 16))]
    acts = ["x"]
    while len(nodes) < 5000:
        i, a = len(nodes), acts[-1]
        if rnd.random() < 0.1:
            nodes.append(_node(f"w{i}", (), (16, 16)))
            nodes.append(_node(f"mm{i}", (a, f"w{i}"), (8, 16), [[a, 0, 0], [a, 1, -1], [f"w{i}", 0, -1],
                                                                [f"w{i}", 1, 1]], op="mm.default"))
        else:
            b = rnd.choice(acts[-20:])
            nodes.append(_node(f"p{i}", (a, b), (8, 16), [[a, 0, 0], [a, 1, 1], [b, 0, 0], [b, 1, 1]]))
        acts.append(nodes[-1].name)
    g = Graph(nodes)
    t0 = time.perf_counter()
    dg = dim_graph(g)
    elapsed = time.perf_counter() - t0
    print(f"dim_graph: {len(g)} nodes in {elapsed:.3f}s, largest components {[len(c.axis) for c in dg.components[:3]]}")
    assert dg.component_of("x", 0).length == 8 and len(dg.components[0].axis) > 4000
