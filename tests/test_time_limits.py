"""Every solver keeps to its time limit, the smallest-feasible search of an infeasible budget
included (issue 10: ``time_limit`` + 5%). A synthetic 600-node joint graph at budgets it cannot
meet makes every solver search to the end of its limit; a small allowance covers this shared
machine's scheduling noise (the measured times are in BENCHMARKS.md)."""

from __future__ import annotations

import time

import pytest

from remat.errors import InfeasibleBudgetError
from remat.graph.synthetic import synthetic_joint_graph
from remat.solvers import names, solve

LIMIT = 2.0
NOISE = 1.0  # seconds of scheduling noise on top of the 5% (a long suite run measured up to 0.9 s)


@pytest.fixture(scope="module")
def graph():
    return synthetic_joint_graph(600, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("solver", names(graphs=True, budget=True))
@pytest.mark.parametrize("budget", [0.5, 0.05])
def test_solver_returns_within_its_time_limit(graph, solver, budget):
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        plan = solve(graph, solver, budget=budget, time_limit=LIMIT)
        assert plan.feasible
    except InfeasibleBudgetError as e:
        assert e.smallest_feasible > 0
    # A solver that overruns its limit overruns it in wall-clock time and, computing all along,
    # in this process's CPU time too; another process on the cores (the suite's second worker)
    # stretches only the first, a solver's own threads only the second.
    elapsed = min(time.perf_counter() - t0, time.process_time() - c0)
    assert elapsed <= LIMIT * 1.05 + NOISE, f"{solver} took {elapsed:.2f} s for a {LIMIT} s limit"


def test_the_stages_shares_are_fractions_of_one_scale_within_the_time_limit(monkeypatch):
    """The stages that may search long take shares of one scale (:mod:`remat.solvers.deadline`),
    never more than what is left of the call's time limit: under the default limit, a longer
    one or none, the seconds they always had (6, 3, 10, 15 and 5 s); under a shorter one, at
    most that limit; a lower scale shortens them all."""
    from remat.solvers import deadline
    from remat.solvers.auto import AUTO_SEARCH_SHARE
    from remat.solvers.deadline import Deadline
    from remat.solvers.descent import DESCENT_SHARE
    from remat.solvers.magis.search import REORDER_SHARE, SEARCH_SHARE
    from remat.solvers.portfolio import STAGED_SHARE
    from remat.solvers.registry import DEFAULT_TIME_LIMIT

    assert deadline.DEFAULT_SCALE == DEFAULT_TIME_LIMIT
    monkeypatch.setattr(deadline, "SCALE", deadline.DEFAULT_SCALE)  # the suite runs with a far one
    shares = (STAGED_SHARE, DESCENT_SHARE, AUTO_SEARCH_SHARE, SEARCH_SHARE, REORDER_SHARE)
    for limit in (None, DEFAULT_TIME_LIMIT, 600.0):
        got = [Deadline(limit).share(f).limit for f in shares]
        assert got == pytest.approx([6.0, 3.0, 10.0, 15.0, 5.0], abs=0.01), limit
    assert all(Deadline(2.0).share(f).limit <= 2.0 for f in shares)
    monkeypatch.setattr(deadline, "SCALE", 6.0)
    assert [Deadline(None).share(f).limit for f in shares] == pytest.approx([0.6, 0.3, 1.0, 1.5, 0.5])
    for raw, scale in [("3600", 3600.0), ("", 60.0), ("-5", 60.0), ("soon", 60.0)]:
        monkeypatch.setenv("REMAT_SAFETY_SCALE", raw)
        assert deadline._scale() == scale, raw


def test_min_with_a_small_time_limit_returns_within_a_bound_of_it():
    """``budget="min"`` runs every stage and then, on a graph with dimensions, MAGIS's search:
    each within what is left of ``time_limit``. The search used to take 10 s whatever the limit
    (10.2 s here for a 1 s limit); a generous bound, the machine being shared."""
    from test_fission import mlp_graph

    limit = 1.0
    t0 = time.perf_counter()
    plan = solve(mlp_graph(), "auto", budget="min", time_limit=limit)
    elapsed = time.perf_counter() - t0
    assert plan.feasible and "search" in plan.details  # the search ran
    assert elapsed <= 2 * limit + NOISE, f"min took {elapsed:.2f} s for a {limit} s limit"


def test_highs_is_not_started_with_less_time_left_than_its_setup():
    """HiGHS cannot be stopped before its first simplex iteration (1.3-3.5 s for 2.3M
    nonzeros here): given less time than its setup takes, :func:`run_highs` does not start it
    and says so, where a started run would overrun the limit; with time, the LP is solved."""
    from remat.cost.model import default_cost_model
    from remat.solvers.checkmate.highs import new_highs, run_highs, setup_seconds
    from remat.solvers.checkmate.model import build_model

    from test_baselines import UNIT, chain

    model = build_model(chain(8), 6 * UNIT, default_cost_model(), objective="cost")
    h = new_highs(model, relax=True)
    need = setup_seconds(h.getNumNz())
    assert need > 0
    out = run_highs(h, time_limit=need / 2, mip=False)
    assert (out.status, out.has_solution, out.seconds) == ("time_limit", False, 0.0)
    out = run_highs(h, time_limit=None, mip=False)
    assert out.status == "optimal" and out.has_solution
