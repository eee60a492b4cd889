"""Checkmate's baselines (remat.solvers.baselines): chains, Checkmate's graphs, random DAGs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from remat.graph.graph import Graph, Node
from remat.graph.io import load_graph
from remat.solvers.baselines import BASELINES
from remat.solvers.baselines.policy import (_context, _stage_row, articulation_points,
    candidate_chain, policy_matrix)
from remat.solvers.baselines.revolve import closed_form_steps, revolve_snapshots, revolve_steps
from remat.plans.stages import solve_r

from paths import CHECKMATE_DIR
from strategies import joint_graphs

UNIT = 4


def chain(n: int, reads_output: bool = False) -> Graph:
    """``x -> f1 -> ... -> fn`` (fn the loss) and its backward ``g_n .. g_1``: ``g_i`` reads
    the upstream gradient and the input of step ``i`` (``f_{i-1}``, ``x`` for ``i = 1``), and
    with ``reads_output`` also ``f_i`` (as Checkmate's graphs do). Every value is one unit."""
    nodes = [Node("x", "placeholder", (), role="input", bytes=UNIT, category="input")]
    prev = "x"
    for i in range(1, n + 1):
        nodes.append(Node(f"f{i}", "sin", (prev,), role="forward", bytes=UNIT,
                          category="pointwise", is_output=i == n))
        prev = f"f{i}"
    nodes.append(Node("t", "placeholder", (), role="tangent", bytes=UNIT, category="input"))
    up = "t"
    for i in range(n, 0, -1):
        ins = (up, "x" if i == 1 else f"f{i - 1}") + ((f"f{i}",) if reads_output else ())
        nodes.append(Node(f"g{i}", "mul", ins, role="backward", bytes=UNIT,
                          category="pointwise", is_output=i == 1))
        up = f"g{i}"
    return Graph(nodes, name=f"chain{n}")


def units(r) -> int:
    return r.peak_bytes // UNIT


def curve_peaks(r) -> list[int]:
    return [p["peak_bytes"] for p in r.details.get("curve", [])] or [r.peak_bytes]


def test_registry():
    assert set(BASELINES) == {
        "checkpoint-all", "chen-sqrtn", "chen-sqrtn-ap", "chen-sqrtn-linearized", "chen-greedy",
        "chen-greedy-ap", "chen-greedy-linearized", "griewank"}


# -- chains ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [100, 400])
def test_chain_sqrtn_memory(n):
    g = chain(n)
    everything = BASELINES["checkpoint-all"](g)
    sq = BASELINES["chen-sqrtn"](g)
    assert everything.feasible and sq.feasible
    assert everything.sim.recomputes == 0
    assert units(everything) >= n  # every forward value resident at the start of the backward
    assert sq.details["candidates"] == "ap"  # on a chain every node is an articulation point
    assert abs(len(sq.details["checkpoints"]) - math.sqrt(n)) <= 1
    assert units(sq) <= 3 * math.sqrt(n) + 6  # checkpoints + one segment + a few gradients
    # each segment is recomputed once: fewer than n recomputations in all
    assert 0 < sq.sim.recomputes < n


@pytest.mark.parametrize("reads_output", [False, True])
def test_chain_griewank_binomial(reads_output):
    n = 30
    g = chain(n, reads_output)
    peaks = []
    for s in range(8):
        r = BASELINES["griewank"](g, slots=s)
        assert r.feasible and r.sim.valid
        # the first sweep is the forward pass: REVOLVE's F(n, s) less its n - 1 steps
        predicted = closed_form_steps(n, s + 1) - (n - 1)
        assert predicted == revolve_steps(n, s) - (n - 1)
        if reads_output:
            assert r.sim.recomputes <= predicted
        else:
            assert r.sim.recomputes == predicted
        peaks.append(units(r))
    assert peaks == sorted(peaks) and peaks[-1] - peaks[0] <= 7  # one more value per slot


def test_chain_griewank_search_and_limits():
    g = chain(40)
    full = BASELINES["griewank"](g)  # no budget: the cheapest, all states snapshotted
    assert full.sim.recomputes == 0
    least = min(curve_peaks(full))
    tight = BASELINES["griewank"](g, least)
    assert tight.feasible and tight.peak_bytes <= least
    assert not BASELINES["griewank"](g, least - 1).feasible


def test_revolve_formula():
    for l in range(1, 80):
        for s in range(0, 10):
            assert revolve_steps(l, s) == closed_form_steps(l, s + 1)
    # 6 steps, 2 slots: the first sweep snapshots x_1 and x_3; x_2 is snapshotted again
    # while steps 3..1 are reversed
    assert revolve_snapshots(6, 2) == {6: {1, 3}, 5: {1, 3}, 4: {1, 3}, 3: {1, 2}, 2: {1}, 1: set()}
    assert revolve_steps(6, 2) == 7
    for l, s in [(20, 3), (50, 5)]:
        assert all(len(v) <= s for v in revolve_snapshots(l, s).values())
    assert revolve_snapshots(10, 9)[10] == frozenset(range(1, 10))  # enough slots: all


def test_chen_greedy_budget_monotone():
    g = chain(30, reads_output=True)
    ref = BASELINES["checkpoint-all"](g).peak_bytes
    costs = []
    for frac in np.linspace(0.1, 1.0, 7):
        r = BASELINES["chen-greedy"](g, frac * ref)
        if r.feasible:
            assert r.peak_bytes <= frac * ref
        costs.append(r.cost if r.feasible else math.inf)
    assert costs == sorted(costs, reverse=True)  # more memory never costs more
    assert costs[-1] == BASELINES["checkpoint-all"](g).cost


# -- articulation points ---------------------------------------------------------------------
def _fwd(name, *ins, **kw):
    return Node(name, "op", ins, role="forward", bytes=UNIT, category="compute", **kw)


def test_articulation_points_residual_block():
    g = Graph([Node("x", "placeholder", (), role="input", bytes=UNIT, category="input"),
               Node("w", "placeholder", (), role="param", bytes=UNIT, category="input"),
               _fwd("h0", "x", "w"), _fwd("h1", "h0"), _fwd("h2", "h1"), _fwd("h3", "h0", "h2"),
               _fwd("h4", "h3", is_output=True),
               Node("t", "placeholder", (), role="tangent", bytes=UNIT, category="input"),
               Node("g", "op", ("t", "h1", "h3"), role="backward", bytes=UNIT)])
    mode, cands = candidate_chain(g)
    names = _context(g).st.names
    assert mode == "ap" and [names[c] for c in cands] == ["h0", "h3", "h4"]
    assert [names[c] for c in candidate_chain(g, "linearized")[1]] == ["h0", "h1", "h2", "h3", "h4"]


def test_articulation_points_match_networkx():
    nx = pytest.importorskip("networkx")
    for seed in range(40):
        G = nx.gnm_random_graph(12 + seed % 7, 10 + seed, seed=seed)
        adj = {v: set(G[v]) for v in G}
        assert articulation_points(adj) == set(nx.articulation_points(G)), seed


def test_no_articulation_points_falls_back_to_linearized():
    g = Graph([Node("x", "placeholder", (), role="input", bytes=UNIT, category="input"),
               _fwd("a", "x", is_output=True), _fwd("b", "x", is_output=True),
               Node("t", "placeholder", (), role="tangent", bytes=UNIT, category="input"),
               Node("g", "op", ("t", "a", "b"), role="backward", bytes=UNIT)])
    assert candidate_chain(g)[0] == "linearized"
    assert candidate_chain(g, "ap") == ("ap", [])
    for name in ("chen-sqrtn", "chen-greedy", "griewank"):
        assert BASELINES[name](g).details["candidates"] == "linearized"


# -- Checkmate's graphs ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def vgg16():
    path = CHECKMATE_DIR / "VGG16_256_224_224_3_train_nx.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    return load_graph(path)


def test_vgg16_checkpoint_all(vgg16):
    g = vgg16
    r = BASELINES["checkpoint-all"](g)
    assert r.feasible and r.sim.recomputes == 0
    assert r.cost == sum(n.cost for n in g.nodes if n.cost is not None) == 15500.0
    assert r.sim.computes == len(g) - 1  # every node but the image, once
    fwd = [n for n in g.nodes if n.role == "forward"]
    data = g["data"].bytes
    # at the Loss every forward value is resident
    assert r.peak_bytes >= data + sum(n.bytes for n in fwd) + g["Loss"].bytes
    # the peak is reached at block4_conv2_backward: the image, the forward values up to
    # block4_conv3 (later ones already freed), the kept predictions and two gradients
    upto = [n.bytes for n in fwd[: [n.name for n in fwd].index("block4_conv3") + 1]]
    assert r.peak_bytes == (data + sum(upto) + g["predictions"].bytes
                            + g["block4_conv3_backward"].bytes + g["block4_conv2_backward"].bytes)
    assert str(r.schedule().statements[r.sim.peak_statement]) == "compute block4_conv2_backward"


def test_vgg16_baselines(vgg16):
    g = vgg16
    ref = BASELINES["checkpoint-all"](g)
    # no schedule can go below the last backward op (its inputs and output) plus the image
    # and the kept predictions
    floor = (g["data"].bytes + g["block1_conv1"].bytes + g["block1_conv2"].bytes
             + g["block1_conv2_backward"].bytes + g["block1_conv1_backward"].bytes
             + g["predictions"].bytes)
    sq = BASELINES["chen-sqrtn"](g)
    assert sq.details["candidates"] == "ap" and sq.details["n_candidates"] == 22
    assert sq.details["checkpoints"] == ["block2_conv1", "block3_conv2", "block4_conv2",
                                         "block5_conv2", "fc1"]  # every 4th of 22
    assert sq.peak_bytes == floor and sq.cost > ref.cost
    for name, fn in BASELINES.items():
        r = fn(g)
        assert r.feasible and r.sim.valid, name
        assert min(curve_peaks(r)) >= floor, name
        assert r.cost >= ref.cost, name
        tight = fn(g, 0.9 * ref.peak_bytes)
        assert tight.sim.valid
        assert tight.feasible == (tight.peak_bytes <= 0.9 * ref.peak_bytes)
        if tight.feasible:
            assert tight.cost >= r.cost
        else:
            assert tight.status in ("infeasible", "over_budget")
    assert not BASELINES["chen-greedy"](g, floor - 1).feasible


@pytest.mark.parametrize("stem", ["fcn_8_vgg_32_416_608_3_train_nx", "vgg_unet_32_416_608_3_train_nx"])
def test_nonlinear_graphs_within_budget(stem):
    path = CHECKMATE_DIR / f"{stem}.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    g = load_graph(path)
    ref = BASELINES["checkpoint-all"](g).peak_bytes
    for name, fn in BASELINES.items():
        for frac in (0.6, 0.8):
            r = fn(g, frac * ref)
            assert r.sim is not None and r.sim.valid, name
            assert r.feasible == (r.peak_bytes <= frac * ref), name


# -- random joint graphs ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(joint_graphs(max_forward=10, max_backward=6))
def test_random_graphs_valid(g):
    for name, fn in BASELINES.items():
        r = fn(g)
        assert r.sim is not None and r.sim.valid, (name, r.message)
        assert r.feasible
        counts = r.schedule().compute_counts()
        for n in g.nodes:  # random ops and must_save values are never recomputed
            if n.category == "random" or n.must_save:
                assert counts.get(n.name, 0) <= 1, (name, n.name)
        below = fn(g, r.peak_bytes - 1)
        assert below.sim is None or below.sim.valid
        assert not below.feasible or below.peak_bytes <= r.peak_bytes - 1
    # the ladders' view of each stage is solve_r's
    ctx = _context(g)
    _, C = candidate_chain(g)
    for snaps in (None, revolve_snapshots(len(C) + 1, 1)):
        S = policy_matrix(ctx, C, snaps)
        R = solve_r(ctx.st, S)
        for t in range(ctx.n):
            assert np.flatnonzero(R[t]).tolist() == _stage_row(S, ctx.st.deps, t)


def test_smallest_feasible_keeps_to_a_time_limit_and_keeps_only_complete_answers():
    from remat.solvers.feasible import smallest_feasible

    g = chain(24)
    quick, how = smallest_feasible(g, time_limit=0)
    assert "the time limit stopped the search" in how
    assert "smallest_feasible" not in g._memo
    full, how = smallest_feasible(g)
    assert "time limit" not in how and full <= quick
    assert g._memo["smallest_feasible"] == (full, how)


@pytest.mark.parametrize("name", ["checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank"])
def test_budget_min_gives_a_baseline_s_least_peak(name):
    """``budget="min"`` asks a baseline for its least peak: that plan is the answer (it raised
    InfeasibleBudgetError naming that very peak, the baseline having been asked for 0 bytes)."""
    from remat.graph.synthetic import synthetic_joint_graph
    from remat.solvers import solve

    g = synthetic_joint_graph(120)
    p = solve(g, name, budget="min", time_limit=5)
    assert p.feasible and p.status == "feasible"
    assert p.peak_bytes == BASELINES[name](g, 0).peak_bytes == p.options["budget_bytes"]
