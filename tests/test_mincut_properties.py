"""Property tests of the fusion-aware min-cut solver (seeds/000 Section 3, Algorithms 1 and 2).

Random valid joint graphs come from tests/strategies.py. For both modes and both tie-break
settings the solver's plan must be

(a) valid (seeds/000 Section 3.2: the backward is computable from saved values + tangents,
    banned nodes are never recomputed, primal inputs the backward needs are saved);
(b) optimal: its cost equals a brute-force minimum over all valid saved sets (Theorem 3.6);
(c) no more expensive with the Section 3.4 tie-break than without it (the tie-break only
    chooses among equally cheap cuts);
(d) priced by Lemma 3.5: plan.cost == cut_cost(saved) (w per materialized node, 2w otherwise).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat.errors import PlanError
from remat.graph.graph import Graph, Node
from remat.graph.io import load_graph
from remat.plans.saved_set import backward_work, validity_errors
from remat.solvers.mincut.maxflow import INF, InfiniteCutError, lexicographic_min_cut
from remat.solvers.mincut.maxflow import min_cut as maxflow_min_cut
from remat.solvers.mincut.mincut import MODES, analyse, banned, cut_cost, mincut

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/strategies.py
from strategies import joint_graphs, small_joint_graphs  # noqa: E402

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIGS = [(mode, tb) for mode in MODES for tb in (True, False)]


def brute_force_min_cost(g: Graph, mode: str) -> int | None:
    """min cut_cost over every valid saved set of g (seeds/000 Theorem 3.6, by enumeration).

    Enumerates every subset S of the forward-role nodes that are not must_recompute. Primal
    inputs cannot be recomputed (seeds/000 Section 3.2), so a valid saved set must contain the
    primal inputs that the backward reaches from S, and any further primal only adds cost: for
    each S the cheapest valid saved set containing exactly S among its forward nodes is
    S + missing_inputs(S), provided it is valid. Minimizing over S therefore covers all valid
    saved subsets of V_f.
    """
    ban = banned(g, mode)
    candidates = [n.name for n in g if n.role == "forward" and not n.must_recompute and n.can_save]
    best = None
    for mask in range(1 << len(candidates)):
        saved = [c for k, c in enumerate(candidates) if mask >> k & 1]
        saved += backward_work(g, saved).missing_inputs
        if validity_errors(g, saved, ban):
            continue
        cost = cut_cost(g, saved, mode)
        if best is None or cost < best:
            best = cost
    return best  # None: no valid saved set (an unsaveable value the backward can only recompute
    #              through a banned node); seeds/000 Lemma 3.2 assumes every value is saveable


def check_plan(g: Graph, mode: str, tie_break: bool):
    """Properties (a) and (d) plus the bans of seeds/000 Sections 3.1 and 3.4."""
    plan = mincut(g, mode=mode, tie_break=tie_break)
    ban = banned(g, mode)
    saved = plan.saved_names
    # (a) validity
    assert validity_errors(g, saved, ban) == [], (saved, ban)
    assert len(set(saved)) == len(saved)
    assert all(g[s].is_forward and not g[s].must_recompute and g[s].can_save for s in saved)
    work = backward_work(g, saved)
    assert work.missing_inputs == ()
    for name in work.computed:
        n = g[name]
        assert name not in ban and not n.must_save
        if name in plan.recomputed and not n.must_recompute:
            assert n.category not in ("compute", "random"), (name, n.category)
    assert set(plan.recomputed) | set(plan.moved_to_backward) == set(work.computed)
    # (d) cost is Lemma 3.5's price of the saved set
    assert plan.cost == cut_cost(g, saved, mode)
    a = analyse(g, mode)
    assert plan.cost == sum(a.capacity[g.index(s)] for s in saved)
    assert plan.solver == f"mincut-{mode}" and plan.options == ({} if tie_break else {"tie_break": False})
    return plan


@settings(max_examples=200, **SETTINGS)
@given(small_joint_graphs(max_nodes=14))
def test_plans_are_valid_and_optimal_against_brute_force(g):
    """seeds/000 Theorem 3.6: the min cut is the cheapest valid saved set. Checked against an
    exhaustive search on graphs of <= 14 nodes, for both modes and both tie-break settings."""
    assert len(g) <= 14
    for mode in MODES:
        best = brute_force_min_cost(g, mode)
        if best is None:  # infeasible exactly when the solver says so
            for tb in (True, False):
                with pytest.raises(PlanError):
                    mincut(g, mode=mode, tie_break=tb)
            continue
        costs = {}
        for tb in (True, False):
            plan = check_plan(g, mode, tb)
            costs[tb] = plan.cost
            assert plan.cost == best, (mode, tb, plan.saved_names, best)
        assert costs[True] == costs[False]


@settings(max_examples=150, **SETTINGS)
@given(joint_graphs(max_inputs=4, max_forward=18, max_tangents=3, max_backward=8, max_bytes=1000))
def test_plans_on_larger_graphs_are_valid_and_tie_break_is_free(g):
    """(a), (c), (d) on graphs too big to brute-force: valid plans (seeds/000 Section 3.2), the
    Section 3.4 tie-break never raises the cost (equal to the plain min cut)."""
    for mode in MODES:
        try:
            with_tb = check_plan(g, mode, True)
        except PlanError:  # infeasible graph: the tie-break must not change that either
            with pytest.raises(PlanError):
                mincut(g, mode=mode, tie_break=False)
            continue
        without = check_plan(g, mode, False)
        assert with_tb.cost == without.cost


def _reference_min_cut(g: Graph, mode: str) -> int:
    """Algorithm 1 of seeds/000 built independently with networkx (capacities from Algorithm 2
    as computed by analyse, bans from banned)."""
    a = analyse(g, mode)
    ban = banned(g, mode)
    G = nx.DiGraph()
    G.add_nodes_from(["s", "t"])
    demand = {n.name for n in g if n.is_forward and n.backward_output}
    for i, n in enumerate(g):
        if not n.is_forward:
            G.add_edge(("in", n.name), "t")  # no capacity attribute = infinite in networkx
            continue
        if n.is_primal or n.name in ban:
            G.add_edge("s", ("in", n.name))
        if n.must_recompute or not n.can_save:
            G.add_edge(("in", n.name), ("out", n.name))
        else:
            G.add_edge(("in", n.name), ("out", n.name), capacity=a.capacity[i])
        if n.name in demand:
            G.add_edge(("out", n.name), "t")
        for u in g.users(n.name):
            G.add_edge(("out", n.name), ("in", u.name))
    value, _ = nx.minimum_cut(G, "s", "t")
    return value


@settings(max_examples=60, **SETTINGS)
@given(joint_graphs(max_inputs=3, max_forward=14, max_tangents=2, max_backward=6, max_bytes=500))
def test_cost_matches_an_independent_networkx_min_cut(g):
    """The plan cost equals the min s-t cut of Algorithm 1's auxiliary graph (seeds/000
    Section 3.3) built here with networkx, on graphs beyond brute-force size."""
    for mode in MODES:
        try:
            expected = _reference_min_cut(g, mode)
        except nx.NetworkXUnbounded:  # every cut is infinite: no valid saved set
            with pytest.raises(PlanError):
                mincut(g, mode=mode)
            continue
        assert mincut(g, mode=mode).cost == expected


@settings(max_examples=60, **SETTINGS)
@given(small_joint_graphs(max_nodes=12), st.randoms(use_true_random=False))
def test_plan_does_not_depend_on_node_order(g, rnd):
    """The cost of the optimal plan (seeds/000 Theorem 3.6) is a property of the DAG, not of the
    order its nodes were listed in."""
    nodes = list(g.nodes)
    rnd.shuffle(nodes)
    g2 = Graph(nodes, name=g.name)
    def cost(graph, mode):
        try:
            return mincut(graph, mode=mode).cost
        except PlanError:
            return None

    for mode in MODES:
        assert cost(g, mode) == cost(g2, mode)


from paths import CHECKMATE_DIR  # noqa: E402

CHECKMATE = sorted(CHECKMATE_DIR.glob("*.json"))


@pytest.mark.parametrize("path", CHECKMATE, ids=[p.stem[:24] for p in CHECKMATE])
def test_real_graphs_give_valid_plans(path):
    """(a), (c), (d) on the shared Checkmate/Moccasin graphs (seeds/000 Section 3 on real nets)."""
    g = load_graph(path)
    for mode in MODES:
        costs = [check_plan(g, mode, tb).cost for tb in (True, False)]
        assert costs[0] == costs[1]
        if any(n.role == "backward" for n in g):
            assert check_plan(g, mode, True).saved_names  # the backward needs something


def test_training_graph_plans_are_cheaper_than_saving_every_forward_value():
    """The min cut never costs more than naive AD's choice of saving all that the backward
    reads (seeds/000 Section 3.2: naive AD is one valid saved set among many)."""
    g = load_graph(CHECKMATE[0].parent / "VGG16_256_224_224_3_train_nx.json")
    read_by_bw = sorted({i for n in g if n.role == "backward" for i in n.inputs
                         if g[i].is_forward})
    for mode in MODES:
        plan = mincut(g, mode=mode)
        ban = banned(g, mode)
        assert validity_errors(g, read_by_bw, ban) == []
        assert plan.cost <= cut_cost(g, read_by_bw, mode)


# -- infeasible graphs --------------------------------------------------------------------


def test_unsaveable_unrecomputable_value_raises_plan_error():
    """seeds/000 Lemma 3.2 assumes a finite cut exists. Here the backward needs m, m is flagged
    must_recompute, and m can only be recomputed from the primal input x, which can never be
    recomputed (seeds/000 Section 3.2: inputs are only ever saved, Algorithm 1 line 9) and is
    itself flagged must_recompute (never saved). No valid saved set exists: PlanError, naming
    the nodes."""
    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=8, category="input", must_recompute=True),
        Node("m", "relu", ("x",), bytes=8, category="pointwise", must_recompute=True),
        Node("t", "placeholder", (), role="tangent", bytes=8, category="input"),
        Node("grad", "mul", ("t", "m"), role="backward", bytes=8, category="pointwise"),
    ])
    for mode in MODES:
        for tb in (True, False):
            with pytest.raises(PlanError) as e:
                mincut(g, mode=mode, tie_break=tb)
            msg = str(e.value)
            assert re.search(r"\bm\b", msg) and re.search(r"\bx\b", msg), msg
            assert "must_recompute" in msg


def test_must_recompute_next_to_a_banned_node_is_feasible():
    """Control for the PlanError test: a must_recompute node whose input is banned (a random
    op, seeds/000 Section 3.4) is fine: the banned node is saved and m recomputed from it."""
    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=8, category="input"),
        Node("r", "rand_like", ("x",), bytes=8, category="random"),
        Node("m", "mul", ("r", "x"), bytes=8, category="pointwise", must_recompute=True),
        Node("t", "placeholder", (), role="tangent", bytes=8, category="input"),
        Node("grad", "mul", ("t", "m"), role="backward", bytes=8, category="pointwise"),
    ])
    for mode in MODES:
        plan = mincut(g, mode=mode)
        assert sorted(plan.saved_names) == ["r", "x"]
        assert "m" in plan.recomputed and "r" not in plan.recomputed


def test_saved_backward_output_needs_no_inputs():
    """A forward value the backward returns as is (backward_output) can be saved on its own:
    saving it does not oblige the backward to read its inputs (seeds/000 Section 3.2 validity:
    the backward must be computable from the saved set). Regression for saved_set.backward_work,
    which used to report the input x as missing."""
    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=100, category="input"),
        Node("b", "relu", ("x",), bytes=10, category="pointwise", backward_output=True,
             is_output=True),
    ])
    for mode in MODES:
        assert validity_errors(g, ["b"], banned(g, mode)) == []
        plan = mincut(g, mode=mode)
        assert plan.saved_names == ["b"] and plan.cost == 10
    assert backward_work(g, ["b"]).missing_inputs == ()
    assert backward_work(g, []).missing_inputs == ("x",)
    assert backward_work(g, ["x"]).recomputed == ("b",)


def test_plan_json_round_trip_keeps_saved_set():
    """A plan of the seeds/002 example survives JSON (what tools exchange after solving)."""
    from remat.graph.examples import cos_cos_graph
    from remat.plans.plan import Plan

    plan = mincut(cos_cos_graph())
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert back.saved_names == plan.saved_names == ["add_2"]
    assert back.cost == plan.cost


# -- the exact lexicographic min cut behind the tie-break (seeds/000 Section 3.4) -----------


@st.composite
def small_networks(draw):
    n = draw(st.integers(3, 7))
    n_levels = draw(st.integers(1, 2))
    arcs, caps = [], []
    for u in range(n):  # each ordered pair: no arc, or one or two parallel arcs
        for v in range(n):
            if u != v and v != 0 and u != 1:
                for _ in range(draw(st.sampled_from((0, 0, 1, 1, 2)))):
                    arcs.append((u, v))
                    caps.append(draw(st.sampled_from((INF, 0, 1, 2, 3, 5))))
    for k in range(draw(st.integers(0, 2))):  # a few arcs into s or out of t
        arcs.append(draw(st.sampled_from([(1, v) for v in range(n) if v != 1]
                                         + [(u, 0) for u in range(1, n)])))
        caps.append(draw(st.sampled_from((INF, 1, 3))))
    levels = [[draw(st.integers(0, 6)) for _ in arcs] for _ in range(n_levels)]
    return n, arcs, caps, levels


def _cut_values(n, arcs, caps, levels, side):
    crossing = [k for k, (u, v) in enumerate(arcs) if side[u] and not side[v]]
    if any(caps[k] == INF for k in crossing):
        return None
    return (sum(caps[k] for k in crossing),) + tuple(sum(lv[k] for k in crossing) for lv in levels)


@settings(max_examples=300, **SETTINGS)
@given(small_networks())
def test_lexicographic_min_cut_matches_brute_force(net):
    """The tie-break of seeds/000 Section 3.4 is an exact lexicographic min cut: the returned
    cut has the minimum capacity, then (among those) the minimum of each tie-break level in
    order. Checked against every s-t cut of small random networks (s = 0, t = 1)."""
    n, arcs, caps, levels = net
    tails, heads = [u for u, _ in arcs], [v for _, v in arcs]
    best = None
    for mask in range(1 << (n - 2)):
        side = [True, False] + [bool(mask >> k & 1) for k in range(n - 2)]
        vals = _cut_values(n, arcs, caps, levels, side)
        if vals is not None and (best is None or vals < best):
            best = vals
    if best is None:
        with pytest.raises(InfiniteCutError):
            lexicographic_min_cut(n, tails, heads, caps, *levels, s=0, t=1)
        with pytest.raises(InfiniteCutError):
            maxflow_min_cut(n, tails, heads, caps, 0, 1)
        return
    plain = maxflow_min_cut(n, tails, heads, caps, 0, 1)
    side = [bool(x) for x in plain.source_side]
    assert plain.value == best[0] == _cut_values(n, arcs, caps, levels, side)[0]
    cut = lexicographic_min_cut(n, tails, heads, caps, *levels, s=0, t=1)
    side = [bool(x) for x in cut.source_side]
    assert side[0] and not side[1]
    assert _cut_values(n, arcs, caps, levels, side) == best
    assert cut.value == best[0]


def test_tie_break_handles_huge_sizes():
    """seeds/000 Section 3.4: the tie-break must never change the outcome of the cut, so a graph
    the plain min cut can plan must be plannable with the tie-break too (property (c))."""
    big = 2**50
    g = Graph([
        Node("x", "placeholder", (), role="input", bytes=big, category="input"),
        Node("out", "sin", ("x",), bytes=big, category="pointwise", is_output=True),
        Node("t", "placeholder", (), role="tangent", bytes=8, category="input"),
        Node("grad", "mul", ("t", "x"), role="backward", bytes=8, category="pointwise"),
    ])
    plain = mincut(g, tie_break=False)
    assert plain.saved_names == ["x"]
    assert mincut(g, tie_break=True).saved_names == ["x"]
