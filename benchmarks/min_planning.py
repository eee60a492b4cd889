"""``budget="min"`` and ``max_overhead`` (issue 30): planning time and the plan reached, on the
captured graphs of ``remat.zoo.trials.budget_case``'s models, planned for the eager compiler
(staged schedules allowed) and for inductor (saved sets only). Peaks are shares of the
reference's (:func:`remat.plans.budget.reference_peak`: plain torch.compile's partition),
predicted times multiples of its (:func:`remat.plans.budget.reference_seconds`).
``--states 25,50,...`` plans ``min`` again with the search held to that many states per graph
(``SEARCH_WORK`` = states x nodes), how :data:`remat.solvers.magis.search.SEARCH_WORK` was
chosen.

    python benchmarks/min_planning.py --threads 1
    python benchmarks/min_planning.py --threads 1 --states 25,50,100,200,400,800

Rows: ``benchmarks/results/min_planning.json``.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.cost.model import default_cost_model  # noqa: E402
from remat.plans.budget import reference_peak, reference_seconds  # noqa: E402
from remat.solvers import solve  # noqa: E402
from remat.solvers.magis import search  # noqa: E402
from remat.zoo.trials import budget_case  # noqa: E402

MODELS = ("gpt2", "llama", "t5", "resnet18")
ASKS = {"default": {}, "min": {"budget": "min"}, "overhead=0.10": {"max_overhead": 0.10}}


def arguments(ap) -> None:
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--size", default="quick")
    ap.add_argument("--compilers", default="eager,inductor")
    ap.add_argument("--states", default="", help="comma-separated states per graph for a sweep of min")


def run(args) -> list[dict]:
    rows = []
    work = search.SEARCH_WORK, search.MIN_SEARCH_STATES, search.MAX_SEARCH_STATES
    for name in args.models.split(","):
        case = budget_case(name, args.size, torch.float32, "cpu")
        for compiler in args.compilers.split(","):
            g = remat.plan(case.model, *case.inputs, solver="mincut-conservative", cache=False,
                           for_compiler=compiler).graph
            ref_peak, ref_s = reference_peak(g), reference_seconds(g, default_cost_model(g))
            asks = dict(ASKS)
            for k in filter(None, args.states.split(",")):
                asks[f"min, {k} states"] = {"budget": "min", "states": int(k)}
            for label, ask in asks.items():
                ask = dict(ask)
                states = ask.pop("states", None)
                if states is not None:
                    search.SEARCH_WORK, search.MIN_SEARCH_STATES, search.MAX_SEARCH_STATES = \
                        states * len(g), 1, states
                t0 = time.perf_counter()
                try:
                    p = solve(g, "auto", **ask)
                finally:
                    search.SEARCH_WORK, search.MIN_SEARCH_STATES, search.MAX_SEARCH_STATES = work
                rows.append({"model": name, "compiler": compiler, "nodes": len(g), "ask": label,
                             "planning_s": time.perf_counter() - t0, "solver": p.solver,
                             "peak_of_reference": p.peak_bytes / ref_peak,
                             "time_of_reference": p.predicted_seconds / ref_s,
                             "search_states": p.details.get("search", {}).get("scheduled"),
                             "search_stopped": p.details.get("search", {}).get("stopped")})
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
