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

``--frontier`` plans the graph for every budget instead (no budget, ``--fractions``, ``min``,
``--max-overhead``, default 0.1) and prints the memory/time frontier
(:func:`remat.solvers.tradeoff.tradeoff`): the points none smaller and faster than another,
then each budget's pick, a dominated one marked; ``--json`` prints it as JSON, ``--plot PNG``
draws it (peak against step time over the reference's, each pick labelled).

``--device H100`` (or ``--profile FILE``) plans the graph for that device, whatever it was
captured on: the graph records it and its profile prices the plan (``remat.plan``'s ``device=``
and ``profile=``).
"""

from __future__ import annotations

import sys

from ..errors import InfeasibleBudgetError, OptionError
from ..graph.io import load_graph
from ..plans.budget import TORCH_HEADROOM, Budget
from ..solvers import check_time_limit, info, names, solve
from ..solvers.progress import shown
from ..step.tradeoff import FRACTIONS, OVERHEADS, size_unit, tradeoff


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


def retarget(graph, args):
    """``--device`` / ``--profile``: the graph planned for that device, as ``remat.plan``'s
    ``device=`` / ``profile=`` plan a captured one: ``meta["device"]`` records it (with the
    graph's dtype) and the cost model prices it with its profile
    (:class:`remat.capture.target.Target`)."""
    if getattr(args, "device", None) is None and getattr(args, "profile", None) is None:
        return graph
    from ..capture.target import Target  # no torch: the cost model's profiles only

    graph.meta["device"] = Target.create(args.device, args.profile).device_meta(graph.meta.get("device") or {})
    return graph


def run(args) -> int:
    if getattr(args, "frontier", False):
        return _frontier(args)
    budget = None if args.budget is None else Budget.parse(args.budget)
    time_limit = check_time_limit(args.time_limit)
    graph = retarget(load_graph(args.graph), args)
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


def _frontier(args) -> int:
    """``remat plan GRAPH --frontier``: the table, or ``--json``; ``--plot`` draws it."""
    if args.budget is not None:
        raise OptionError("--frontier asks every budget itself (no budget, --fractions, min, "
                          "--max-overhead): give --fractions instead of --budget")
    plt = _pyplot() if args.plot else None  # before any work: a missing matplotlib says so now
    graph = retarget(load_graph(args.graph), args)
    options = _link_options(graph, args)
    fractions = FRACTIONS if args.fractions is None else [f.strip() for f in args.fractions.split(",")]
    overheads = OVERHEADS if args.max_overhead is None else (args.max_overhead,)
    with shown(f"the frontier of {graph.name} ({len(graph)} nodes) with {args.solver}", plain=False):
        t = tradeoff(graph, solver=args.solver, fractions=fractions, overheads=overheads,
                     time_limit=check_time_limit(args.time_limit), solver_options=options)
    print(t.to_json() if args.json else t.table())
    if plt is not None:
        print(f"wrote {frontier_plot(t, args.plot, plt)}", file=sys.stderr)
    return 0


def _pyplot():
    """matplotlib's pyplot on the Agg backend; :class:`OptionError` naming the install if it is
    missing."""
    try:
        import matplotlib
    except ImportError:
        raise OptionError("--plot draws with matplotlib, which is not installed: pip install "
                          "'remat[bench]' (or pip install matplotlib)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def frontier_plot(t, path, plt=None):
    """Draw the frontier ``t`` (a :class:`~remat.solvers.tradeoff.Tradeoff`) into the PNG
    ``path``: peak (MiB) against predicted step time over the reference's, the points joined,
    the reference starred, each budget's pick labelled and a dominated pick crossed in red.
    Returns the path."""
    plt = plt or _pyplot()
    unit, _ = size_unit(t.reference["peak_bytes"])
    mib = float({"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit])
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    xs = [p.peak_bytes / mib for p in t.points]
    ys = [p.ratio for p in t.points]
    ax.plot(xs, ys, "o-", color="tab:blue", label="frontier (non-dominated)", zorder=2)
    ref = t.reference
    ax.plot([ref["peak_bytes"] / mib], [1.0], "*", color="tab:gray", markersize=12,
            label=f"reference ({ref['name']})", zorder=3)
    at: dict[tuple[int, float], list[str]] = {}
    for k in t.picks:
        if k.peak_bytes is not None:
            at.setdefault((k.peak_bytes, round(k.ratio, 9)), []).append(
                k.budget + ("" if k.met else " (missed)"))
    dominated = [k for k in t.picks if k.peak_bytes is not None and not k.on_frontier]
    if dominated:
        ax.plot([k.peak_bytes / mib for k in dominated], [k.ratio for k in dominated], "x", color="tab:red",
                markersize=10, markeredgewidth=2, label="dominated pick", zorder=4)
    # labels of nearby points alternate sides, so that they do not overlap
    sides = (((10, 10), "left"), ((10, -16), "left"), ((-10, 10), "right"), ((-10, -16), "right"))
    for i, ((peak, ratio), labels) in enumerate(sorted(at.items())):
        offset, align = sides[i % len(sides)]
        ax.annotate(", ".join(labels), (peak / mib, ratio), textcoords="offset points", xytext=offset,
                    ha=align, fontsize=8, arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray"})
    ax.set_xlabel(f"predicted peak ({unit})")
    ax.margins(x=0.2, y=0.1)
    ax.set_ylabel(f"predicted step time / {ref['name']}'s")
    ax.set_title(f"{t.graph_name}: memory against time ({t.solver})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
