"""Deterministic planning (issue 30): one graph and one set of options give one plan. The
stages that search stop on work (the descent's moves, the staged baselines' schedules, the
search's states), not on the wall clock, which stays only as a safety stop under load: a run
whose clock never runs out gives the same plan as a normal one."""

from __future__ import annotations

import pytest

from remat.graph.synthetic import synthetic_joint_graph
from remat.solvers import deadline, solve
from remat.solvers.magis.search import search_states

from test_fission import mlp_graph


def _plan(g, **options):
    p = solve(g, **options)
    return p, (p.solver, tuple(p.saved_names or ()), tuple(p.statements or ()), tuple(p.fissions),
               p.peak_bytes)


def _without_clock(monkeypatch):
    """Every Deadline of the solvers never expires: only the work limits can stop a stage."""
    monkeypatch.setattr(deadline.Deadline, "expired", lambda self: False)


@pytest.mark.parametrize("make, options", [
    (mlp_graph, {"budget": "min"}),  # the search with fission
    (mlp_graph, {"max_overhead": 0.5}),
    (lambda: synthetic_joint_graph(600, seed=1), {"budget": "min"}),
    (lambda: synthetic_joint_graph(600, seed=1), {"budget": 0.05}),  # nothing fits: staged baselines
], ids=["mlp-min", "mlp-overhead", "synthetic-min", "synthetic-infeasible"])
def test_the_same_plan_twice_and_without_the_clock(make, options, monkeypatch):
    from remat.errors import InfeasibleBudgetError

    def plan():
        try:
            return _plan(make(), **options)
        except InfeasibleBudgetError as e:  # the plan of least peak it found
            return _plan_of(e.plan)

    first, key = plan()
    if options.get("budget") == 0.05:  # the staged baselines ran, each to its evaluations
        assert any(t.solver == "chen-greedy" for t in first.tried)
    _, again = plan()
    assert again == key
    _without_clock(monkeypatch)
    _, unbounded = plan()
    assert unbounded == key
    search = first.details.get("search")
    if search is not None:  # stopped by its work limit or by running out of states, never the clock
        assert search["stopped"] in ("work", "done")
        assert search["scheduled"] <= search_states(make())


def _plan_of(p):
    return p, (p.solver, tuple(p.saved_names or ()), tuple(p.statements or ()), tuple(p.fissions),
               p.peak_bytes)


def test_the_search_stops_after_its_states(monkeypatch):
    """The search schedules at most search_states(g) states: a count, not a time."""
    from remat.solvers.magis import search

    monkeypatch.setattr(search, "MAX_SEARCH_STATES", 20)
    monkeypatch.setattr(search, "MIN_SEARCH_STATES", 20)
    p = solve(mlp_graph(), budget="min")
    assert p.details["search"]["scheduled"] <= 20 and p.details["search"]["stopped"] in ("work", "done")


def test_a_captured_resnet_plans_the_same_twice(monkeypatch):
    """The zoo's ResNet-18 tiny, captured for inductor: budget="min" through the search (its
    graph has dimensions) gives the same saved set, schedule and fissions twice, and without
    the clock."""
    pytest.importorskip("torch")
    import remat
    from remat.zoo import registry

    case = registry.build("resnet18", "tiny")
    g = remat.plan(case.model, *case.inputs, solver="mincut-conservative", cache=False).graph
    first, key = _plan(g, budget="min")
    assert _plan(g, budget="min")[1] == key
    _without_clock(monkeypatch)
    assert _plan(g, budget="min")[1] == key
    assert first.details["search"]["stopped"] in ("work", "done")
