"""The memory/time frontier (issue 39, item 7): remat.step.tradeoff, remat.frontier and
``remat plan --frontier``.

On the seeds' small graphs (seeds/003's f(a,b,c,d) = cos(cos(a+b+c+d)), the offload chain) and
random joint graphs: the points are pairwise non-dominated valid plans, each budget's pick is
what remat.solve returns for it, within its budget when met, a fraction's ``runs_min`` is what
remat.compile's step planner runs, and a dominated pick is reported as one.
"""

from __future__ import annotations

import json
import warnings

import pytest
from hypothesis import HealthCheck, given, settings

import remat.step.tradeoff as tradeoff_module
from remat.cli.main import main
from remat.errors import InfeasibleBudgetError, RematError
from remat.graph.examples import cos_cos_graph, offload_chain
from remat.graph.io import save_graph
from remat.plans.budget import Budget, reference_peak
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.solvers.auto import min_seconds
from remat.solvers.registry import request
from remat.step.tradeoff import Point, Tradeoff, dominates, tradeoff
from remat.step.planner import StepPlanner
from strategies import joint_graphs

FEW = (1.0, 0.6, 0.3)


def exactly_dominates(a, b) -> bool:
    return a.peak_bytes <= b.peak_bytes and a.predicted_seconds <= b.predicted_seconds \
        and (a.peak_bytes, a.predicted_seconds) != (b.peak_bytes, b.predicted_seconds)


def solved(g, k, **extra):
    """What remat.solve returns for the pick ``k``'s budget: (plan, reached) or (None, error).
    A fraction is asked as the step planner asks auto: the starting plans first, and the search
    only where min's plan meets the share."""
    budget = {"none": None, "min": "min", "overhead": None}.get(k.kind, k.value)
    if k.kind == "overhead":
        extra["max_overhead"] = k.value
    if k.kind == "fraction" and not extra:
        extra = {"staged_within": min_seconds(g)}
        plan, reached = solved(g, k, search=False, **extra)
        least = solve(g, "auto", budget="min", time_limit=None)
        if reached or plan is None or least.peak_bytes > Budget.parse(k.value).bytes_for(g):
            return plan, reached
    try:
        return solve(g, "auto", budget=budget, time_limit=None, **extra), True
    except InfeasibleBudgetError as e:
        return e.plan, False
    except RematError as e:
        return None, e


def compiled_plan(g, fraction: float):
    """The plan remat.compile's step planner runs for a step of the one graph ``g`` at
    ``fraction`` (None where it cannot plan it)."""
    planner = StepPlanner(request("auto", budget=fraction, time_limit=None), cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return planner.plan(g)[1]
        except RematError:
            return None


def check(t: Tradeoff, g) -> None:
    """The properties every frontier has."""
    pts = t.points
    assert all(not exactly_dominates(a, b) for a in pts for b in pts if a is not b), "a point is dominated"
    assert [p.peak_bytes for p in pts] == sorted(p.peak_bytes for p in pts)
    for p in pts:
        if p.kept == "plan":  # a full plan: its numbers are a fresh replay's
            sim = simulate(p.plan.schedule(), link=p.plan.link)
            assert sim.valid
            assert (sim.peak_bytes, sim.predicted_seconds) == (p.peak_bytes, p.predicted_seconds)
        else:
            assert p.kept == "summary" and p.plan is None
    assert t.reference["peak_bytes"] == reference_peak(g)
    for k in t.picks:
        plan, reached = solved(g, k)
        if k.peak_bytes is None:  # no plan at all: solve has none either
            assert plan is None or plan.peak_bytes is None or plan.sim is None or not plan.sim.valid
            continue
        assert (plan.solver, plan.peak_bytes, plan.predicted_seconds) == \
            (k.solver, k.peak_bytes, k.predicted_seconds), k.budget
        assert k.on_frontier == (not any(dominates(p, k) for p in pts))
        if k.on_frontier:  # one of the points
            assert any(p.peak_bytes == k.peak_bytes and not dominates(p, k) and not dominates(k, p) for p in pts)
        else:
            assert exactly_dominates(pts[k.dominated_by], k) and "DOMINATED" in t.table()
        if k.kind == "fraction":
            bound = Budget.parse(k.value).bytes_for(g)
            assert k.bound_bytes == bound
            assert k.met == reached
            if k.met:
                assert k.peak_bytes <= bound
            else:  # the least peak the solve found
                assert k.out_of_reach and k.peak_bytes > bound
            ran = compiled_plan(g, k.value)  # what remat.compile runs: this pick or min's
            if ran is not None:
                expect = t.pick("min") if k.runs_min else k
                assert (ran.peak_bytes, ran.predicted_seconds) == (expect.peak_bytes, expect.predicted_seconds)
            if k.best is not None:  # the fastest plan found within the budget
                assert k.best.peak_bytes <= bound
                assert all(p.predicted_seconds >= k.best.predicted_seconds for p in pts if p.peak_bytes <= bound)
    d = json.loads(t.to_json())
    assert d["format"] == "remat.tradeoff" and d["version"] == 1
    assert [p["peak_bytes"] for p in d["points"]] == [p.peak_bytes for p in pts]
    assert [k["budget"] for k in d["picks"]] == [k.budget for k in t.picks]


def test_offload_chain_frontier():
    """The offload chain: three points, from the plan without a budget (700 B, 1.0x) down to the
    least memory found; each fraction's pick is the fastest point within it."""
    g = offload_chain()
    t = tradeoff(g, fractions=(1.0, 0.9, 0.8, 0.5))
    check(t, g)
    assert [k.budget for k in t.picks] == ["none", "1.0", "0.9", "0.8", "0.5", "min", "overhead 0.1"]
    none = t.pick("none")
    assert none.solver == "mincut-conservative" and none.on_frontier
    assert t.points[-1].peak_bytes == none.peak_bytes == 700
    assert len(t.points) >= 3 and t.points[0].peak_bytes < 700
    assert t.pick("0.9").met and t.pick("0.9").peak_bytes <= Budget.parse(0.9).bytes_for(g)
    least = min(p.peak_bytes for p in t.points)
    assert t.pick("0.5").out_of_reach == (Budget.parse(0.5).bytes_for(g) < least)
    text = t.table()
    assert "frontier of 'chain'" in text and "overhead 0.1" in text and "out of reach" in text


def test_cos_cos_frontier_names_the_reference():
    """seeds/003's f1: the saved set {add_2} is the plan without a budget; the reference of a graph
    without a recorded partition is checkpoint-all."""
    g = cos_cos_graph()
    t = tradeoff(g, fractions=FEW)
    check(t, g)
    assert t.reference["name"] == "checkpoint-all"
    assert t.pick("none").plan.saved_names == ["add_2"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joint_graphs(max_nodes=12))
def test_random_graphs(g):
    check(tradeoff(g, fractions=FEW, overheads=(0.1,)), g)


def test_non_dominated_merges_ties_and_keeps_full_plans():
    """Two plans with the same numbers are one point (a full plan kept over a summary); a point
    as small and as fast as another removes it, ties in time within SAME included."""
    P = lambda peak, sec, solver="s", kept="summary": Point(peak, sec, solver, 0.0, 1.0, kept, ("x",))
    found = [P(10, 5.0), P(10, 5.0, "full", "plan"), P(12, 5.0 * (1 + 1e-12)), P(8, 7.0), P(9, 7.0), P(14, 4.0)]
    merged = tradeoff_module._merged(found)
    front = tradeoff_module._non_dominated(merged)
    assert [(p.peak_bytes, p.predicted_seconds) for p in front] == [(8, 7.0), (10, 5.0), (14, 4.0)]
    assert front[1].solver == "full" and front[1].kept == "plan"


def test_a_dominated_pick_is_reported(monkeypatch):
    """A budget whose solve returns a plan another solve beats in both memory and time is
    reported as dominated, with the point that beats it and the best plan within its budget
    (here 0.9's solve is made to use the aggressive min cut, which on the chain recomputes
    for no memory saved: 700 B in 11 s, where the plan without a budget takes 700 B in 8 s)."""
    g = offload_chain()
    real = tradeoff_module.solve

    def aggressive_at_09(graph, solver, *, budget=None, **kw):
        if budget is not None and budget.kind == "fraction" and budget.value == 0.9:
            solver = "mincut-aggressive"
            kw.pop("staged_within", None)  # auto's options
            kw.pop("search", None)
        return real(graph, solver, budget=budget, **kw)

    monkeypatch.setattr(tradeoff_module, "solve", aggressive_at_09)
    t = tradeoff(g, fractions=(1.0, 0.9), overheads=())
    k = t.pick("0.9")
    assert (k.solver, k.peak_bytes, k.predicted_seconds) == ("mincut-aggressive", 700, 11.0)
    assert k.out_of_reach and not k.on_frontier
    assert (t.points[k.dominated_by].peak_bytes, t.points[k.dominated_by].predicted_seconds) == (700, 8.0)
    assert k.best is not None and k.best.peak_bytes <= k.bound_bytes < 700 and k.best_is_better
    text = t.table()
    assert "DOMINATED by #" in text and "faster within the budget" in text
    assert t.pick("1.0").on_frontier and all(p.predicted_seconds != 11.0 or p.peak_bytes < 700 for p in t.points)


def test_cli_frontier_json_and_plot(tmp_path, capsys):
    path = tmp_path / "g.json"
    save_graph(cos_cos_graph(), path)
    assert main(["plan", str(path), "--frontier", "--fractions", "1.0,0.5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"] == "remat.tradeoff" and [k["budget"] for k in d["picks"]] == \
        ["none", "1.0", "0.5", "min", "overhead 0.1"]
    assert main(["plan", str(path), "--frontier", "--fractions", "0.8", "--max-overhead", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "frontier of 'cos_cos'" in out and "overhead 0.5" in out
    assert main(["plan", str(path), "--frontier", "--budget", "0.5"]) == 2
    assert "--fractions instead of --budget" in capsys.readouterr().err
    assert main(["plan", str(path), "--frontier", "--fractions", "6GiB"]) == 2
    pytest.importorskip("matplotlib")
    png = tmp_path / "f.png"
    assert main(["plan", str(path), "--frontier", "--fractions", "0.8", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib_names_the_install(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.json"
    save_graph(cos_cos_graph(), path)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib fails
    assert main(["plan", str(path), "--frontier", "--plot", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "matplotlib" in err and not (tmp_path / "f.png").exists()


def test_remat_frontier_on_an_mlp():
    """remat.frontier captures the step as remat.plan does: one frontier per graph, against plain
    torch.compile's partition, each pick what remat.solve returns for the captured graph."""
    torch = pytest.importorskip("torch")
    import remat

    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    ts = remat.frontier(mlp, torch.randn(4, 8), compiler="eager", fractions=(0.8,), overheads=())
    assert len(ts) == 1 and isinstance(ts[0], Tradeoff)
    t = ts[0]
    assert t.reference["name"] == "torch.compile"
    assert [k.budget for k in t.picks] == ["none", "0.8", "min"]
    for k in t.picks:
        plan, _ = solved(t.graph, k)
        assert (plan.peak_bytes, plan.predicted_seconds) == (k.peak_bytes, k.predicted_seconds)
    assert "frontier of" in str(ts) and json.loads(ts.to_json())["graphs"][0]["graph"] == t.graph_name


def test_a_frontier_with_fission_picks_what_the_step_planner_runs():
    """On a graph with dimensions, where MAGIS's search runs, each fraction's pick is what
    remat.compile's step planner runs: the search for a share only where min's plan meets it
    (0.9 and 0.8 here), min's plan where the share is out of reach (0.5, 0.3)."""
    from test_fission import mlp_graph

    g = mlp_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tradeoff(g, fractions=(0.9, 0.8, 0.5, 0.3), overheads=())
        check(t, g)
    assert [t.pick(f).runs_min for f in ("0.9", "0.8", "0.5", "0.3")] == [False, False, True, True]
