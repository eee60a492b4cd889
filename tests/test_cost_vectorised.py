"""The per-node prices and tables a cold solve builds, computed by array operations (issue 39),
against the per-node loops they replace, written out here as their scalar definitions: on
random joint graphs with FLOPs, dtypes, profiled costs, convolutions, tuples and their items,
views of other values' storage and capture's marks, every float and integer must come out the
same (``==``, not approximately). Torch-free."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat.cost import pricing
from remat.cost.model import (EAGER_TEMPORARIES, ITEMSIZE, PROFILES, CostModel, DeviceProfile, constant_bytes,
                              curve_rate, elements, kernel_kind, marked, shaped, storage, CPU_CONV_SHAPE)
from remat.graph.graph import Graph
from remat.graph.synthetic import synthetic_joint_graph
from remat.plans.saved_set import backward_work
from remat.plans.schedule import schedule_from_saved_set
from remat.plans.simulator.fusion import tuple_items
from remat.plans.simulator.layout import layout_sizes
from remat.plans.simulator.tuples import items_of, root_tangents, tuple_workspace
from remat.solvers.mincut.mincut import (FAR, _distance_sweep, _graph_facts, _read_by_backward,
                                         distances_to_backward, mincut)
from strategies import joint_graphs

# -- the scalar definitions (the loops over the nodes these arrays replace) -------------------


def scalar_arithmetic(g: Graph, dev: DeviceProfile) -> list[float]:
    out = [n.flops / dev.rate(n.flops, kernel_kind(n)) if n.flops else 0.0 for n in g.nodes]
    if dev.element_seconds:
        for i, n in enumerate(g.nodes):
            out[i] += dev.element_seconds * elements(g, n)
    return out


def scalar_op_costs(g: Graph, dev: DeviceProfile) -> list[float]:
    arith = scalar_arithmetic(g, dev)
    out = []
    for i, n in enumerate(g.nodes):
        if n.is_primal or n.role == "tangent" and not n.inputs:
            out.append(0.0 if n.cost is None else float(n.cost))
        elif n.cost is not None:
            out.append(float(n.cost))
        elif n.category == "view":
            out.append(arith[i] + dev.view_fixed)
        else:
            moved = int(n.bytes) + sum(int(g[v].bytes) for v in dict.fromkeys(n.inputs))
            out.append(max(arith[i], moved / dev.moved_rate(moved) if moved else 0.0) + dev.op_fixed)
    return out


def scalar_workspace(g: Graph, cm: CostModel) -> list[int]:
    f = cm.device.conv_workspace
    out = [int(n.bytes) if n.meta and n.meta.get("container") and not n.meta.get("alias_of")
           else 0 for n in g.nodes]
    for i, n in enumerate(g.nodes):
        if n.meta and "workspace" in n.meta:
            out[i] += int(n.meta["workspace"])
        elif not cm.fused_memory and n.op in EAGER_TEMPORARIES:
            out[i] += EAGER_TEMPORARIES[n.op](g, n)
        elif f and n.op.startswith("convolution"):
            backward = n.op.startswith("convolution_backward")
            weight = g[n.inputs[-1 if backward else 1]].bytes if len(n.inputs) >= 2 else 0
            acts = sum(g[v].bytes for v in n.inputs[:2]) if backward else n.bytes
            out[i] += int(f * max(acts, weight))
    return out


def scalar_storage(g: Graph) -> tuple[list[int], list[int]]:
    owner = list(range(len(g)))
    nbytes = [int(n.bytes) for n in g.nodes]
    for i, n in enumerate(g.nodes):
        base = n.meta.get("alias_of") if n.meta else None
        if base is not None and base in g and not n.meta.get("copied_view"):
            owner[i] = owner[g.index(base)]
            nbytes[i] = 0
        elif n.meta and n.meta.get("container"):
            nbytes[i] = 0
    return owner, nbytes


def scalar_input_indices(g: Graph) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g.index(v) for v in dict.fromkeys(n.inputs)) for n in g.nodes)


def scalar_items_of(g: Graph) -> list[tuple[int, ...]]:
    ins, owner = scalar_input_indices(g), scalar_storage(g)[0]
    container = [bool(n.meta and n.meta.get("container")) for n in g.nodes]
    item = [len(ins[i]) == 1 and container[ins[i][0]] and owner[i] == i for i in range(len(g))]
    out: list[list[int]] = [[] for _ in range(len(g))]
    for j, is_item in enumerate(item):
        if is_item:
            out[ins[j][0]].append(j)
    return [tuple(x) for x in out]


def scalar_tuple_workspace(g: Graph, cm: CostModel) -> list[int]:
    w = scalar_workspace(g, cm)
    sizes = scalar_storage(g)[1]
    for c, its in enumerate(scalar_items_of(g)):
        if its:
            w[c] = max(0, w[c] - min(sum(sizes[j] for j in its), int(g.nodes[c].bytes)))
    return w


def scalar_distances(g: Graph, required: list[bool]) -> list[int]:
    """seeds/000 Section 3.4's distance to the backward, by its recursion on each node."""
    memo: dict[int, int] = {}
    users = g.user_indices

    def dist(i: int) -> int:
        if not required[i]:
            return 0
        if i not in memo:
            memo[i] = min(min((dist(u) for u in users[i]), default=FAR) + 1, FAR)
        return memo[i]
    return [dist(i) for i in reversed(range(len(g)))][::-1]


# -- random graphs with everything the prices read ---------------------------------------------

FLOPS = st.one_of(st.sampled_from([0.0, 1.0, 7, 8.2e3, 6.6e4, 1e5, 5.2e5, 4.2e6, 7.5e7, 6e8, 1e12]),
                  st.floats(0, 1e13, allow_nan=False, allow_infinity=False), st.integers(0, 10**9))
DTYPES = (None, "float32", "bfloat16", "float64", "int8", "bool", "complex64", "fp8?")
COMPUTE_OPS = ("mm.default", "bmm.default", "convolution.default", "convolution_backward.default")
OTHER_OPS = ("fma.default", "_unsafe_masked_index_put_accumulate.default", "cat.default", "other")


@st.composite
def priced_graphs(draw) -> Graph:
    """A joint graph (:func:`strategies.joint_graphs`) whose nodes carry FLOPs, dtypes, op names,
    profiled costs and meta marks: tuples (``container``) read by items, views of other values'
    storage (``alias_of``, an unknown base included), copies, workspaces, layout copies."""
    max_bytes = draw(st.sampled_from([24, 2**20, 3 * 10**8, 2**49]))  # 2**49: object byte arrays
    g = draw(joint_graphs(max_forward=10, max_backward=6, max_bytes=max_bytes))
    profiled = draw(st.integers(0, 3)) == 0
    names = [n.name for n in g.nodes]
    containers = set(draw(st.lists(st.sampled_from(names), max_size=3)))
    nodes = []
    for i, n in enumerate(g.nodes):
        change: dict = {"flops": draw(FLOPS), "dtype": draw(st.sampled_from(DTYPES))}
        if n.category == "compute":
            change["op"] = draw(st.sampled_from(COMPUTE_OPS))
        elif n.category == "other" and draw(st.booleans()):
            change["op"] = draw(st.sampled_from(OTHER_OPS))
        if profiled and draw(st.booleans()):
            change["cost"] = draw(st.one_of(st.floats(0, 1.0), st.integers(0, 5)))
        if n.role == "tangent" and draw(st.booleans()):
            change["shape"] = draw(st.sampled_from([(), (2,), (3, 4)]))
        meta = {}
        if n.name in containers:
            meta["container"] = True
        if n.inputs and draw(st.integers(0, 2)) == 0:
            meta["alias_of"] = draw(st.sampled_from(list(n.inputs) + ["not_a_node"]))
        for key in ("copied_view", "inductor_kernel", "unrolled", "scatters_into_copy"):
            if draw(st.integers(0, 5)) == 0:
                meta[key] = True
        if draw(st.integers(0, 5)) == 0:
            meta["workspace"] = draw(st.integers(0, 1000))
        if n.is_primal and draw(st.integers(0, 5)) == 0:
            meta["layout_copy"] = draw(st.integers(1, 100))
        nodes.append(n.replace(meta=meta, **change))
    return Graph(nodes, name="priced")


PROFILE_CHOICES = (
    PROFILES["cpu"], PROFILES["h100"],
    DeviceProfile("no-curves", 1e12, 1e11, 1e-6),
    DeviceProfile("everything", 50e9, 8e9, 2e-6, conv_workspace=1.5, op_seconds=3e-6, view_seconds=1e-7,
                  matmul_curve=((1e3, 1e9), (1e5, 1e11), (1e7, 4e11)), conv_curve=shaped(50e9, CPU_CONV_SHAPE),
                  bandwidth_curve=((100, 1e9), (1e4, 2e10), (1e6, 5e9)), element_seconds=3e-10),
)


def _fresh(g: Graph) -> Graph:
    return Graph(g.nodes, name=g.name, meta=g.meta)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=priced_graphs(), profile=st.sampled_from(PROFILE_CHOICES), fused=st.booleans())
def test_prices_equal_their_scalar_definitions(g, profile, fused):
    cm = CostModel(profile, fused_memory=fused)
    assert cm.arithmetic(g) == scalar_arithmetic(g, profile)
    assert cm.op_costs(g) == scalar_op_costs(g, profile)
    assert cm.op_cost_array(g).tolist() == scalar_op_costs(g, profile)
    assert all(type(x) is float for x in cm.op_costs(g))
    assert cm.workspace(g) == scalar_workspace(g, cm)
    assert cm.uses_profiled_costs(g) == any(n.cost is not None for n in g.nodes if not n.is_primal)
    assert tuple_workspace(g, cm) == scalar_tuple_workspace(g, cm)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=priced_graphs())
def test_storage_items_and_marks_equal_their_scalar_definitions(g):
    owner, nbytes = scalar_storage(g)
    assert storage(g) == (owner, nbytes)
    assert all(type(x) is int for x in storage(g)[1])
    assert constant_bytes(g) == sum(nbytes[i] for i, n in enumerate(g.nodes) if n.is_primal and owner[i] == i)
    assert g.input_indices == scalar_input_indices(_fresh(g))
    assert items_of(g) == scalar_items_of(g)
    ins = g.input_indices
    container = [bool(n.meta and n.meta.get("container")) for n in g.nodes]
    assert tuple_items(g) == [len(ins[i]) == 1 and container[ins[i][0]] and owner[i] == i for i in range(len(g))]
    assert root_tangents(g) == [n.role == "tangent" and n.shape is not None and len(n.shape) == 0
                                for n in g.nodes]
    for key in ("inductor_kernel", "unrolled", "copied_view", "scatters_into_copy"):
        assert marked(g, key).tolist() == [bool(n.meta and n.meta.get(key)) for n in g.nodes]
    assert layout_sizes(g) == {i: int(n.meta["layout_copy"]) for i, n in enumerate(g.nodes)
                               if n.meta and n.meta.get("layout_copy")}
    a = g._arrays
    assert a.flops.tolist() == [float(n.flops) for n in g.nodes]
    assert [None if math.isnan(c) else c for c in a.cost.tolist()] == \
        [None if n.cost is None else float(n.cost) for n in g.nodes]
    assert a.ops == [n.op for n in g.nodes] and a.names == [n.name for n in g.nodes]
    assert a.meta_nodes == [i for i, n in enumerate(g.nodes) if n.meta]


curves = st.lists(st.tuples(st.floats(1.0, 1e12), st.floats(1e3, 1e15)), min_size=1, max_size=6).map(
    lambda ps: tuple(sorted({f: r for f, r in ps}.items())))


@settings(max_examples=300, deadline=None)
@given(curve=curves, xs=st.lists(st.one_of(st.floats(0, 1e13), st.integers(0, 10**12)), max_size=20),
       at_points=st.booleans())
def test_curve_rates_equal_curve_rate(curve, xs, at_points):
    if at_points:  # the curve's own points and the midpoints in log space
        xs = xs + [f for f, _ in curve] + [math.sqrt(a[0] * b[0]) for a, b in zip(curve, curve[1:])]
    got = pricing.curve_rates(curve, np.array(xs, dtype=np.float64)).tolist()
    assert got == [curve_rate(curve, float(x)) for x in xs]


def test_element_counts_pick_the_first_largest_input():
    """A reduction's elements are its largest input's; of two inputs of one size, the first
    one's dtype counts, as ``max`` picks it."""
    from remat.graph.graph import Node
    g = Graph([
        Node("a", "placeholder", role="input", bytes=64, category="input", dtype="float64"),
        Node("b", "placeholder", role="input", bytes=64, category="input", dtype="int8"),
        Node("r", "sum", ("b", "a", "b"), role="forward", bytes=4, category="reduction"),
        Node("p", "mul", ("r",), role="forward", bytes=40, category="pointwise", dtype="bfloat16"),
    ])
    assert pricing.element_counts(g).tolist() == [elements(g, n) for n in g.nodes] == [0.0, 0.0, 64.0, 20.0]
    assert ITEMSIZE["int8"] == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=joint_graphs(max_forward=12, max_backward=6), levels=st.sampled_from([0, 1, 2, 256]))
def test_distances_to_the_backward_equal_the_recursion(g, levels):
    required = _graph_facts(g).required
    want = scalar_distances(g, required)
    req = np.array(required, dtype=bool)
    assert distances_to_backward(g, req, max_levels=levels).tolist() == want
    assert _distance_sweep(g, req).tolist() == want


def test_distances_on_a_long_chain_take_the_sweep():
    """A forward chain longer than ``max_levels`` distances: the search hands over to the sweep
    and gives the recursion's answer."""
    g = synthetic_joint_graph(2000, seed=5)
    required = _graph_facts(g).required
    req = np.array(required, dtype=bool)
    want = scalar_distances(g, required)
    assert distances_to_backward(g, req).tolist() == want
    assert distances_to_backward(g, req, max_levels=1).tolist() == want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=joint_graphs(max_forward=12, max_backward=6), seed=st.integers(0, 2**16))
def test_read_by_backward_equals_its_set_definition(g, seed):
    rng = np.random.default_rng(seed)
    saved = [n.name for n in g.nodes if n.role == "forward" and rng.random() < 0.5]
    work = backward_work(g, saved)
    readers = [i for i, n in enumerate(g.nodes) if not n.is_forward or n.backward_output] + \
        [g.index(c) for c in work.computed]
    read = {j for i in readers for j in g.input_indices[i]}
    want = [s for s in saved if g.index(s) in read or g[s].backward_output]
    assert _read_by_backward(g, saved) == want


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_a_cold_graph_plans_as_a_warm_one(mode):
    """The plan and its judged peak and time of a fresh graph equal those of a graph whose
    tables were all built before (the 50k benchmark's cold and warm solves, at 3,000 nodes)."""
    from remat.solvers import solve
    g = synthetic_joint_graph(3000, seed=2)
    solve(g, f"mincut-{mode}")
    warm = solve(g, f"mincut-{mode}")
    cold = solve(_fresh(g), f"mincut-{mode}")
    assert cold.saved_names == warm.saved_names and cold.cost == warm.cost
    assert cold.peak_bytes == warm.peak_bytes and cold.predicted_seconds == warm.predicted_seconds
    assert mincut(_fresh(g), mode).saved_names == warm.saved_names
    s = schedule_from_saved_set(_fresh(g), warm.saved_names)
    assert [(st.op, st.node) for st in s.statements] == [(st.op, st.node) for st in warm.schedule().statements]
