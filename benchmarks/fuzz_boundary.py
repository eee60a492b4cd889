"""The boundary fuzz, run long: how many documents and option sets it tried, what they became,
and what escaped (``tests/fuzz_boundary.py`` draws them; ``tests/test_boundary_fuzz.py`` runs
a bounded number in the suite).

    python benchmarks/fuzz_boundary.py [--examples 5000] [--seed 0] [--json OUT.json]

Prints one row per property: examples tried, graphs that loaded, plans made, each remat error
class raised (the documented answers to bad input) and the findings (anything else: an
escape is a bug). Exit status 1 if there is a finding. On this 2-core CPU 5000 examples per
property take about 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzz_boundary as fb  # noqa: E402

LIMITS = st.one_of(st.floats(0, 0.3), st.sampled_from([0.0, -1.0, float("nan"), "1", True]))


def run(examples: int, seed_value: int) -> dict[str, fb.Tally]:
    tallies = {name: fb.Tally() for name in ("graph files", "graphs at the bounds", "compile options")}
    common = dict(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))

    def files(text, solver, budget, time_limit, options):
        try:
            fb.check_document(text, solver, budget, time_limit, options, tallies["graph files"])
        except AssertionError:
            pass  # counted in the tally: the run goes on, to count every finding

    def bounds(graph, solver, budget, time_limit, options):
        try:
            fb.check_solve(graph, solver, budget, time_limit, options, tallies["graphs at the bounds"])
        except AssertionError:
            pass

    t = tallies["compile options"]

    def options(kwargs):
        t.documents += 1
        t0 = time.perf_counter()
        try:
            fb.check_compile_options(dict(kwargs))
        except Exception as e:  # noqa: BLE001 - the finding
            t.findings.append(f"remat.compile raised {type(e).__name__}: {e} ({kwargs!r})"[:400])
        t.slowest = max(t.slowest, time.perf_counter() - t0)

    for prop in (given(fb.texts(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)(files),
                 given(fb.extreme_graphs(), st.sampled_from(fb.SOLVERS), fb.BUDGETS, LIMITS, fb.SOLVER_OPTIONS)(bounds),
                 given(fb.COMPILE_OPTIONS)(options)):
        seed(seed_value)(settings(**common)(prop))()
    return tallies


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=5000, help="examples per property (default 5000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the tallies here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    tallies = run(args.examples, args.seed)
    took = time.perf_counter() - t0
    print(f"boundary fuzz: {args.examples} examples per property, {took:.0f} s")
    print("| property | tried | loaded | planned | remat errors | findings | slowest example |")
    print("|---|---|---|---|---|---|---|")
    for name, t in tallies.items():
        errors = ", ".join(f"{k} {v}" for k, v in t.errors.most_common()) or "-"
        print(f"| {name} | {t.documents} | {t.loaded} | {t.planned} | {errors} | {len(t.findings)} | {t.slowest:.2f} s |")
    findings = [f for t in tallies.values() for f in t.findings]
    for f in dict.fromkeys(findings):
        print(f"finding: {f}")
    if args.json is not None:
        args.json.write_text(json.dumps({name: {"tried": t.documents, "loaded": t.loaded, "planned": t.planned,
                                                "errors": dict(t.errors), "findings": t.findings,
                                                "slowest_s": t.slowest} for name, t in tallies.items()}, indent=1))
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
