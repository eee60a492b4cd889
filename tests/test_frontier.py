"""The fusion-aware frontier against an exhaustive search over every cut of small graphs.

The parametric min cut must find every vertex of the lower convex hull of the cuts'
(saved bytes, time price) points, each a valid saved set that never recomputes a random or
``must_save`` value; and ``auto`` must keep to its budget and to the no-budget plan.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from remat.errors import InfeasibleBudgetError, PlanError
from remat.graph.examples import cos_cos_graph
from remat.graph.graph import Graph
from remat.plans.budget import Budget, activation_bytes, resident_bytes
from remat.plans.plan import Plan
from remat.solvers import solve
from remat.solvers.mincut import mincut
from remat.solvers.mincut.frontier import frontier, prices
from remat.solvers.mincut.maxflow import INF
from strategies import joint_graphs


def all_cut_points(g: Graph) -> set[tuple[int, int]]:
    """(T, M) of every finite cut of the frontier's network, by enumeration: each forward
    vertex pair (in, out) is on the source side, cut (saved) or on the sink side."""
    net = prices(g)
    a = g._arrays
    side = np.zeros(net.num_vertices, dtype=bool)
    side[0] = True
    free = np.flatnonzero(a.forward).tolist()
    points = set()
    for states in itertools.product((0, 1, 2), repeat=len(free)):
        side[2:] = False
        for i, s in zip(free, states):
            side[2 + 2 * i] = s < 2  # in: source side unless the node is on the sink side
            side[3 + 2 * i] = s == 0  # out: source side only when not cut
        cut = side[net.tails] & ~side[net.heads]
        if (net.time[cut] == INF).any():
            continue
        points.add((int(net.time[cut].sum()), int(net.memory[cut].sum())))
    return points


def lower_hull(points: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Vertices of the lower convex hull of (T, M) points, by brute force: a point is a
    vertex iff some price lam >= 0 makes it the unique minimum of T + lam * M (ties broken
    to less memory at lam = 0 and to less time at lam = inf)."""
    pts = sorted(points, key=lambda p: (-p[1], p[0]))
    out = []
    for t, m in pts:
        if any(t2 <= t and m2 <= m and (t2, m2) != (t, m) for t2, m2 in points):
            continue  # dominated
        # unique minimum for some lam: the lam interval where it beats all others is non-empty
        lo, hi = 0.0, float("inf")
        for t2, m2 in points:
            if (t2, m2) == (t, m):
                continue
            # need t + lam m < t2 + lam m2
            if m2 < m:
                hi = min(hi, (t2 - t) / (m - m2))
            elif m2 > m:
                lo = max(lo, (t - t2) / (m2 - m))
            elif t2 <= t:
                lo, hi = 1.0, 0.0
        if lo < hi or (lo == 0.0 == hi):
            out.append((t, m))
    return out


def small_graph_cases():
    return joint_graphs(max_inputs=2, max_forward=7, max_tangents=1, max_backward=3, max_bytes=64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graph_cases())
def test_frontier_vertices_are_the_lower_hull_of_all_cuts(g):
    try:
        found = frontier(g)
    except PlanError:
        assert not all_cut_points(g), "the frontier found no cut although a finite one exists"
        return
    points = all_cut_points(g)
    got = [(p.time, p.memory) for p in found]
    assert got == sorted(got, key=lambda p: -p[1]), "points from most to least memory"
    assert set(got) <= points, "every frontier point is a cut of the network"
    assert got == lower_hull(points)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graph_cases())
def test_frontier_saved_sets_are_valid_and_never_redraw_randomness(g):
    try:
        found = frontier(g)
    except PlanError:
        return
    for p in found:
        plan = Plan.from_saved_set(g, p.saved, solver="frontier").judge()
        assert plan.sim.valid, plan.sim.errors
        for name in plan.recomputed:
            node = g[name]
            assert node.category != "random" and not node.must_save, name


def test_frontier_spans_the_trade_off_on_cos_cos():
    g = cos_cos_graph()
    pts = frontier(g)
    assert pts[0].saved == mincut(g).saved_names  # lam = 0: the min cut's own answer
    assert pts[-1].memory == 0 and pts[-1].saved == ["a", "b", "c", "d"]  # recompute everything
    assert pts[0].lam_high == pytest.approx(pts[-1].lam_low)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graph_cases())
def test_auto_keeps_its_budget_and_never_does_worse_than_no_budget(g):
    try:
        base = mincut(g).judge()
    except PlanError:
        return
    for fraction in (1.0, 0.6, 0.3):
        try:
            p = solve(g, "auto", budget=fraction, time_limit=5)
        except InfeasibleBudgetError as e:
            assert e.smallest_feasible > Budget.parse(fraction).bytes_for(g)
            continue
        assert p.feasible and p.peak_bytes <= Budget.parse(fraction).bytes_for(g)
        if base.peak_bytes <= p.budget:  # the no-budget plan fits: never more memory or time
            assert p.peak_bytes <= base.peak_bytes
            assert p.predicted_seconds <= base.predicted_seconds


def test_fraction_is_of_the_activation_memory():
    g = cos_cos_graph()
    full = Budget.parse(1.0).bytes_for(g)
    assert resident_bytes(g) < full
    assert Budget.parse(0.5).bytes_for(g) == resident_bytes(g) + int(0.5 * activation_bytes(g))
    assert full == resident_bytes(g) + activation_bytes(g)


def test_budget_min_is_the_least_peak_found():
    g = cos_cos_graph()
    p = solve(g, "auto", budget="min")
    assert p.feasible and p.options["budget_bytes"] == p.peak_bytes
    others = [t.peak_bytes for t in p.tried if t.peak_bytes is not None]
    assert p.peak_bytes == min(others)
    with pytest.raises(InfeasibleBudgetError):
        solve(g, "auto", budget=p.peak_bytes - 1)


def test_the_frontier_stops_on_work_and_keeps_both_ends():
    """Its deterministic stop: at most FRONTIER_MIN_SOLVES max-flows where the work allows fewer
    (a 100k-node graph's took 32 s of a 60 s limit), the two ends always there and every point
    one of the whole frontier's (breadth first, so the points found span the hull)."""
    from remat.graph.synthetic import synthetic_joint_graph
    from remat.solvers.mincut.frontier import FRONTIER_MIN_SOLVES

    g = synthetic_joint_graph(1500, seed=0)
    whole = frontier(g, work=None)
    cut = frontier(g, work=1)
    assert len(whole) > FRONTIER_MIN_SOLVES and 2 <= len(cut) <= FRONTIER_MIN_SOLVES
    assert (cut[0].memory, cut[-1].memory) == (whole[0].memory, whole[-1].memory)
    assert {(p.time, p.memory) for p in cut} <= {(p.time, p.memory) for p in whole}
    # the default work does not cut a graph this small
    assert [(p.time, p.memory) for p in frontier(g)] == [(p.time, p.memory) for p in whole]
