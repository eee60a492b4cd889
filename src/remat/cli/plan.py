"""``remat plan GRAPH.json``: plan a saved graph with any solver, with or without a budget.

The same planner, budget headroom and errors as ``remat.compile``: a byte budget is planned
within 99% of itself (:data:`~remat.plans.budget.TORCH_HEADROOM`), and a budget no plan fits
prints why and the smallest feasible budget (exit status 1; with ``--json``, the plan that
came closest, its ``message`` saying why). ``--json`` prints :meth:`remat.Plan.to_dict`,
which :meth:`remat.Plan.from_dict` reads back, with the schedule's ``offload``/``reload``
statements for the swapping solvers (``--solver swap`` or ``swap-recompute``; ``--bandwidth``
sets their link); ``--plot PNG`` draws the plan's device memory and copy stream over time.
``--max-overhead 0.10`` asks instead of a budget for the least memory within 10% more time
(MAGIS's search; solvers ``auto`` and ``magis``), as does ``--budget min --max-overhead 0.10``
(``--budget min`` alone: within 2x); a plan with fissions lists them.
"""

from __future__ import annotations

import sys

from ..errors import InfeasibleBudgetError, OptionError
from ..graph.io import load_graph
from ..plans.budget import TORCH_HEADROOM, Budget
from ..solvers import check_time_limit, info, names, solve
from ..solvers.progress import shown


def _link_options(graph, args) -> dict:
    """``--no-offload`` and ``--bandwidth``: marked on the graph as ``remat.compile``'s
    ``offload`` and ``bandwidth`` options mark a captured one, so every solver sees them; on a
    graph without a device the bandwidth (bytes per cost unit) goes to a swapping solver."""
    if getattr(args, "no_offload", False):
        graph.meta["offload"] = {"allowed": False, "reason": "--no-offload"}
    if args.bandwidth is None:
        return {}
    device = (graph.meta or {}).get("device")
    if isinstance(device, dict) and device.get("type"):
        device["link"] = {"bandwidth": float(args.bandwidth), "source": "given"}
        return {}
    if "bandwidth" not in info(args.solver).options:
        raise OptionError(f"--bandwidth on a graph without a device is bytes per cost unit for the "
                          f"swapping solvers ({', '.join(n for n in names() if 'bandwidth' in info(n).options)}); {args.solver!r} takes none")
    return {"bandwidth": args.bandwidth}


def run(args) -> int:
    budget = None if args.budget is None else Budget.parse(args.budget)
    time_limit = check_time_limit(args.time_limit)
    graph = load_graph(args.graph)
    try:
        # stages on a terminal only, so JSON output and pipes stay clean
        with shown(f"planning {graph.name} ({len(graph)} nodes) with {args.solver}", plain=False):
            options = _link_options(graph, args)
            if args.max_overhead is not None:
                if budget is not None and budget.kind != "min":
                    raise OptionError("give --budget (least time within a memory bound) or "
                                      "--max-overhead (least memory within a time bound), not both; "
                                      "--budget min --max-overhead X: the least memory within X")
                options["max_overhead"] = args.max_overhead
            plan = solve(graph, args.solver, budget=budget, time_limit=time_limit,
                         headroom=TORCH_HEADROOM, **options)
    except InfeasibleBudgetError as e:
        if not args.json:
            raise
        plan = e.plan.updated(message=str(e), details={"smallest_feasible": e.smallest_feasible})
    print(plan.to_json() if args.json else plan.summary())
    if args.plot and plan.statements is not None:
        from ..bench.plots import streams_plot  # matplotlib, only when asked
        from ..plans.simulator import simulate
        sim = simulate(plan.schedule(), link=plan.link)
        print(f"wrote {streams_plot(plan.schedule(), sim, args.plot)}", file=sys.stderr)
    return 0 if plan.feasible else 1
