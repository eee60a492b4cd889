"""The boundary fuzz: random graph documents and option sets never raise anything but remat's
documented errors, and never hang (tests/fuzz_boundary.py says what is drawn).

In the suite it runs a bounded number of examples. Run long, as a benchmark::

    REMAT_FUZZ_EXAMPLES=20000 python -m pytest tests/test_boundary_fuzz.py -s -q

which tries that many examples per property, records every escape instead of stopping at the
first, and prints what it tried (documents, graphs loaded, plans made, each remat error class)
and found, failing at the end if anything escaped (``REMAT_FUZZ_JSON=out.json`` writes it too).
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_boundary as fb

LONG = int(os.environ.get("REMAT_FUZZ_EXAMPLES", "0") or 0)
"""Examples per property in benchmark mode (0: the suite's bounded counts)."""

FUZZ = dict(deadline=datetime.timedelta(seconds=30), database=None,  # a hang fails, a slow CI does not
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
LIMITS = st.one_of(st.floats(0, 0.3), st.sampled_from([0.0, -1.0, float("nan"), "1", True, -10**400]))
"""Time limits: at most 0.3 s per solve, and the wrong kinds."""

TALLIES = {name: fb.Tally() for name in ("graph files", "graphs at the bounds", "compile options")}


def _examples(suite: int) -> int:
    return LONG or suite


def _record(check, *args) -> None:
    """``check(*args)``; in benchmark mode an escape is counted (its tally keeps it) and the run
    goes on, to count every finding."""
    try:
        check(*args)
    except AssertionError:
        if not LONG:
            raise


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if not LONG:
        return
    lines = [f"boundary fuzz: {LONG} examples per property",
             "| property | tried | loaded | planned | remat errors | findings | slowest example |",
             "|---|---|---|---|---|---|---|"]
    for name, t in TALLIES.items():
        errors = ", ".join(f"{k} {v}" for k, v in t.errors.most_common()) or "-"
        lines.append(f"| {name} | {t.documents} | {t.loaded} | {t.planned} | {errors} | {len(t.findings)} | "
                     f"{t.slowest:.2f} s |")
    findings = list(dict.fromkeys(f for t in TALLIES.values() for f in t.findings))
    lines += [f"finding: {f}" for f in findings]
    print("\n" + "\n".join(lines), file=sys.stderr)
    if os.environ.get("REMAT_FUZZ_JSON"):
        with open(os.environ["REMAT_FUZZ_JSON"], "w") as f:
            json.dump({name: {"tried": t.documents, "loaded": t.loaded, "planned": t.planned,
                              "errors": dict(t.errors), "findings": t.findings, "slowest_s": t.slowest}
                       for name, t in TALLIES.items()}, f, indent=1)
    assert not findings, findings


@settings(max_examples=_examples(250), **FUZZ)
@given(fb.texts(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)
def test_graph_files_and_options_raise_only_remat_errors(text, solver, budget, time_limit, options):
    _record(fb.check_document, text, solver, budget, time_limit, options, TALLIES["graph files"])


@settings(max_examples=_examples(150), **FUZZ)
@given(fb.extreme_graphs(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)
def test_graphs_at_the_bounds_plan_or_raise_remat_errors(graph, solver, budget, time_limit, options):
    _record(fb.check_solve, graph, solver, budget, time_limit, options, TALLIES["graphs at the bounds"])


@settings(max_examples=_examples(200), **FUZZ)
@given(fb.COMPILE_OPTIONS)
def test_compile_options_raise_only_remat_errors(kwargs):
    _record(fb.check_compile_options, dict(kwargs), TALLIES["compile options"])
