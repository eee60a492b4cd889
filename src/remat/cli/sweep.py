"""``remat sweep GRAPH.json``: overhead against the memory budget for budgeted solvers
(seeds/001 Figure 5); ``--plot`` draws it (:mod:`remat.bench.sweep`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..bench.plots import sweep_plot
from ..bench.sweep import DEFAULT_SOLVERS, budgets_for, markdown, sweep
from ..graph.io import load_graph
from ..plans.budget import reference_peak
from ..solvers import check_time_limit


def run(args) -> int:
    time_limit = check_time_limit(args.time_limit)
    solvers = args.solvers.split(",") if args.solvers else list(DEFAULT_SOLVERS)
    graph = load_graph(args.graph)
    budgets = budgets_for(graph, args.budgets.split(",") if args.budgets else None, args.points)
    rows = sweep(graph, budgets, solvers, time_limit, progress=not args.json)
    reference = reference_peak(graph)
    if args.json:
        print(json.dumps({"graph": graph.name, "reference_peak": reference, "rows": rows}, indent=1))
    else:
        print(markdown(graph, rows, reference))
    if args.plot:
        sweep_plot(graph.name, rows, Path(args.plot))
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
