"""Checkmate's MILP and LP rounding (remat.solvers.checkmate, remat.solvers.checkmate.lp_rounding).

The MILP is checked against exhaustive search on tiny random DAGs. Exhaustive search covers
Checkmate's whole search space: a frontier-advancing schedule is a pair (R, S) of the staged
problem (seeds/001 Section 4.6). For a fixed checkpoint matrix S, ``solve_r`` returns the
least R that satisfies (1b), (1c) and (8a): every entry it sets is forced by one of them, so
every correct R for that S contains it. Computing a subset of the nodes of each stage never
costs more, and never holds more memory at any compute of Algorithm 1's emission (each value
is freed at or before the point where the larger R frees it), so for every (R, S) the pair
(solve_r(S), S) is at least as good in cost and simulated peak. Hence the minimum over all
2^(n(n-1)/2) matrices S (no entry fixed, n = 4 or 5 stage nodes: at most 1024 schedules) of
the simulated cost of (solve_r(S), S) within the budget is the optimum of the space.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from remat.cost.model import default_cost_model
from remat.graph.graph import Graph, Node
from remat.plans.simulator import simulate
from remat.solvers.checkmate.milp import checkmate, min_budget
from remat.solvers.checkmate.bounds import checkpoint_all, checkpoint_all_peak, memory_lower_bound
from remat.solvers.checkmate.lp_rounding import checkmate_lp
from remat.solvers.checkmate.model import build_model, constant_bytes
from remat.plans.stages import schedule_from_rs, solve_r, staged

from paths import CHECKMATE_DIR

REL = 1e-6


def tiny_graph(seed: int, n_stage: int, views: bool = False, once: bool = False,
               work: bool = False) -> Graph:
    """A random DAG: one or two primal inputs, ``n_stage`` computed nodes reading 1-3 earlier
    values, random sizes (0 included) and costs, some outputs kept to the end, sometimes a
    tangent and backward nodes; with ``views``, some nodes are views sharing their input's
    storage (``meta["alias_of"]``, as capture marks them); with ``once``, some forward nodes
    are random ops or ``must_save`` (never recomputed); with ``work``, some are convolutions,
    which hold a workspace while they run (the CPU cost model's)."""
    rng = np.random.default_rng(seed)
    nodes = [Node("x", "placeholder", (), role="input", bytes=int(rng.integers(0, 6)),
                  category="input")]
    if rng.random() < 0.5:
        nodes.append(Node("w", "placeholder", (), role="param", bytes=int(rng.integers(0, 6)),
                          category="input"))
    fw = [n.name for n in nodes]
    bw: list[str] = []
    n_bw = int(rng.integers(0, 3)) if n_stage >= 4 else 0
    for k in range(n_stage):
        is_bw = k >= n_stage - n_bw
        if is_bw and not bw:  # the backward starts with a tangent
            nodes.append(Node("tan", "placeholder", (), role="tangent",
                              bytes=int(rng.integers(1, 6)), category="input"))
            bw.append("tan")
            continue
        pool = fw + bw if is_bw else fw
        nin = int(rng.integers(1, min(3, len(pool)) + 1))
        ins = list(rng.choice(pool, size=nin, replace=False))
        if is_bw and not any(i in bw for i in ins):
            ins.append(bw[-1])
        name = f"v{k}"
        role = "backward" if is_bw else "forward"
        if views and rng.random() < 0.4 and not (is_bw and ins[0] not in bw):
            base = next(n for n in nodes if n.name == ins[0])
            nodes.append(Node(name, "view", (ins[0],), role=role, bytes=base.bytes,
                              cost=float(rng.integers(0, 3)), category="view",
                              is_output=bool(rng.random() < 0.2),
                              meta={"alias_of": ins[0]}))
        else:
            flag = rng.random() if once and not is_bw else 1.0
            op = "convolution" if work and rng.random() < 0.5 else "op"
            nodes.append(Node(name, op, tuple(ins), role=role,
                              bytes=int(rng.integers(0, 10)), cost=float(rng.integers(1, 10)),
                              category="random" if flag < 0.25 else "compute",
                              must_save=bool(0.25 <= flag < 0.4),
                              is_output=bool(rng.random() < 0.2)))
        (bw if is_bw else fw).append(name)
    return Graph(nodes, name=f"tiny{seed}")


def exhaustive(g: Graph):
    """(cost, peak) of (solve_r(S), S) for every strictly lower triangular S."""
    st = staged(g)
    n = st.n
    ti, ii = np.tril_indices(n, -1)
    cm = default_cost_model()
    out = []
    for bits in itertools.product((False, True), repeat=len(ti)):
        S = np.zeros((n, n), dtype=bool)
        S[ti, ii] = bits
        R = solve_r(st, S)
        sim = simulate(schedule_from_rs(st, R, S), cm, timeline=False)
        if sim.valid:
            out.append((sim.compute_cost, sim.peak_bytes))
    return out


def best_within(results, budget):
    costs = [c for c, p in results if p <= budget]
    return min(costs) if costs else None


def check_result(r, g, budget):
    assert r.feasible, r.message
    assert r.sim.valid
    assert r.peak_bytes <= budget
    sim = simulate(r.schedule())
    assert sim.valid and sim.peak_bytes == r.peak_bytes
    assert math.isclose(sim.compute_cost, r.cost, rel_tol=1e-12)


def _has_view(g: Graph) -> bool:
    return any(n.meta.get("alias_of") for n in g.nodes)


def _has_once(g: Graph) -> bool:
    return bool(staged(g).once.any())


def _has_work(g: Graph) -> bool:
    return any(default_cost_model().workspace(g))


def _form(seed: int) -> str:
    return "paper" if seed % 3 == 0 else "tight"


# (seed, stage nodes, FREE linearization, views, once): both forms are exact; views share
# storage; "once" graphs hold random / must_save nodes, which no schedule may recompute
TINY = [(seed, 4 + seed % 2, _form(seed), False, False) for seed in range(10)]
TINY += [(seed, 4 + seed % 2, _form(seed), True, False)
         for seed in range(200, 260) if _has_view(tiny_graph(seed, 4 + seed % 2, True))][:6]
TINY += [(seed, 5, _form(seed), False, True)
         for seed in range(300, 360) if _has_once(tiny_graph(seed, 5, once=True))][:6]
TINY = [(*case, False) for case in TINY]
TINY += [(seed, 5, _form(seed), False, False, True)
         for seed in range(400, 460) if _has_work(tiny_graph(seed, 5, work=True))][:4]


@pytest.mark.parametrize("seed,n_stage,form,views,once,work", TINY)
def test_milp_matches_exhaustive_search(seed, n_stage, form, views, once, work):
    g = tiny_graph(seed, n_stage, views, once, work)
    assert _has_view(g) == views and _has_once(g) == once and _has_work(g) == work
    assert staged(g).n == n_stage
    results = exhaustive(g)
    peaks = sorted({p for _, p in results})
    lo = peaks[0]
    # a budget at each distinct peak value (where the optimum can change), and one above all
    for budget in peaks + [peaks[-1] + 10]:
        want = best_within(results, budget)
        r = checkmate(g, budget, free_form=form)
        check_result(r, g, budget)
        assert r.status == "optimal"
        assert math.isclose(r.cost, want, rel_tol=REL), (budget, r.cost, want)
        assert r.lower_bound <= r.cost * (1 + REL)
        lp = checkmate_lp(g, budget, free_form=form)
        assert lp.lower_bound is not None and lp.lower_bound <= r.cost * (1 + REL)
        if lp.feasible:
            check_result(lp, g, budget)
            assert lp.cost >= r.cost * (1 - REL)
            assert lp.details["candidates"] >= 1
            assert "threshold" in lp.details and "epsilon" in lp.details
    # below the smallest peak nothing fits: the cheap bound or HiGHS proves it
    r = checkmate(g, lo - 1, free_form=form)
    assert r.status == "infeasible" and not r.feasible and r.statements is None
    assert "infeasible budget" in r.message
    mb = min_budget(g, free_form=form)
    assert mb.status == "optimal" and mb.budget == lo and mb.lower_bound == lo


@pytest.mark.parametrize("form", ["paper", "tight"])
def test_model_accounts_every_schedule_at_least_as_the_simulator(form):
    """The column vector of any (solve_r(S), S) satisfies every row at a budget equal to its
    model peak (U, and the workspace of the op running), and that peak is never below the
    simulated one (Algorithm 1 frees at least as early as FREE); a budget below the
    simulated peak violates a row: the MILP never accepts a schedule the simulator would
    reject. Graphs with views and with convolutions (workspace) included."""
    rng = np.random.default_rng(7)
    graphs = [tiny_graph(100 + seed, 6, views=seed % 2 == 1) for seed in range(6)]
    graphs += [tiny_graph(seed, 6, work=True) for seed in (400, 401, 402)]
    assert sum(map(_has_work, graphs)) >= 3
    for g in graphs:
        m = build_model(g, 10**9, free_form=form)
        for _ in range(20):
            S = m.normalize_s(rng.random((m.n, m.n)) < 0.4)
            R = solve_r(m.st, S)
            x = m.solution_from(R, S)
            assert m.violation(x) <= 1e-9
            model_peak = m.peak_bytes(x)
            sim = simulate(schedule_from_rs(m.st, R, S))
            assert sim.valid and model_peak >= sim.peak_bytes - 1e-6
            tight = build_model(g, sim.peak_bytes, free_form=form)
            x2 = tight.solution_from(R, S)
            assert (tight.violation(x2) <= 1e-9) == (model_peak <= sim.peak_bytes + 1e-6)
            below = build_model(g, sim.peak_bytes - 1, free_form=form)
            assert below.violation(below.solution_from(R, S)) > 1e-9


def two_branch_graph() -> Graph:
    """c = f(a, b) with a = g(p), b = h(q) and large temporaries p, q: whichever branch runs
    second does so while the first branch's result is held, so the smallest peak (20) lies
    above the cheap per-node bound (15)."""
    def op(name, ins, size):
        return Node(name, "op", ins, bytes=size, cost=1.0, category="compute")
    return Graph([
        Node("x", "placeholder", (), role="input", bytes=0, category="input"),
        op("p", ("x",), 10), op("a", ("p",), 5), op("q", ("x",), 10), op("b", ("q",), 5),
        op("c", ("a", "b"), 1),
    ], name="two_branch")


def test_highs_proves_infeasibility_and_names_the_smallest_budget():
    g = two_branch_graph()
    lo = min(p for _, p in exhaustive(g))
    cheap, _ = memory_lower_bound(g)
    assert (cheap, lo) == (15, 20)
    r = checkmate(g, lo - 1)  # above the cheap bound: HiGHS has to prove it
    assert r.status == "infeasible" and not r.feasible
    assert "no frontier-advancing schedule fits in 19 bytes" in r.message
    assert "smallest feasible budget found is 20 bytes" in r.message
    lp = checkmate_lp(g, lo - 1)
    assert not lp.feasible and lp.status in ("infeasible", "no_solution")
    r = checkmate(g, lo)
    check_result(r, g, lo)
    assert r.cost == 5.0  # nothing recomputed


def test_budget_below_constant_overhead_is_infeasible():
    g = tiny_graph(3, 5)
    const = constant_bytes(g)
    assert const == simulate(checkpoint_all(g)).constant_bytes
    for solver in (checkmate, checkmate_lp):
        r = solver(g, const - 1)
        assert r.status == "infeasible" and not r.feasible
        assert "constant overhead" in r.message and str(const) in r.message


def test_kept_values_are_never_freed_and_model_fixes_them():
    for seed in range(30):
        g = tiny_graph(seed, 5)
        st = staged(g)
        if st.kept.any():
            break
    m = build_model(g, 10**6)
    for i in np.flatnonzero(st.kept):
        for t in range(i + 1, st.n):
            assert m.col_lower[m.s_idx[t, i]] == 1.0
        assert not (m.free_cols[:, 1] == i).any()
    r = checkmate(g, checkpoint_all_peak(g))
    kept_names = {st.names[i] for i in np.flatnonzero(st.kept)}
    assert not any(s.op == "free" and s.node in kept_names for s in r.schedule().statements)


def checkmate_graph(prefix: str) -> Graph:
    from remat.graph.io import load_graph

    path = next(CHECKMATE_DIR.glob(prefix + "*.json"), None)
    if path is None:
        pytest.skip(f"Checkmate graph {prefix} not found under {CHECKMATE_DIR}")
    return load_graph(path)


def test_time_limit_returns_incumbent_or_clear_status():
    g = checkmate_graph("vgg_unet")
    lo, _ = memory_lower_bound(g)
    budget = lo + 0.2 * (checkpoint_all_peak(g) - lo)
    r = checkmate(g, budget, time_limit=2.0, explain_infeasible=False)
    assert r.status in ("time_limit", "no_solution", "optimal", "infeasible"), r.status
    if r.status == "time_limit":
        check_result(r, g, budget)
        assert r.lower_bound is not None and r.lower_bound <= r.cost * (1 + REL)
        assert r.gap is not None and 0 <= r.gap <= 1
    elif r.status == "no_solution":
        assert not r.feasible and "time limit" in r.message
    elif r.status == "optimal":
        check_result(r, g, budget)
    # with a starting incumbent (checkpoint-all fits at its own peak) a time limit returns it
    top = checkpoint_all_peak(g)
    r = checkmate(g, top, time_limit=1e-3)
    assert r.details["warm_start"] == "used (checkpoint-all)"
    assert r.status in ("time_limit", "optimal")
    check_result(r, g, top)


def test_vgg16_ample_budget_recomputes_nothing():
    g = checkmate_graph("VGG16")
    total = sum(default_cost_model().op_costs(g))
    top = checkpoint_all_peak(g)
    r = checkmate(g, top)
    check_result(r, g, top)
    assert r.status == "optimal"
    assert r.sim.recomputes == 0
    assert math.isclose(r.cost, total, rel_tol=REL)


def test_vgg16_tight_budget_recomputes_within_budget():
    g = checkmate_graph("VGG16")
    total = sum(default_cost_model().op_costs(g))
    lo, _ = memory_lower_bound(g)
    top = checkpoint_all_peak(g)
    budget = lo + 0.5 * (top - lo)
    r = checkmate(g, budget)
    check_result(r, g, budget)
    assert r.status == "optimal" and r.gap is not None and r.gap <= 1e-6
    assert r.sim.recomputes > 0 and r.cost > total
    lp = checkmate_lp(g, budget)
    assert lp.lower_bound <= r.cost * (1 + REL)
    if lp.feasible:
        check_result(lp, g, budget)
        assert lp.cost >= r.cost * (1 - REL)


from hypothesis import HealthCheck, given, settings  # noqa: E402

from strategies import joint_graphs  # noqa: E402


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joint_graphs(max_inputs=2, max_forward=5, max_tangents=1, max_backward=3, max_nodes=9))
def test_random_joint_graphs_valid_and_consistent(g):
    """On random joint graphs (flags and zero sizes included): at the checkpoint-all peak
    nothing is recomputed; between the smallest budget and that peak both solvers return
    valid schedules within budget, LP rounding never beats the MILP and its bound never
    exceeds it."""
    total = sum(default_cost_model().op_costs(g))
    top = checkpoint_all_peak(g)
    r = checkmate(g, top)
    check_result(r, g, top)
    # a value that may not be saved (must_recompute, can_save=False) never crosses into the
    # backward: the backward recomputes it, whatever the budget
    st = staged(g)
    cannot = g._arrays.cannot_save[st.order] & st.forward_phase & ~st.kept
    crossing = any(cannot[i] and not st.forward_phase[u] for i in range(st.n) for u in st.users[i])
    assert r.status == "optimal"
    if crossing:
        assert r.cost >= total * (1 - REL) - 1e-12
    else:
        assert math.isclose(r.cost, total, rel_tol=REL, abs_tol=1e-12)
    mb = min_budget(g)
    assert mb.status == "optimal" and mb.budget <= top
    assert simulate(mb.schedule).peak_bytes == mb.budget
    budget = (mb.budget + top) // 2
    r = checkmate(g, budget)
    check_result(r, g, budget)
    assert r.status == "optimal"
    lp = checkmate_lp(g, budget)
    assert lp.lower_bound <= r.cost * (1 + REL) + 1e-12
    if lp.feasible:
        check_result(lp, g, budget)
        assert lp.cost >= r.cost * (1 - REL) - 1e-12


def test_lp_warm_start_never_worse_than_lp_rounding():
    g = checkmate_graph("VGG19")
    lo, _ = memory_lower_bound(g)  # VGG19's smallest budget (min_budget proves it)
    budget = lo + 0.1 * (checkpoint_all_peak(g) - lo)
    lp = checkmate_lp(g, budget)
    r = checkmate(g, budget, time_limit=10, warm_start="lp")
    assert r.details["warm_start"].startswith("used")
    if lp.feasible:
        check_result(r, g, budget)
        assert r.cost <= lp.cost * (1 + REL)


def test_models_over_the_column_limit_are_not_built():
    """A graph whose MILP would exceed ``max_columns`` gets status ``too_large`` at once
    (with the estimate, which equals the built model's size), from the MILP, the LP
    rounding and min_budget; ``solve(solver="auto")`` still plans it with the
    baselines."""
    from remat.solvers import solve
    from remat.solvers.checkmate.model import estimated_columns

    g = checkmate_graph("VGG16")
    budget = checkpoint_all_peak(g)
    cols = build_model(g, budget).num_col
    assert estimated_columns(staged(g)) == cols
    r = checkmate(g, budget, max_columns=cols - 1)
    assert r.status == "too_large" and not r.feasible and f"{cols:,} columns" in r.message
    assert checkmate(g, budget, max_columns=cols).status == "optimal"
    assert checkmate_lp(g, budget, max_columns=cols - 1).status == "too_large"
    mb = min_budget(g, max_columns=cols - 1)
    assert mb.status == "too_large" and mb.budget >= mb.lower_bound
    # a 1200-node chain (~2.9M columns) is refused by default, before any model is built
    nodes = [Node("x", "placeholder", (), role="input", bytes=4, category="input")]
    nodes += [Node(f"v{k}", "op", (nodes[-1].name if k == 0 else f"v{k - 1}",), bytes=4,
                   cost=1.0, category="compute") for k in range(1200)]
    chain = Graph(nodes, name="chain")
    r = checkmate(chain, 10**6)
    assert r.status == "too_large" and "build_seconds" not in r.details
    auto = solve(chain, "auto", budget=10**6)
    assert auto.feasible and auto.solver != "checkmate"
    # asked for by name, the MILP cannot plan it at any budget: not a verdict on the budget
    from remat.errors import UnsupportedGraphError

    for budget in (10**6, "min"):
        with pytest.raises(UnsupportedGraphError, match="checkmate cannot plan 'chain'.*solver='auto'"):
            solve(chain, "checkmate", budget=budget)
