"""The seeds' worked examples as hand-built joint graphs, solved by the min-cut solver. No torch.

seeds/000 = the min-cut checkpointing paper (Sections 2.2, 2.3, 3.3-3.5, Algorithms 1 and 2),
seeds/002 = the cos-cos walkthrough (cost 2B vs 4B), seeds/003 = the AOTAutograd min-cut post.
Every tensor below has NUMEL elements; float32 tensors are W = 4 * NUMEL bytes.
"""

from __future__ import annotations

import pytest

from remat.graph.examples import cos_cos_graph
from remat.graph.graph import Graph, Node
from remat.plans.saved_set import validity_errors
from remat.solvers.mincut.maxflow import min_cut
from remat.solvers.mincut.mincut import MODES, analyse, banned, cut_cost, flow_network, mincut

NUMEL = 1024
W = 4 * NUMEL  # bytes of one float32 tensor


def inp(name, bytes=W, role="input"):
    return Node(name, "placeholder", (), role=role, bytes=bytes, category="input",
                shape=(NUMEL,), dtype="float32")


def tangent(name="tangents_1", bytes=W):
    return Node(name, "placeholder", (), role="tangent", bytes=bytes, category="input",
                shape=(NUMEL,), dtype="float32")


def op(name, *inputs, category="pointwise", role="forward", bytes=W, **kw):
    return Node(name, name.rstrip("_0123456789") or name, inputs, role=role, bytes=bytes,
                category=category, **kw)


def bw(name, *inputs, **kw):
    return op(name, *inputs, role="backward", **kw)


def plans(g):
    return {(mode, tb): mincut(g, mode=mode, tie_break=tb) for mode in MODES for tb in (True, False)}


# -- cos(cos(a + b + c + d)): seeds/000 Section 2.3 / Figure 2-3, seeds/002, seeds/003 -----


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tie_break", [True, False])
def test_cos_cos_saves_only_add_2(mode, tie_break):
    """seeds/002 and seeds/000 Section 2.3 (f1): the optimal saved set of cos(cos(a+b+c+d)) is
    {add_2} (x = a+b+c+d, 'add3' in the paper) with cost 2B, and the backward recomputes cos."""
    g = cos_cos_graph(NUMEL)
    plan = mincut(g, mode=mode, tie_break=tie_break)
    assert plan.saved_names == ["add_2"]
    assert plan.cost == 2 * W
    assert plan.recomputed == ["cos"]  # the only forward-pass value the backward recomputes
    assert sorted(plan.moved_to_backward) == ["neg", "neg_1", "sin", "sin_1"]
    assert plan.saved_activation_bytes == W


def test_cos_cos_naive_sets_cost_twice_as_much():
    """seeds/002: cutting add_2 costs 2B; naive AD (save x and cos(x): add_2 and cos, 'add3' and
    'cos1' in seeds/000 Section 3.2) costs 2B + 2B = 4B; naive checkpointing (save the inputs
    a, b, c, d, already materialized) costs 1B x 4 = 4B. Both are valid, both cost 2x more."""
    g = cos_cos_graph(NUMEL)
    for mode in MODES:
        ban = banned(g, mode)
        naive_ad, naive_ckpt = ["add_2", "cos"], ["a", "b", "c", "d"]
        assert validity_errors(g, naive_ad, ban) == []
        assert validity_errors(g, naive_ckpt, ban) == []
        assert cut_cost(g, ["add_2"], mode) == 2 * W
        assert cut_cost(g, naive_ad, mode) == 4 * W
        assert cut_cost(g, naive_ckpt, mode) == 4 * W
        assert cut_cost(g, naive_ad, mode) == 2 * mincut(g, mode=mode).cost
        assert cut_cost(g, naive_ckpt, mode) == 2 * mincut(g, mode=mode).cost


def test_cos_cos_capacities_follow_algorithm_2():
    """seeds/000 Algorithm 2 on Figure 2: inputs are materialized (w), the forward output cos_1
    is materialized (w), every other forward node has only fusible users (2w); nothing is
    banned in either mode (seeds/003: all pointwise, all fusible)."""
    g = cos_cos_graph(NUMEL)
    for mode in MODES:
        a = analyse(g, mode)
        cap = {n.name: a.capacity[i] for i, n in enumerate(g) if n.is_forward}
        assert cap == {"a": W, "b": W, "c": W, "d": W, "add": 2 * W, "add_1": 2 * W,
                       "add_2": 2 * W, "cos": 2 * W, "cos_1": W, "sin": 2 * W, "neg": 2 * W,
                       "sin_1": 2 * W, "neg_1": 2 * W}
        assert banned(g, mode) == {}


def test_cos_cos_source_partition_matches_section_3_5():
    """seeds/000 Section 3.5 / Figure 3: for the optimal cut the source partition is
    {source, add3_in} + {i_in, i_out for i in a, b, c, d, add1, add2} (remat's add, add_1,
    add_2 are the paper's add1, add2, add3); everything else is on the sink side."""
    g = cos_cos_graph(NUMEL)
    net = flow_network(g, analyse(g, "conservative"))
    cut = min_cut(net.num_vertices, net.tails, net.heads, net.caps, 0, 1)
    assert cut.value == 2 * W
    expected = {0, 2 + 2 * g.index("add_2")}
    for name in ("a", "b", "c", "d", "add", "add_1"):
        expected |= {2 + 2 * g.index(name), 3 + 2 * g.index(name)}
    assert {int(v) for v in cut.source_side.nonzero()[0]} == expected


# -- dropout-like f2(x) = x * (rand_like(x) < 0.5): seeds/000 Section 2.3, seeds/003 ----------


def dropout_graph() -> Graph:
    """The joint graph of f2: rand_like is random (float32), lt gives a bool mask (1 byte per
    element), mul is the float32 output. In the backward, grad_x = tangent * mask."""
    return Graph([
        inp("primals_1"),
        op("rand_like", "primals_1", category="random", dtype="float32"),
        op("lt", "rand_like", bytes=NUMEL, dtype="bool"),
        op("mul", "primals_1", "lt", is_output=True),
        tangent(),
        bw("mul_1", "tangents_1", "lt"),
    ], name="dropout")


def test_dropout_saves_the_bool_mask_not_the_random_floats():
    """seeds/000 Section 2.3 (f2) and seeds/003: rand_like must not be recomputed, but instead of
    saving rand_like (a FloatTensor) the plan saves mask = lt (a BoolTensor), 3 bytes less
    per element. grad_x = tangent * mask needs only the mask."""
    g = dropout_graph()
    for (mode, tb), plan in plans(g).items():
        assert plan.saved_names == ["lt"], (mode, tb)
        assert plan.saved_activation_bytes == NUMEL  # 1 byte per element
        assert "rand_like" not in plan.recomputed and "rand_like" not in plan.moved_to_backward
        assert "rand_like" in banned(g, mode)
        assert plan.cost == 2 * NUMEL  # lt is fused into mul and mul_1: written + read
        assert cut_cost(g, ["rand_like"], mode) == W > plan.cost  # saving the floats
        assert validity_errors(g, ["rand_like"], banned(g, mode)) == []


def test_dropout_never_recomputes_random_even_if_it_is_tiny():
    """seeds/000 Section 3.4: random ops are banned from recomputation whatever the sizes: with
    a free input and a large mask the plan still may not recompute rand_like."""
    g = Graph([
        inp("x", bytes=1),
        op("rand_like", "x", category="random", bytes=W),
        op("lt", "rand_like", bytes=W),
        op("mul", "x", "lt", is_output=True),
        tangent(),
        bw("grad", "tangents_1", "lt"),
    ])
    for (mode, tb), plan in plans(g).items():
        assert "rand_like" not in plan.recomputed
        assert plan.saved_names in (["rand_like"], ["lt"])
        assert plan.cost == W  # rand_like is materialized (not fusible): w, cheaper than 2w lt


# -- tanh(tanh(x)) and GeLU: seeds/000 Sections 1 and 2.2 (Table 1) -------------------------


def tanh_tanh_graph() -> Graph:
    """Joint graph of tanh(tanh(x)): d/dx = (1 - t2^2) * (1 - t1^2) * grad, all pointwise."""
    return Graph([
        inp("x"),
        op("tanh", "x"),
        op("tanh_1", "tanh", is_output=True),
        tangent(),
        op("mul", "tanh_1", "tanh_1"),
        op("rsub", "mul"),  # 1 - tanh_1^2
        bw("mul_1", "tangents_1", "rsub"),
        op("mul_2", "tanh", "tanh"),
        op("rsub_1", "mul_2"),  # 1 - tanh^2
        bw("mul_3", "mul_1", "rsub_1"),
    ], name="tanh_tanh")


def gelu_graph() -> Graph:
    """GeLU written out with erf: y = x * 0.5 * (1 + erf(x / sqrt2)); backward
    dy/dx = 0.5 * (1 + erf(x / sqrt2)) + x * exp(-x^2 / 2) / sqrt(2 pi). All pointwise."""
    return Graph([
        inp("x"),
        op("mul", "x"),  # x * 0.5
        op("mul_1", "x"),  # x * (1 / sqrt2)
        op("erf", "mul_1"),
        op("add", "erf"),  # 1 + erf
        op("mul_2", "mul", "add", is_output=True),
        tangent(),
        op("mul_3", "add"),  # 0.5 * (1 + erf)
        op("mul_4", "x", "x"),  # x^2
        op("mul_5", "mul_4"),  # -x^2 / 2
        op("exp", "mul_5"),
        op("mul_6", "exp"),  # / sqrt(2 pi)
        op("mul_7", "x", "mul_6"),
        op("add_1", "mul_3", "mul_7"),
        bw("mul_8", "tangents_1", "add_1"),
    ], name="gelu")


@pytest.mark.parametrize("make", [tanh_tanh_graph, gelu_graph], ids=["tanh_tanh", "gelu"])
def test_pointwise_chains_save_only_the_input(make):
    """seeds/000 Section 1 (tanh(tanh(x))) and Section 2.2 / Table 1 (GeLU via erf): with
    fusion, saving only the input x and recomputing the whole forward in the backward is
    optimal (1 read, no write: cost w), beating naive AD, which saves several activations."""
    g = make()
    forward = {n.name for n in g if n.role == "forward"}
    for (mode, tb), plan in plans(g).items():
        assert plan.saved_names == ["x"], (mode, tb, plan.saved_names)
        assert plan.cost == W
        assert plan.saved_activation_bytes == 0
        assert banned(g, mode) == {}
        computed = set(plan.recomputed) | set(plan.moved_to_backward)
        needed = {i for n in g if n.role == "backward" for i in n.inputs if g[i].is_forward}
        assert needed <= computed <= forward
    # naive AD saves what the backward reads: strictly more expensive
    naive = sorted({i for n in g if n.role == "backward" for i in n.inputs if g[i].is_forward})
    assert cut_cost(g, naive) > W


# -- bans: compute ops and reductions (seeds/000 Sections 3.1 and 3.4) ----------------------


def matmul_graph() -> Graph:
    """relu(x @ w) with tiny x and w: recomputing the matmul would be the cheapest cut."""
    return Graph([
        inp("x", bytes=8),
        inp("w", bytes=8, role="param"),
        op("mm", "x", "w", category="compute", bytes=W),
        op("relu", "mm", bytes=W, is_output=True),
        tangent(),
        bw("threshold_backward", "tangents_1", "relu"),
        bw("mm_1", "threshold_backward", "w", category="compute"),
        bw("mm_2", "x", "threshold_backward", category="compute"),
    ], name="matmul")


def test_compute_nodes_are_never_recomputed():
    """seeds/000 Section 3.1 assumption 3: a compute-bound op (matmul) is banned from
    recomputation in both modes, even though recomputing it from the 8-byte x and w would be
    the cheapest cut. The plan saves mm or relu (both materialized: w) besides x and w."""
    g = matmul_graph()
    for (mode, tb), plan in plans(g).items():
        assert "mm" in banned(g, mode)
        assert "mm" not in plan.recomputed and "mm" not in plan.moved_to_backward
        assert plan.cost == W + 16  # x and w (read by the backward matmuls) + one of mm/relu
        assert sorted(plan.saved_names) in (["mm", "w", "x"], ["relu", "w", "x"])
        if tb:  # seeds/000 Section 3.4: equal cost and size, relu is closer to the backward
            assert sorted(plan.saved_names) == ["relu", "w", "x"]
    # without the ban the cheapest valid set would recompute mm: the ban is what bites here
    assert cut_cost(g, ["x", "w"]) < mincut(g).cost
    assert validity_errors(g, ["x", "w"], banned={}) == []
    assert validity_errors(g, ["x", "w"], banned(g, "aggressive"))


def test_compute_node_feeding_only_the_backward_is_saved_not_recomputed():
    """seeds/000 Section 3.1: when the backward needs mm itself, mm is saved (w, it is
    materialized as a non-fusible op) rather than recomputed."""
    g = Graph([
        inp("x", bytes=8),
        inp("w", bytes=8, role="param"),
        op("mm", "x", "w", category="compute", bytes=W),
        op("sin", "mm", is_output=True),
        tangent(),
        op("cos", "mm"),
        bw("mul", "tangents_1", "cos"),
    ])
    for (mode, tb), plan in plans(g).items():
        assert plan.saved_names == ["mm"]
        assert plan.cost == W
        assert plan.recomputed == [] and plan.moved_to_backward == ["cos"]


def reduction_graph(out_bytes: int) -> Graph:
    """grad_x = tangent * x * sum(x): the backward needs x anyway and s = sum(x)."""
    return Graph([
        inp("x", bytes=4000),
        op("sum", "x", category="reduction", bytes=out_bytes),
        op("mul", "x", "sum", bytes=4000, is_output=True),
        tangent(bytes=4000),
        bw("mul_1", "tangents_1", "x", bytes=4000),
        bw("mul_2", "mul_1", "sum", bytes=4000),
    ], name="reduction")


def test_reduction_much_smaller_than_input_is_banned_in_conservative_mode_only():
    """seeds/000 Section 3.4 (and seeds/003): reductions whose output is more than 4x smaller
    than their input are banned from recomputation, in conservative mode. The aggressive mode
    recomputes everything but compute-intensive and random ops (seeds/003)."""
    g = reduction_graph(out_bytes=999)  # 4000 / 999 > 4
    assert "sum" in banned(g, "conservative")
    assert "sum" not in banned(g, "aggressive")
    cons = mincut(g, mode="conservative")
    aggr = mincut(g, mode="aggressive")
    assert sorted(cons.saved_names) == ["sum", "x"] and cons.cost == 4000 + 2 * 999
    assert aggr.saved_names == ["x"] and aggr.cost == 4000
    assert aggr.recomputed == ["sum"] and "sum" not in cons.recomputed


def test_reduction_exactly_4x_smaller_is_not_banned():
    """seeds/000 Section 3.4 bans reductions whose output is *more than* 4x smaller; at exactly
    4x (4000 -> 1000 bytes) the reduction may be recomputed in both modes."""
    g = reduction_graph(out_bytes=1000)
    for mode in MODES:
        assert "sum" not in banned(g, mode)
        plan = mincut(g, mode=mode)
        assert plan.saved_names == ["x"] and plan.recomputed == ["sum"]


def test_reduction_ratio_counts_all_inputs():
    """The 4x rule compares the reduction's output with its inputs (seeds/000 Section 3.4; the
    ratio rule in seeds/003): two 4000-byte inputs and a 1999-byte output is > 4x smaller."""
    g = Graph([
        inp("x", bytes=4000), inp("y", bytes=4000),
        op("dot", "x", "y", category="reduction", bytes=1999),
        tangent(bytes=1999),
        bw("g", "tangents_1", "dot", bytes=4000),
    ])
    assert "dot" in banned(g, "conservative")
    g2 = Graph([n if n.name != "dot" else n.replace(bytes=2000) for n in g.nodes])
    assert "dot" not in banned(g2, "conservative")


# -- Algorithm 2: materialized nodes get capacity w (seeds/000 Section 3.3) ------------------


def nonfusible_user_graph(user_category: str) -> Graph:
    """p = pointwise(x) read by `user` (forward) and by the backward; the backward needs p."""
    return Graph([
        inp("x", bytes=100),
        op("p", "x", bytes=60),
        op("user", "p", category=user_category, bytes=100, is_output=True),
        tangent(bytes=100),
        bw("grad", "tangents_1", "p", bytes=100),
    ])


def test_node_with_non_fusible_user_has_capacity_w():
    """seeds/000 Algorithm 2: a node is materialized when it or any of its users is not fusible;
    it then costs w (one read), not 2w. p (60 bytes) has a non-fusible user ('other'), so saving
    p costs 60 < saving x (100): the plan saves p. With a fusible user instead, p costs 120 and
    the plan saves x (100)."""
    g = nonfusible_user_graph("other")
    for mode in MODES:
        a = analyse(g, mode)
        i = g.index("p")
        assert a.materialized[i] and a.capacity[i] == 60
        assert cut_cost(g, ["p"], mode) == 60
        plan = mincut(g, mode=mode)
        assert plan.saved_names == ["p"] and plan.cost == 60
    g2 = nonfusible_user_graph("pointwise")
    for mode in MODES:
        a = analyse(g2, mode)
        i = g2.index("p")
        assert not a.materialized[i] and a.capacity[i] == 120
        plan = mincut(g2, mode=mode)
        assert plan.saved_names == ["x"] and plan.cost == 100


@pytest.mark.parametrize("category", ["compute", "other", "random"])
def test_non_fusible_node_itself_has_capacity_w(category):
    """seeds/000 Algorithm 2 line 4: a node that is itself not fusible is materialized (w)."""
    g = Graph([inp("x", bytes=100), op("n", "x", category=category, bytes=60),
               tangent(bytes=100), bw("grad", "tangents_1", "n", bytes=100)])
    a = analyse(g, "aggressive")
    assert a.materialized[g.index("n")] and a.capacity[g.index("n")] == 60


def test_forward_output_has_capacity_w():
    """seeds/000 Section 3.3: outputs of the forward pass are materialized anyway (w)."""
    g = Graph([inp("x", bytes=100), op("p", "x", bytes=60, is_output=True),
               tangent(bytes=100), bw("grad", "tangents_1", "p", bytes=100)])
    assert analyse(g).capacity[g.index("p")] == 60
    assert mincut(g).saved_names == ["p"]
    g2 = Graph([n.replace(is_output=False) if n.name == "p" else n for n in g.nodes])
    assert analyse(g2).capacity[g2.index("p")] == 120
    assert mincut(g2).saved_names == ["x"]


def test_backward_user_that_cannot_fuse_bans_recomputation_in_conservative_mode():
    """seeds/000 Section 3.1 assumption 2 / Lemma 3.1: a node not fusible with one of its users
    in the backward pass must be materialized there anyway, so conservative mode bans its
    recomputation; aggressive mode may still recompute it."""
    g = Graph([
        inp("x", bytes=100),
        op("p", "x", bytes=80),
        op("q", "p", bytes=100, is_output=True),
        tangent(bytes=100),
        bw("sort", "tangents_1", "p", category="other", bytes=100),
    ])
    assert "p" in banned(g, "conservative")
    assert "p" not in banned(g, "aggressive")
    assert mincut(g, mode="conservative").saved_names == ["p"]  # w = 80: materialized
    assert mincut(g, mode="aggressive").saved_names == ["p"]  # 80 < 100 anyway
    assert mincut(g, mode="aggressive").cost == 80


# -- tie-break: seeds/000 Section 3.4 ------------------------------------------------------


def chain_graph(sizes: dict[str, int]) -> Graph:
    """x -> A -> B (-> C ...): pointwise chain, only the last node is needed by the backward."""
    names = list(sizes)
    nodes = [inp("x", bytes=100)]
    prev = "x"
    for name in names:
        nodes.append(op(name, prev, bytes=sizes[name]))
        prev = name
    nodes += [op("out", prev, bytes=100, is_output=True), tangent(bytes=100),
              bw("grad", "tangents_1", prev, bytes=100)]
    return Graph(nodes, name="chain")


def test_tie_break_saves_the_node_closer_to_the_backward():
    """seeds/000 Section 3.4: "If node A and B are the same sizes, we can compute B from A, but
    we only need node B, there's no reason to save A". Saving A or B costs the same 2w; with the
    tie-break the plan saves B, without it either may be chosen at the same cost."""
    g = chain_graph({"A": 40, "B": 40})
    for mode in MODES:
        plan = mincut(g, mode=mode, tie_break=True)
        assert plan.saved_names == ["B"] and plan.cost == 80
        plain = mincut(g, mode=mode, tie_break=False)
        assert plain.saved_names in (["A"], ["B"]) and plain.cost == 80


def test_tie_break_on_a_longer_chain():
    """seeds/000 Section 3.4 with three equal candidates A -> B -> C: the tie-break picks C."""
    g = chain_graph({"A": 40, "B": 40, "C": 40})
    for mode in MODES:
        assert mincut(g, mode=mode).saved_names == ["C"]


def test_tie_break_never_pays_more():
    """seeds/000 Section 3.4: the re-weighting is "primarily a tie-break": when B is one byte
    larger than A, the plan saves the cheaper A, even with the tie-break on."""
    g = chain_graph({"A": 40, "B": 41})
    for mode in MODES:
        for tb in (True, False):
            plan = mincut(g, mode=mode, tie_break=tb)
            assert plan.saved_names == ["A"] and plan.cost == 80


def test_random_op_flagged_must_recompute_is_still_never_recomputed():
    """Random ops are never recomputed, even when a flag (e.g. a tuple-valued output) says
    the value itself cannot be saved: the backward must then use a saved downstream value."""
    from remat.plans.saved_set import backward_work

    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=400, category="input"),
        Node("drop", "native_dropout", ("x",), bytes=500, category="random", must_recompute=True),
        Node("mask", "getitem", ("drop",), bytes=100, category="view"),
        Node("y", "mul", ("x", "mask"), bytes=400, category="pointwise", is_output=True),
        Node("t", "placeholder", (), role="tangent", bytes=400, category="input"),
        Node("gx", "mul", ("t", "mask"), role="backward", bytes=400, category="pointwise"),
    ])
    for mode in ("conservative", "aggressive"):
        plan = mincut(g, mode=mode)
        assert "drop" in plan.banned
        assert "drop" not in backward_work(g, plan.saved_names).computed
        assert plan.saved_names == ["mask"]


def test_random_op_that_cannot_be_saved_nor_recomputed_is_a_plan_error():
    """If the backward reads a random value that may not be saved, no valid plan exists:
    remat raises PlanError naming it (inside torch.compile: the fallback)."""
    from remat.errors import PlanError

    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=400, category="input"),
        Node("r", "rand_like", ("x",), bytes=400, category="random", must_recompute=True),
        Node("y", "mul", ("x", "r"), bytes=400, category="pointwise", is_output=True),
        Node("t", "placeholder", (), role="tangent", bytes=400, category="input"),
        Node("gx", "mul", ("t", "r"), role="backward", bytes=400, category="pointwise"),
    ])
    with pytest.raises(PlanError, match="r"):
        mincut(g)


def test_unsaveable_compute_op_is_still_banned():
    """A tuple-valued compute op (e.g. attention returning (out, logsumexp)) cannot be saved
    itself, but must not be recomputed either: its items are saved instead."""
    g = Graph([
        Node("q", "placeholder", (), role="input", bytes=400, category="input"),
        Node("attn", "sdpa", ("q",), bytes=800, category="compute", can_save=False),
        Node("out", "getitem", ("attn",), bytes=400, category="view"),
        Node("lse", "getitem", ("attn",), bytes=40, category="view"),
        Node("y", "cos", ("out",), bytes=400, category="pointwise", is_output=True),
        Node("t", "placeholder", (), role="tangent", bytes=400, category="input"),
        Node("gq", "attn_bw", ("t", "q", "out", "lse"), role="backward", bytes=400, category="compute"),
    ])
    for mode in ("conservative", "aggressive"):
        plan = mincut(g, mode=mode)
        assert "attn" in plan.banned
        assert "attn" not in plan.recomputed
        assert sorted(plan.saved_names) == ["lse", "out", "q"]
