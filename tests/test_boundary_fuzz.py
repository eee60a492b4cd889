"""The boundary fuzz in the suite (bounded examples): random graph documents and option sets
never raise anything but remat's documented errors, and never hang (tests/fuzz_boundary.py
says what is drawn; ``python benchmarks/fuzz_boundary.py`` runs it longer). No torch."""

from __future__ import annotations

import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_boundary as fb

FUZZ = dict(deadline=datetime.timedelta(seconds=30), database=None,  # a hang fails, a slow CI does not
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
LIMITS = st.one_of(st.floats(0, 0.3), st.sampled_from([0.0, -1.0, float("nan"), "1", True]))
"""Time limits: at most 0.3 s per solve, and the wrong kinds."""


@settings(max_examples=250, **FUZZ)
@given(fb.texts(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)
def test_graph_files_and_options_raise_only_remat_errors(text, solver, budget, time_limit, options):
    fb.check_document(text, solver, budget, time_limit, options)


@settings(max_examples=150, **FUZZ)
@given(fb.extreme_graphs(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)
def test_graphs_at_the_bounds_plan_or_raise_remat_errors(graph, solver, budget, time_limit, options):
    fb.check_solve(graph, solver, budget, time_limit, options)


@settings(max_examples=200, **FUZZ)
@given(fb.COMPILE_OPTIONS)
def test_compile_options_raise_only_remat_errors(kwargs):
    fb.check_compile_options(dict(kwargs))
