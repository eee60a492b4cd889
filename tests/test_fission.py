"""Fission as a graph transform (torch-free): legality, the split graph, the F-Tree and the
coordinated search (seeds/004 Sections 4-6)."""

import pytest

from remat.errors import PlanError
from remat.graph.dims import dim_graph
from remat.graph.fission import SUM, Fission, part_name, slice_name
from remat.graph.graph import Graph, Node
from remat.plans.budget import reference_schedule
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.transforms.fission import apply_fissions, fission, illegal
from remat.solvers.magis.ftree import FTree, divisors, ftree, mutations

B, H, W = 12, 256, 8  # batch, hidden width, output width


def _mm(name, a, b, shape, role="forward"):
    return Node(name, "mm.default", (a, b), role=role, bytes=4 * shape[0] * shape[1],
                flops=2.0 * shape[0] * shape[1] * 64, category="compute", shape=shape, dtype="float32",
                meta={"dims": [[a, 0, 0], [a, 1, -1], [b, 0, -1], [b, 1, 1]]})


def _pw(name, op, ins, shape, role="forward"):
    return Node(name, op, ins, role=role, bytes=4 * shape[0] * shape[1], flops=float(shape[0] * shape[1]),
                category="pointwise", shape=shape, dtype="float32",
                meta={"dims": [[i, d, d] for i in dict.fromkeys(ins) for d in range(2)]})


def mlp_graph(batch_norm: bool = False) -> Graph:
    """x[B,64] @ w1[64,H] -> relu -> (a wide pointwise chain) -> @ w2[H,W] -> sum; backward of
    the second matmul: its weight gradient sums over the batch."""
    nodes = [
        Node("x", "placeholder", (), role="input", bytes=4 * B * 64, category="input", shape=(B, 64),
             dtype="float32"),
        Node("w1", "placeholder", (), role="param", bytes=4 * 64 * H, category="input", shape=(64, H),
             dtype="float32"),
        Node("w2", "placeholder", (), role="param", bytes=4 * H * W, category="input", shape=(H, W),
             dtype="float32"),
        _mm("a", "x", "w1", (B, H)),
        _pw("b", "relu.default", ("a",), (B, H)),
        _pw("c", "exp.default", ("b",), (B, H)),
        _pw("d", "mul.Tensor", ("b", "c"), (B, H)),
        _mm("y", "d", "w2", (B, W)),
        Node("loss", "sum.default", ("y",), role="forward", bytes=4, category="reduction", shape=(),
             dtype="float32", is_output=True, meta={"dims": [["y", 0, -1], ["y", 1, -2]]}),
        Node("t", "placeholder", (), role="tangent", bytes=4 * B * W, category="input", shape=(B, W),
             dtype="float32"),
        Node("dT", "t.default", ("d",), role="forward", bytes=4 * B * H, category="view", shape=(H, B),
             dtype="float32", meta={"alias_of": "d", "dims": [["d", 0, 1], ["d", 1, 0]]}),
        Node("gw2", "mm.default", ("dT", "t"), role="backward", bytes=4 * H * W, category="compute",
             shape=(H, W), dtype="float32", backward_output=True, is_output=True,
             flops=2.0 * B * H * W, meta={"dims": [["dT", 0, 0], ["dT", 1, -1], ["t", 0, -1], ["t", 1, 1]]}),
    ]
    if batch_norm:
        nodes[4] = Node("b", "native_batch_norm.default", ("a",), role="forward", bytes=4 * B * H,
                        category="other", shape=(B, H), dtype="float32",
                        meta={"dims": [["a", 1, 1]]})
    return Graph(nodes, name="mlp")


def _batch(g: Graph):
    comp = dim_graph(g).component_of("a", 0)
    assert comp is not None
    return comp


def test_the_batch_links_the_forward_and_is_summed_in_the_weight_gradient():
    g = mlp_graph()
    comp = _batch(g)
    assert comp.length == B
    assert {v: comp.axis[v] for v in ("x", "a", "b", "c", "d", "y")} == dict.fromkeys(
        ("x", "a", "b", "c", "d", "y"), 0)
    assert comp.axis["dT"] == 1 and comp.axis["gw2"] == -1  # the weight gradient sums over it
    assert "w1" not in comp.axis  # weights do not carry the batch


def test_a_legal_fission_and_the_reasons_others_are_not():
    g = mlp_graph()
    comp = _batch(g)
    f = fission(g, comp, ["a", "b", "c", "d"], 3)
    assert illegal(g, f) is None
    assert f.sliced == {"x": 0} and f.outputs == {"d": 0}  # w1 is shared; d is read outside
    assert "do not divide" in illegal(g, f.with_n(5))
    # {b, d} without c: c is computed from b and feeds d
    assert "not convex" in illegal(g, fission(g, comp, ["b", "d"], 2))
    assert "not connected" in illegal(g, fission(g, comp, ["a", "y"], 2))
    # forward and backward nodes may share a region: d's parts feed the weight gradient's
    assert illegal(g, fission(g, comp, ["d", "dT", "gw2"], 2)) is None
    bn = mlp_graph(batch_norm=True)
    f_bn = Fission(("a", "b"), {"a": 0, "b": 0}, 2, B, {"x": 0}, {"b": 0})
    assert "batch norm" in illegal(bn, f_bn)


def test_the_split_graph_has_parts_slices_and_merges_at_a_lower_peak():
    g = mlp_graph()
    f = fission(g, _batch(g), ["a", "b", "c", "d"], 4)
    gf = apply_fissions(g, [f])
    for k in range(4):
        assert gf[part_name("c", k)].bytes == g["c"].bytes // 4
        assert gf[part_name("a", k)].inputs == (slice_name("x", 0, k), "w1")
        assert gf[part_name("a", k)].shape == (B // 4, H)
    assert "c" not in gf and gf["d"].op == "cat.default" and gf["d"].bytes == g["d"].bytes
    assert gf["y"].inputs == ("d", "w2")  # readers outside keep reading the merged value
    # parts run one after another: part 0's chain before part 1 starts
    order = [n.name for n in gf.nodes]
    assert order.index(part_name("d", 0)) < order.index(part_name("a", 1))
    assert simulate(reference_schedule(gf)).peak_bytes < simulate(reference_schedule(g)).peak_bytes


def test_a_reduce_axis_output_is_the_sum_of_the_parts():
    g = mlp_graph()
    f = fission(g, _batch(g), ["dT", "gw2"], 3)
    assert f.outputs == {"gw2": SUM} and illegal(g, f) is None
    gf = apply_fissions(g, [f])
    assert gf["gw2"].op == "add.Tensor" and gf["gw2"].bytes == g["gw2"].bytes
    assert gf["gw2__sum1"].inputs == (part_name("gw2", 0), part_name("gw2", 1))
    assert gf["gw2"].inputs == ("gw2__sum1", part_name("gw2", 2))
    assert gf[part_name("gw2", 0)].bytes == g["gw2"].bytes  # a partial sum is whole-sized
    assert gf["gw2"].backward_output


def test_overlapping_regions_are_refused():
    g = mlp_graph()
    comp = _batch(g)
    with pytest.raises(PlanError, match="two fission regions"):
        apply_fissions(g, [fission(g, comp, ["a", "b"], 2), fission(g, comp, ["b", "c"], 2, index=1)])


def test_the_ftree_rules_enable_change_and_disable():
    g = mlp_graph()
    hot = {"a", "b", "c", "d"}
    tree = ftree(g, hot)
    assert len(tree) >= 1
    ns = (1,) * len(tree)
    rules = dict(mutations(tree, ns))
    enabled = [r for r in rules if r.startswith("enable")]
    assert enabled
    on = rules[enabled[0]]
    i = next(k for k, n in enumerate(on) if n > 1)
    assert on[i] == divisors(tree.candidates[i].length)[0] == 2
    after = dict(mutations(tree, on))
    assert any(r.startswith("disable") and s == ns for r, s in after.items())
    assert any(r.startswith("more parts") and s[i] == 3 for r, s in after.items())


def test_the_search_is_deterministic_and_its_plan_replays_within_the_budget():
    g = mlp_graph()
    ref = simulate(reference_schedule(g))
    budget = int(ref.constant_bytes + 0.7 * (ref.peak_bytes - ref.constant_bytes))
    plans = [solve(g, "magis", budget=budget, time_limit=None, iterations=30) for _ in range(2)]
    a, b = plans
    assert a.fissions == b.fissions
    assert list(a.statements) == list(b.statements)
    assert a.feasible and a.peak_bytes <= budget
    assert simulate(a.schedule()).peak_bytes == a.peak_bytes  # replays on its own graph
    assert a.fissions, "this graph needs fission to fit 0.7 of its peak"


def test_a_plan_with_fissions_goes_through_its_json_and_back():
    """The plan's JSON carries its fissions; read back against the graph it was made for, split
    again by the caller (the plan does not import the transforms), it replays to the same peak;
    against the graph unsplit it is refused, saying so."""
    import json

    from remat.plans.plan import Plan

    g = mlp_graph()
    ref = simulate(reference_schedule(g))
    budget = int(ref.constant_bytes + 0.7 * (ref.peak_bytes - ref.constant_bytes))
    p = solve(g, "magis", budget=budget, time_limit=None, iterations=30)
    d = json.loads(p.to_json())
    assert d["fissions"] == [f.to_dict() for f in p.fissions] and d["fissions"] and "fissions" not in d["details"]
    with pytest.raises(PlanError, match="fissions applied"):
        Plan.from_dict(d, graph=g)
    q = Plan.from_dict(d, graph=apply_fissions(g, Plan.from_dict(d).fissions))
    assert q.fissions == p.fissions and q.graph.meta["fissions"] == d["fissions"]
    assert q.to_dict() == d
    assert simulate(q.schedule()).peak_bytes == p.peak_bytes
    assert "split: " in q.summary() and f" in {q.fissions[0].n} " in q.summary()
