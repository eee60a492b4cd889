"""Per-kernel pricing (issue 31, item 4): a kernel's fixed cost and the rate of small matmuls
and convolutions, in the additive (op by op) and fusion-aware views, and their calibration on
this machine. A region split into n parts pays for its n kernels through the model itself, with
no rule of fission's own."""

import dataclasses
import math

import pytest

from remat.cost.model import PROFILES, CostModel, DeviceProfile, curve_rate, default_cost_model, kernel_kind
from remat.cost.transfer import Link
from remat.graph.dims import dim_graph
from remat.graph.graph import Graph, Node
from remat.plans.budget import reference_schedule
from remat.plans.schedule import schedule_from_saved_set
from remat.plans.simulator import simulate
from remat.plans.simulator.replay import replay
from remat.plans.simulator.state import Replay
from remat.plans.simulator.vectorised import vectorised
from remat.transforms.fission import apply_fissions, fission

B, H = 64, 32
L = 1e-5  # the fixed cost of a kernel in the profiles below
FREE = dict(peak_flops=1e30, bandwidth=1e30)  # arithmetic and traffic take no time


def _mm(name, a, b, shape, k):
    return Node(name, "mm.default", (a, b), role="forward", bytes=4 * shape[0] * shape[1],
                flops=2.0 * shape[0] * shape[1] * k, category="compute", shape=shape, dtype="float32",
                meta={"dims": [[a, 0, 0], [a, 1, -1], [b, 0, -1], [b, 1, 1]]})


def mlp() -> Graph:
    """x[B,16] @ w1[16,H] -> relu -> @ w2[H,H] -> sum (a forward region of three kernels)."""
    return Graph([
        Node("x", "placeholder", (), role="input", bytes=4 * B * 16, category="input", shape=(B, 16),
             dtype="float32"),
        Node("w1", "placeholder", (), role="param", bytes=4 * 16 * H, category="input", shape=(16, H),
             dtype="float32"),
        Node("w2", "placeholder", (), role="param", bytes=4 * H * H, category="input", shape=(H, H),
             dtype="float32"),
        _mm("a", "x", "w1", (B, H), 16),
        Node("b", "relu.default", ("a",), role="forward", bytes=4 * B * H, category="pointwise",
             shape=(B, H), dtype="float32", meta={"dims": [["a", 0, 0], ["a", 1, 1]]}),
        _mm("y", "b", "w2", (B, H), H),
        Node("loss", "sum.default", ("y",), role="forward", bytes=4, category="reduction", shape=(),
             dtype="float32", is_output=True, meta={"dims": [["y", 0, -1], ["y", 1, -2]]}),
    ], name="mlp")


REGION = ("a", "b", "y")


def split(g: Graph, n: int) -> Graph:
    comp = dim_graph(g).component_of("a", 0)
    return apply_fissions(g, [fission(g, comp, REGION, n)])


def seconds(g: Graph, cm: CostModel) -> float:
    return simulate(reference_schedule(g), cm, timeline=False).predicted_seconds


@pytest.mark.parametrize("n", [2, 4, 8])
def test_n_parts_cost_n_minus_one_more_kernels_op_by_op(n):
    """Op by op every op is a kernel: the split region runs (n - 1) more of each of its three
    ops, and its output is concatenated once (the slices of x are views, priced apart)."""
    cm = CostModel(DeviceProfile("t", launch_seconds=L, op_seconds=L, view_seconds=0.0, **FREE), per_op=True)
    g, gs = mlp(), split(mlp(), n)
    assert sum(1 for v in gs.nodes if v.meta.get("fission_part")) == n * len(REGION)
    assert seconds(gs, cm) - seconds(g, cm) == pytest.approx(((n - 1) * len(REGION) + 1) * L)


@pytest.mark.parametrize("n", [2, 4])
def test_n_parts_cost_more_kernels_fused_too(n):
    """Under a fusing compiler a kernel is a value written to memory: both matmuls of each part
    and the relu the second one reads are written, so at least (n - 1) x 3 more launches (the
    concatenation and the slices a library call reads add at most n + 1)."""
    cm = CostModel(DeviceProfile("t", launch_seconds=L, **FREE))
    diff = seconds(split(mlp(), n), cm) - seconds(mlp(), cm)
    assert (n - 1) * len(REGION) * L - 1e-12 <= diff <= ((n - 1) * len(REGION) + n + 1) * L + 1e-12


def test_without_a_fixed_cost_or_a_curve_the_parts_cost_what_the_whole_costs():
    """No launch cost and a flat rate: the parts' arithmetic sums to the whole's, so the
    penalty above is the model's per-kernel terms and nothing else."""
    cm = CostModel(DeviceProfile("t", peak_flops=1e9, bandwidth=1e30))
    g, gs = mlp(), split(mlp(), 4)
    whole, parts = cm.arithmetic(g), cm.arithmetic(gs)
    assert sum(parts) == pytest.approx(sum(whole))
    assert seconds(gs, cm) == pytest.approx(seconds(g, cm))


def test_a_small_matmul_reaches_a_lower_rate_and_parts_pay_for_it():
    cpu = PROFILES["cpu"]
    assert cpu.rate(2 * 16 ** 3) < cpu.rate(2 * 64 ** 3) < cpu.rate(2 * 1024 ** 3) == cpu.peak_flops
    assert cpu.rate(2 * 16 ** 3, "conv") == cpu.rate(2 * 16 ** 3)  # no curve of its own: the matmul's
    own = DeviceProfile("t", 1e11, 1e9, matmul_curve=((1e3, 1e9), (1e6, 1e11)), conv_curve=((1e3, 1e8), (1e7, 1e11)))
    assert own.rate(1e5, "conv") < own.rate(1e5)  # a convolution's own curve
    assert cpu.rate(2 * 16 ** 3, "other") == cpu.peak_flops  # pointwise FLOPs: no curve
    for gpu in (PROFILES["h100"], default_cost_model(_on("NVIDIA H100 80GB HBM3")).device):
        assert gpu.rate(2 * 256 ** 3) < 0.1 * gpu.rate(2 * 8192 ** 3)
    # a matmul of 2 x 64 x 32 x 32 FLOPs split in 8 parts: each part at a smaller size's rate
    curve = ((1e3, 1e8), (1e6, 1e10))
    cm = CostModel(DeviceProfile("t", peak_flops=1e10, bandwidth=1e30, matmul_curve=curve))
    g, gs = mlp(), split(mlp(), 8)
    arith = dict(zip((v.name for v in gs.nodes), cm.arithmetic(gs)))
    whole = dict(zip((v.name for v in g.nodes), cm.arithmetic(g)))
    parts = [v for v in gs.nodes if v.meta.get("fission_part", [None])[0] == "y"]
    assert len(parts) == 8 and all(kernel_kind(v) == "matmul" for v in parts)
    assert sum(arith[v.name] for v in parts) > 1.5 * whole["y"]
    assert seconds(gs, cm) > seconds(g, cm)


def _on(name: str) -> Graph:
    g = mlp()
    g.meta.update(device={"type": "cuda", "name": name, "dtype": "bfloat16"}, compiler="inductor")
    return g


def test_curve_interpolates_in_log_space_and_clamps():
    curve = ((1e3, 1e8), (1e5, 1e10), (1e7, 4e10))
    assert curve_rate(curve, 1e2) == 1e8 and curve_rate(curve, 1e9) == 4e10
    assert curve_rate(curve, 1e4) == pytest.approx(1e9)  # halfway in log(flops): the geometric mean
    assert curve_rate(curve, 1e6) == pytest.approx(2e10)
    rates = [curve_rate(curve, 10 ** (k / 4)) for k in range(8, 32)]
    assert rates == sorted(rates)


def test_additive_view_prices_each_op_with_its_fixed_cost_and_views_move_nothing():
    p = DeviceProfile("t", peak_flops=1e9, bandwidth=1e6, launch_seconds=1e-6, op_seconds=L, view_seconds=2e-6)
    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=1000, category="input", shape=(250,), dtype="float32"),
        Node("v", "view.default", ("x",), role="forward", bytes=1000, category="view", shape=(25, 10),
             dtype="float32", meta={"alias_of": "x"}),
        Node("c", "cos.default", ("v",), role="forward", bytes=1000, category="pointwise", shape=(25, 10),
             dtype="float32", is_output=True),
    ])
    costs = CostModel(p).op_costs(g)
    assert costs == pytest.approx([0.0, 2e-6, 2000 / 1e6 + L])
    # op by op, a schedule's time is the sum of its computes' costs; fused, the view is free
    s = schedule_from_saved_set(g, [])
    assert simulate(s, CostModel(p, per_op=True)).predicted_seconds == pytest.approx(2e-6 + 2e-3 + L)


def test_eager_graphs_are_priced_op_by_op_and_inductor_graphs_fused():
    g = mlp()
    assert not default_cost_model(g).per_op
    g.meta["compiler"] = "eager"
    assert default_cost_model(g).per_op and not default_cost_model(g).fused_memory
    g.meta["compiler"] = "inductor"
    cm = default_cost_model(g)
    assert cm.fused_memory and not cm.per_op


@pytest.mark.parametrize("per_op", [False, True])
def test_the_array_path_times_as_the_replay_with_curves(per_op):
    """The simulator's two paths sum the same arithmetic, kernel and op costs in the same order."""
    p = DeviceProfile("t", peak_flops=1e10, bandwidth=1e9, launch_seconds=L, op_seconds=2 * L,
                      matmul_curve=((1e3, 1e8), (1e6, 1e10)), bandwidth_curve=((1e3, 1e11), (1e6, 1e9)))
    cm = CostModel(p, per_op=per_op)
    for g in (mlp(), split(mlp(), 4)):
        s = reference_schedule(g)
        fast = vectorised(s, cm, timeline=True)
        slow = replay(s, Replay(s, cm, Link(float("inf")), timeline=True, kernel_groups=True, copies=False))
        assert fast is not None
        assert dataclasses.asdict(fast) == dataclasses.asdict(slow)


def test_calibration_returns_sane_monotone_numbers():
    from remat.cost.calibrate import cpu_profile

    p = cpu_profile()
    assert p is cpu_profile()  # measured once per process
    assert 1e-8 < p.op_fixed < 1e-3 and 1e-8 < p.view_fixed < 1e-3
    assert p.launch_seconds == p.op_fixed
    for curve, lo in ((p.matmul_curve, 1e6), (p.conv_curve, 1e6)):
        flops = [f for f, _ in curve]
        rates = [r for _, r in curve]
        assert len(curve) >= 4 and flops == sorted(flops) and rates == sorted(rates)
        assert all(lo < r < 1e16 for r in rates)
        assert rates[0] < rates[-1]  # the smallest call is below the largest
    assert p.peak_flops == p.matmul_curve[-1][1]
    moved = [r for _, r in p.bandwidth_curve]
    assert moved == sorted(moved, reverse=True) and all(1e6 < r < 1e14 for r in moved)
    assert 1e6 < p.bandwidth < 1e14
    assert 1e-13 < p.element_seconds < 1e-6
    assert math.isclose(p.rate(p.matmul_curve[0][0]), p.matmul_curve[0][1])


def test_pointwise_elements_cost_their_arithmetic_where_the_profile_says():
    """``element_seconds`` prices a pointwise op's output elements and a reduction's input
    elements (FLOPs the graph does not count); the default profiles leave it at 0."""
    g = mlp()
    p = DeviceProfile("t", peak_flops=1e30, bandwidth=1e30, element_seconds=1e-9)
    arith = dict(zip((v.name for v in g.nodes), CostModel(p).arithmetic(g)))
    assert arith["b"] == pytest.approx(B * H * 1e-9)  # relu: B x H float32 elements
    assert arith["loss"] == pytest.approx(B * H * 1e-9)  # the sum reduces y's B x H
    assert arith["a"] == pytest.approx(0.0, abs=1e-20) and arith["x"] == 0.0
    assert PROFILES["cpu"].element_seconds == 0.0
    assert CostModel(PROFILES["cpu"]).arithmetic(g)[g.index("b")] == 0.0
