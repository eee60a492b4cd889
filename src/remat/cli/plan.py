"""``remat plan GRAPH.json``: plan a saved graph, with or without a memory budget."""

from __future__ import annotations

import json


def _result_dict(graph, r, budget_arg) -> dict:
    d = r.to_dict()
    d = {"graph": graph.name, "budget_arg": budget_arg, **d}
    d["budget"] = int(r.budget)
    return d


def cmd_plan_budget(args) -> int:
    from ..solvers.auto import budget_solvers
    from ..plans.budget import resolve_budget
    from ..graph.io import load_graph

    graph = load_graph(args.graph)
    solvers = budget_solvers()
    if args.solver not in solvers:
        raise SystemExit(f"remat plan: solver {args.solver!r} takes no budget; budgeted solvers: "
                         f"{', '.join(sorted(solvers))}")
    limit = resolve_budget(graph, args.budget)
    kwargs = {"time_limit": args.time_limit} if args.solver in ("checkmate", "checkmate-lp") else {}
    r = solvers[args.solver](graph, limit, **kwargs)
    if args.json:
        print(json.dumps(_result_dict(graph, r, args.budget), indent=1))
    else:
        print(_summary(graph, r))
    return 0 if r.feasible else 1


def _summary(graph, r) -> str:
    from ..plans.plan import _fmt_bytes

    lines = [f"remat plan for {graph.name!r}: solver {r.solver}, budget {_fmt_bytes(r.budget)}"]
    if r.feasible:
        lines.append(f"  feasible ({r.status}): peak {_fmt_bytes(r.peak_bytes)}, cost {r.cost:.6g}"
                     + (f", gap {r.gap:.2%}" if r.gap is not None else "")
                     + f", {r.sim.recomputes} recomputations, solved in {r.solve_seconds:.2f} s")
        lines.append(f"  schedule: {len(r.schedule)} statements (--json prints them)")
    else:
        lines.append(f"  not feasible ({r.status}): {r.message or 'no schedule within the budget'}")
    return "\n".join(lines)


def cmd_plan(args) -> int:
    from ..graph.io import load_graph
    from ..solvers import solve

    if args.budget is not None:
        from .plan import cmd_plan_budget

        args.solver = args.solver or "checkmate"
        return cmd_plan_budget(args)
    args.solver = args.solver or "mincut"
    if args.solver != "mincut":
        raise SystemExit(f"remat plan: solver {args.solver!r} needs --budget (only mincut plans without one)")
    graph = load_graph(args.graph)
    options = {"mode": args.mode} if args.solver == "mincut" else {}
    plan = solve(graph, args.solver, **options)
    if args.json:
        out = {
            "graph": graph.name, "solver": plan.solver, "options": plan.options,
            "saved": plan.saved_names, "cost": plan.cost, "solve_seconds": plan.solve_seconds,
            "saved_activation_bytes": plan.saved_activation_bytes, "recomputed": plan.recomputed,
            "stats": plan.stats,
        }
        print(json.dumps(out, indent=1))
    else:
        print(plan.summary())
    return 0
