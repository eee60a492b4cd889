"""Lowering a fission to the joint fx graph (:mod:`remat.lower.fission`).

Each test captures a real joint graph, writes Fission records by hand from its node names,
unrolls them with :func:`fission_joint` and runs the original and the fissioned module on the
same real tensors: every output (forward outputs and gradients) must be the same.
"""

import pytest
import torch
from torch import nn

from remat.capture import joint as tc
from remat.capture.to_graph import categorize, graph_from_joint
from remat.errors import PlanError
from remat.graph.fission import SUM, Fission, part_name, slice_name, sum_name
from remat.lower.fission import fission_joint
from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny

from test_lowering import _captured_joint

aten = torch.ops.aten


class _MLP(nn.Module):
    """Linear(16, 32) - GELU - Linear(32, 8), summed; ``dropout`` on the input."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.l2(nn.functional.gelu(self.l1(self.drop(x)))).sum()


class _Flat(nn.Module):
    """A weight flattened, scaled and summed: its backward reads nothing of the forward."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 12))

    def forward(self, x):
        return (self.w.view(-1) * 3.0).sum() + x.sum()


class _Transposed(nn.Module):
    """A Linear's output transposed (a view) and read by pointwise ops outside the region."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 32)

    def forward(self, x):
        return (self.lin(x).t() * 2.0).tanh().sum()


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return _captured_joint(_MLP(), torch.randn(12, 16))


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    return _captured_joint(GPT2Loss(gpt2_tiny(n_layer=1)), torch.randint(0, 256, (2, 16)))


# The MLP's joint graph (batch 12; x: the placeholder of shape (12, 16), :func:`_x`):
# forward: addmm = x @ W1^T + b1; GELU: mul, mul_1, erf, add, mul_2; addmm_1; sum_1 (the loss)
_FORWARD = {"addmm": 0, "mul": 0, "mul_1": 0, "erf": 0, "add": 0, "mul_2": 0, "addmm_1": 0,
            "sum_1": -1}
# backward: expand (the loss's gradient), mm (into mul_2), permute_3 / mm_1 (W2's gradient),
# sum_2 / view (b2's), GELU's backward mul_4 ... mul_9, permute_6 / mm_2 (W1's), sum_3 / view_1
_BACKWARD = {"expand": 0, "mm": 0, "permute_3": 1, "mm_1": -1, "sum_2": -1, "view": -1,
             "mul_4": 0, "mul_5": 0, "mul_6": 0, "exp": 0, "mul_7": 0, "mul_8": 0, "add_2": 0,
             "mul_9": 0, "permute_6": 1, "mm_2": -1, "sum_3": -1, "view_1": -1}


def _x(gm):
    """The MLP's input (12, 16), the one placeholder the batch splits."""
    return next(p.name for p in gm.graph.find_nodes(op="placeholder") if p.meta["val"].shape == (12, 16))


def _backward_sliced(gm):
    """What the backward region reads of the forward: the GELU's input and values, and x."""
    return {"mul_2": 0, "add": 0, "addmm": 0, _x(gm): 0}


def _fission(gm, axis, sliced, n, length, index=0, **over):
    """A Fission over ``axis``'s nodes whose outputs are the nodes read outside the region
    (concatenated along their axis, or summed for a reduce axis)."""
    by_name = {v.name: v for v in gm.graph.nodes}
    region = set(axis)
    outputs = {v: (a if a >= 0 else SUM) for v, a in axis.items()
               if any(u.name not in region for u in by_name[v].users)}
    fields = dict(nodes=tuple(axis), axis=axis, n=n, length=length, sliced=sliced,
                  outputs=outputs, index=index)
    fields.update(over)
    return Fission(**fields)


def _inputs(gm, seed=0):
    torch.manual_seed(seed)
    out = []
    for p in gm.graph.find_nodes(op="placeholder"):
        val = p.meta["val"]
        if val.dtype.is_floating_point:
            out.append(torch.randn(val.shape, dtype=val.dtype))
        else:
            out.append(torch.randint(0, 256, val.shape, dtype=val.dtype))
    return out


class _Checked(torch.fx.Interpreter):
    """Runs a module and checks that each value is as its ``meta["val"]`` says: shape, dtype
    and strides (a merge is contiguous where its node was a view; its readers follow)."""

    def run_node(self, node):
        out = super().run_node(node)
        val = node.meta.get("val")
        if isinstance(out, torch.Tensor) and isinstance(val, torch.Tensor):
            assert (out.shape, out.dtype, out.stride()) == (val.shape, val.dtype, val.stride()), node.name
        return out


def _assert_same(gm, new, seed=0):
    """Both modules, on the same inputs and from the same RNG state, give the same outputs."""
    args = _inputs(gm, seed)
    torch.manual_seed(seed)
    want = gm(*args)
    torch.manual_seed(seed)
    got = _Checked(new).run(*args)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        if w is None:
            assert g is None
        else:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _nodes(gm):
    return {v.name: v for v in gm.graph.nodes}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_forward_region_split_along_the_batch(mlp, n):
    """Both Linears and the GELU run as n parts on slices of x; the weights are shared; the
    values the backward reads (addmm, add, mul_2) are concatenated and still read by it."""
    x = _x(mlp.gm)
    f = _fission(mlp.gm, _FORWARD, {x: 0}, n, 12)
    assert f.outputs == {"addmm": 0, "add": 0, "mul_2": 0, "sum_1": SUM}
    new = fission_joint(mlp.gm, [f])
    _assert_same(mlp.gm, new)
    nodes, old = _nodes(new), _nodes(mlp.gm)
    for v in _FORWARD:
        full = old[v].meta["val"].shape
        for k in range(n):
            part = nodes[part_name(v, k)]
            assert part.target is old[v].target
            assert part.meta["val"].shape == ((12 // n, *full[1:]) if _FORWARD[v] >= 0 else full)
            assert part.meta["stack_trace"] == old[v].meta["stack_trace"]
            assert part.meta["partitioner_tag"] == "is_forward"
    for k in range(n):
        s = nodes[slice_name(x, 0, k)]
        assert s.target is aten.slice.Tensor and s.args == (nodes[x], 0, k * 12 // n, (k + 1) * 12 // n)
        assert nodes[part_name("addmm", k)].args[1] is s
        assert nodes[part_name("addmm", k)].args[0].name == old["addmm"].args[0].name  # bias: shared
    for v in ("mul", "mul_1", "erf", "addmm_1"):  # read inside the region only: gone
        assert v not in nodes
    for v in ("addmm", "add", "mul_2"):
        assert nodes[v].target is aten.cat.default
        assert nodes[v].args == ([nodes[part_name(v, k)] for k in range(n)], 0)
        assert nodes[v].meta["val"].shape == _nodes(mlp.gm)[v].meta["val"].shape
    assert nodes["mul_5"].args == (nodes["addmm"], nodes["addmm"])  # the backward reads the merge
    assert nodes["mm_1"].args[1] is nodes["mul_2"]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_weight_gradients_are_the_sum_of_the_parts(mlp, n):
    """The backward region's weight and bias gradients have the batch as a reduce axis: each
    part computes a partial sum and the parts are added, ``v__sum1 = p0 + p1``, ... ``v``."""
    f = _fission(mlp.gm, _BACKWARD, _backward_sliced(mlp.gm), n, 12)
    assert f.outputs == {"mm_1": SUM, "view": SUM, "mm_2": SUM, "view_1": SUM}
    new = fission_joint(mlp.gm, [f])
    _assert_same(mlp.gm, new)
    nodes = _nodes(new)
    for v in f.outputs:
        parts = [nodes[part_name(v, k)] for k in range(n)]
        assert all(p.meta["val"].shape == _nodes(mlp.gm)[v].meta["val"].shape for p in parts)
        chain = [parts[0]] + [nodes[sum_name(v, k)] for k in range(1, n - 1)] + [nodes[v]]
        for k in range(1, n):
            assert chain[k].target is aten.add.Tensor and chain[k].args == (chain[k - 1], parts[k])
        assert sum_name(v, n - 1) not in nodes
    assert nodes[part_name("expand", 0)].args == (nodes["tangents_1"], [12 // n, 8])  # its size


def test_a_reader_placed_before_the_merge_moves_after_it(mlp):
    """The backward region without W2's gradient: ``expand`` is read outside the region by
    ``permute_3`` and ``sum_2``, which stood before the region's last node, where the merge is
    placed; they (and their readers) move after it."""
    axis = {v: a for v, a in _BACKWARD.items() if v not in ("permute_3", "mm_1", "sum_2", "view")}
    f = _fission(mlp.gm, axis, _backward_sliced(mlp.gm), 3, 12)
    assert f.outputs == {"expand": 0, "mm_2": SUM, "view_1": SUM}
    new = fission_joint(mlp.gm, [f])
    _assert_same(mlp.gm, new)
    order = [v.name for v in new.graph.nodes]
    assert order.index("expand") < order.index("permute_3") < order.index("mm_1")
    assert order.index("expand") < order.index("sum_2") < order.index("view")
    assert order.index(part_name("mm_2", 0)) < order.index("expand")  # the parts come first


def test_two_fissions_in_one_call_name_their_slices_apart(mlp):
    """A forward fission in 2 and a backward one in 3 parts, both slicing x: the slices are
    ``x__slice0_k`` and ``x__slice1_k``; the backward slices the forward's merges."""
    x = _x(mlp.gm)
    fw = _fission(mlp.gm, _FORWARD, {x: 0}, 2, 12, index=0)
    bw = _fission(mlp.gm, _BACKWARD, _backward_sliced(mlp.gm), 3, 12, index=1)
    new = fission_joint(mlp.gm, [fw, bw])
    _assert_same(mlp.gm, new)
    nodes = _nodes(new)
    assert {slice_name(x, 0, k) for k in range(2)} <= set(nodes)
    assert {slice_name(x, 1, k) for k in range(3)} <= set(nodes)
    assert nodes[slice_name("mul_2", 1, 0)].args[0] is nodes["mul_2"]
    assert nodes["mul_2"].target is aten.cat.default
    assert fission_joint(mlp.gm, [fw.with_n(1), bw.with_n(1)]).code == mlp.gm.code  # n = 1: as is


@pytest.mark.parametrize("n", [2, 4])
def test_attention_split_along_heads(gpt2, n):
    """GPT-2's attention (4 heads) from the q, k, v split to the heads' merge, in n parts of
    4/n heads: q, k and v are sliced along their channels, the attention runs per part, and
    what the backward reads (q, k, v, the output and its log-sum-exp) is concatenated."""
    attention = "_scaled_dot_product_flash_attention_for_cpu"
    axis = {v: 1 for v in ("view_3", "permute", "view_4", "permute_1", "view_5", "permute_2",
                           "clone_1", "clone_2", attention, "getitem_5", "getitem_6", "permute_3")}
    axis.update(view_3=2, view_4=2, view_5=2, permute_3=2)
    f = _fission(gpt2.gm, axis, {"getitem_2": 2, "getitem_3": 2, "getitem_4": 2}, n, 4)
    assert f.outputs == {"permute_2": 1, "clone_1": 1, "clone_2": 1, "getitem_5": 1,
                         "getitem_6": 1, "permute_3": 2}
    new = fission_joint(gpt2.gm, [f])
    _assert_same(gpt2.gm, new)
    nodes = _nodes(new)
    assert nodes[part_name(attention, 0)].meta["val"][0].shape == (2, 4 // n, 16, 16)
    assert nodes[part_name("view_3", 0)].args[1] == [2, 16, -1, 16]  # -1 stays inferred
    assert attention not in nodes


def test_a_random_op_outside_the_region_draws_once_and_the_parts_read_slices():
    """Dropout's mask is drawn before the region, once for the whole batch; the region (from
    the mask's comparison to the loss) slices it. The random ops appear as often as before,
    and the same seed gives the same outputs. Inside the region it is refused."""
    torch.manual_seed(0)
    gm = _captured_joint(_MLP(dropout=0.5), torch.randn(12, 16)).gm
    random = [v.name for v in gm.graph.nodes if categorize(v)[0] == "random"]
    draw = next(v.name for v in gm.graph.nodes if "inductor_random" in str(v.target))
    x = _x(gm)
    mask = next(iter(_nodes(gm)[draw].users)).name  # gt: the draw compared with p
    axis = {v: (-1 if v == "sum_1" else 0) for v in _forward_from(gm, mask)}
    f = _fission(gm, axis, {draw: 0, x: 0}, 3, 12)
    new = fission_joint(gm, [f])
    assert [v.name for v in new.graph.nodes if categorize(v)[0] == "random"] == random
    assert all(_nodes(new)[slice_name(draw, 0, k)].args[0].name == draw for k in range(3))
    _assert_same(gm, new, seed=0)
    with pytest.raises(PlanError, match=f"{draw}.*random"):
        fission_joint(gm, [_fission(gm, {draw: 0, **axis}, {x: 0}, 3, 12)])


def _forward_from(gm, first):
    """The forward's ops from ``first`` to the loss ``sum_1``, in order, but the weights'
    transposes (inputs the parts share)."""
    out = []
    for v in gm.graph.nodes:
        if out or v.name == first:
            if v.target is not aten.permute.default:
                out.append(v.name)
        if v.name == "sum_1":
            return out
    raise AssertionError("no sum_1")


def test_a_view_of_a_slice_no_strides_express_becomes_a_copy():
    """The weight (4, 12) split along its columns: each part's slice (4, 12/n) is not
    contiguous, so ``view(-1)`` of it has no strides; the part reshapes with a copy instead
    (``aten._reshape_copy``), keeping its name. The loss is the same (a sum does not mind the
    order its terms come in)."""
    torch.manual_seed(0)
    joint = _captured_joint(_Flat(), torch.randn(5))
    gm = joint.gm
    view = next(v.name for v in gm.graph.nodes if v.target is aten.view.default
                and v.args[0].op == "placeholder")
    scale = next(iter(_nodes(gm)[view].users)).name
    loss = next(iter(_nodes(gm)[scale].users)).name
    w = _nodes(gm)[view].args[0].name
    f = _fission(gm, {view: 0, scale: 0, loss: -1}, {w: 1}, 2, 12)
    new = fission_joint(gm, [f])
    nodes = _nodes(new)
    for k in range(2):
        part = nodes[part_name(view, k)]
        assert part.target is aten._reshape_copy.default and part.args[0].name == slice_name(w, 0, k)
        assert part.meta["val"].shape == (24,) and part.meta["val"].is_contiguous()
    _assert_same(gm, new)


def test_a_merge_in_place_of_a_view_lays_its_readers_out_anew():
    """The region ends with the transpose of the Linear's output, a view with strides (1, 32);
    its merge (a concatenation) is contiguous, and so is the pointwise op reading it outside
    the region: its ``meta["val"]`` is computed again (:class:`_Checked` runs the graph)."""
    torch.manual_seed(0)
    gm = _captured_joint(_Transposed(), torch.randn(12, 16)).gm
    addmm = next(v for v in gm.graph.nodes if v.target is aten.addmm.default)
    t = next(v for v in addmm.users if v.target is aten.permute.default)
    reader = next(iter(t.users))
    assert t.meta["val"].stride() == (1, 32) and reader.meta["val"].stride() == (1, 32)
    f = _fission(gm, {addmm.name: 0, t.name: 1}, {_x(gm): 0}, 3, 12)
    assert f.outputs == {t.name: 1}
    new = fission_joint(gm, [f])
    nodes = _nodes(new)
    assert nodes[t.name].target is aten.cat.default and nodes[t.name].meta["val"].stride() == (12, 1)
    assert nodes[reader.name].meta["val"].stride() == (12, 1)
    _assert_same(gm, new)


def test_refusals_name_the_node(mlp, gpt2):
    gm, x = mlp.gm, _x(mlp.gm)
    with pytest.raises(PlanError, match="does not divide"):
        fission_joint(gm, [_fission(gm, _FORWARD, {x: 0}, 5, 12)])
    with pytest.raises(PlanError, match="at least 1"):
        fission_joint(gm, [_fission(gm, _FORWARD, {x: 0}, 0, 12)])
    with pytest.raises(PlanError, match="'nope' is not in the graph"):
        fission_joint(gm, [_fission(gm, _FORWARD, {x: 0}, 2, 12, nodes=("nope",))])
    fw = _fission(gm, _FORWARD, {x: 0}, 2, 12)
    with pytest.raises(PlanError, match="'mul_2'.*not one of its outputs"):
        fission_joint(gm, [Fission(fw.nodes, fw.axis, 2, 12, fw.sliced,
                                   {k: v for k, v in fw.outputs.items() if k != "mul_2"})])
    with pytest.raises(PlanError, match="addmm"):  # x not sliced: the part cannot add the batch
        fission_joint(gm, [_fission(gm, _FORWARD, {}, 2, 12)])
    attention = "_scaled_dot_product_flash_attention_for_cpu"
    with pytest.raises(PlanError, match=f"{attention}.*tuple"):  # its getitems are the outputs
        fission_joint(gpt2.gm, [Fission((attention,), {attention: 1}, 2, 4,
                                        {"permute_2": 1, "clone_1": 1, "clone_2": 1},
                                        {attention: 1})])


def test_the_fissioned_joint_is_captured_by_the_pipeline(mlp):
    """``prepare_joint`` + ``graph_from_joint`` take the fissioned graph: its slices, parts
    and merges are nodes of the remat Graph, under their names. (The backward's parts that
    read shared inputs only, ``expand__part1`` and what it feeds up to ``view__part1``, equal
    part 0: ``prepare_joint``'s CSE keeps part 0 alone, so they are not checked here.)"""
    x = _x(mlp.gm)
    fw = _fission(mlp.gm, _FORWARD, {x: 0}, 3, 12, index=0)
    bw = _fission(mlp.gm, _BACKWARD, _backward_sliced(mlp.gm), 2, 12, index=1)
    new = fission_joint(mlp.gm, [fw, bw])
    static = [i for i, p in enumerate(mlp.primals) if p in mlp.static_lifetime_inputs]
    joint = tc.prepare_joint(new, mlp.num_fwd_outputs, static)
    g = graph_from_joint(joint)
    names = {v.name for v in g.nodes}
    want = {part_name(v, k) for v in _FORWARD for k in range(3)}
    want |= {slice_name(x, 0, k) for k in range(3)} | {sum_name("sum_1", 1)}
    want |= {slice_name(u, 1, k) for u in _backward_sliced(mlp.gm) for k in range(2)}
    want |= {part_name(v, k) for v in ("mm_1", "mm_2", "mul_9") for k in range(2)}
    want |= {"addmm", "add", "mul_2", "sum_1", "mm_1", "view", "mm_2", "view_1"}
    assert want <= names
    assert not {"mul", "erf", "addmm_1", "mul_9", "exp"} & names
    assert g["addmm"].op == "cat.default" and g["mm_2"].op == "add.Tensor"
