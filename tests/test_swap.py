"""Swapping (issue 11, seeds/004 Sections 5.2 and 6.2): offload/reload statements in the
simulator's two streams, the swap pass, and the solvers that swap. Torch-free."""

import glob

import pytest
from hypothesis import HealthCheck, given, settings

from remat.cost.transfer import Link, link_for_graph
from remat.errors import InfeasibleBudgetError
from remat.graph.examples import offload_chain, offload_chain_statements
from remat.graph.graph import Graph, Node
from remat.graph.io import load_graph
from remat.plans.plan import Decision, Plan
from remat.plans.schedule import Schedule, schedule_from_saved_set
from remat.plans.simulator import simulate
from remat.solvers import solve
from remat.solvers.magis.swap import gaps, swap
from remat.solvers.magis.trade import trade
from paths import CHECKMATE_DIR
from strategies import joint_graphs

FAST = Link(float("inf"))  # copies take no time
ONE = Link(100.0)  # a 100-byte value takes one cost unit to copy


def chain() -> Graph:
    """x -> f0 -> f1 -> f2 -> f3 (the output); the backward reads f2, f1, f0 in turn. Every
    value 100 bytes, every op one unit of cost."""
    return offload_chain()


def base() -> list[tuple[str, str]]:
    return offload_chain_statements(None)


def swapped(reload_before: str = "b1") -> list[tuple[str, str]]:
    """f0 offloaded after its compute, freed after f1 reads it, reloaded before ``reload_before``."""
    return offload_chain_statements(reload_before)


def test_the_step_without_swapping_peaks_at_seven_values_and_takes_eight_units():
    r = simulate(Schedule.from_list(chain(), base()))
    assert r.valid and r.peak_bytes == 700 and r.predicted_seconds == 8.0
    assert r.offloads == r.reloads == 0 and r.wait_seconds == 0


def test_offloading_f0_lowers_the_peak_by_its_bytes_once_the_copy_is_done():
    r = simulate(Schedule.from_list(chain(), swapped()), link=FAST)
    assert r.valid, r.errors
    assert r.peak_bytes == 600 and r.offloads == r.reloads == 1
    assert r.host_peak_bytes == 100


def test_compute_stalls_at_the_free_until_a_slow_offload_is_done():
    """As the lowering runs it (its ao.wait_tensor at the free): the copy of f0 takes 10 units
    from t=1; compute reaches f0's free at t=2 and waits there until t=11, then f0's memory
    goes. The reload before b1 starts at t=15 and ends at t=25; b1 and b0 end at 27."""
    r = simulate(Schedule.from_list(chain(), swapped()), link=Link(10.0))
    assert r.valid and r.peak_bytes == 600
    assert r.predicted_seconds == pytest.approx(27.0) and r.wait_seconds == pytest.approx(19.0)
    stall = [(a, b) for kind, a, b in r.times if kind == "wait"]
    assert stall == [(pytest.approx(2.0), pytest.approx(11.0))]


def test_compute_waits_for_a_reload_placed_right_before_its_reader():
    r = simulate(Schedule.from_list(chain(), swapped("b1")), link=ONE)
    assert r.valid and r.peak_bytes == 600
    assert r.wait_seconds == pytest.approx(1.0) and r.predicted_seconds == pytest.approx(9.0)
    assert r.copy_seconds == pytest.approx(2.0)  # the offload and the reload


def test_a_reload_one_compute_earlier_is_hidden():
    r = simulate(Schedule.from_list(chain(), swapped("b2")), link=ONE)
    assert r.valid and r.peak_bytes == 600
    assert r.wait_seconds == 0 and r.predicted_seconds == 8.0


def test_a_synchronous_link_adds_every_copy_to_the_step():
    r = simulate(Schedule.from_list(chain(), swapped("b2")), link=Link(100.0, asynchronous=False))
    assert r.valid and r.predicted_seconds == pytest.approx(10.0)


@pytest.mark.parametrize("edit, message", [
    (lambda s: [x for x in s if x != ("offload", "f0")], "was not offloaded"),
    (lambda s: [x for x in s if x != ("reload", "f0")][:-1], "offloaded: reload it first"),
    (lambda s: [("offload", "f3")] + s, "not resident"),
    (lambda s: [("offload", "x")] + s, "stay on the device"),
    (lambda s: s[:2] + [("offload", "f0")] + s[2:], "already has a host copy"),
])
def test_the_simulator_rejects_copies_that_cannot_run(edit, message):
    r = simulate(Schedule.from_list(chain(), edit(swapped())), link=FAST)
    assert not r.valid and any(message in e for e in r.errors), r.errors


def test_a_plan_with_copies_round_trips_through_json_and_says_offload():
    g = chain()
    p = Plan.from_schedule(Schedule.from_list(g, swapped()), solver="test").judge()
    assert p.decisions["f0"] == Decision.OFFLOAD and "f0" in p.saved_names
    back = Plan.from_dict(p.to_dict(), graph=g)
    assert back.schedule().to_list() == p.schedule().to_list()


def test_the_swap_pass_finds_the_hand_made_swap():
    g = chain()
    s = Schedule.from_list(g, base())
    out = swap(s, budget=600, link=FAST)
    r = simulate(out, link=FAST)
    assert r.valid and r.peak_bytes <= 600 and out.offloaded
    assert out.compute_counts() == s.compute_counts()  # swapping never adds or drops a compute


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joint_graphs(max_forward=8, max_backward=5))
def test_swapping_keeps_every_value_a_reader_needs_and_never_raises_the_peak(g):
    saved = [n.name for n in g.nodes if n.is_forward]
    try:
        s = schedule_from_saved_set(g, saved)
    except Exception:
        return
    before = simulate(s, link=FAST)
    if not before.valid:
        return
    for link in (FAST, Link(7.0), Link(7.0, asynchronous=False)):
        out = swap(s, budget=0, link=link)
        r = simulate(out, link=link)
        assert r.valid, r.errors  # every read finds its value resident (reloaded in time)
        assert r.peak_bytes <= before.peak_bytes
        assert out.compute_counts() == s.compute_counts()
        assert all(gp.after < gp.before for gp in gaps(out))


CHECKMATE = sorted(glob.glob(str(CHECKMATE_DIR / "*train_nx.json")))


def test_below_recomputation_s_floor_swap_recompute_finds_a_plan_that_replays():
    g = load_graph(next(f for f in CHECKMATE if "vgg_unet" in f))
    with pytest.raises(InfeasibleBudgetError) as e:
        solve(g, "checkmate", budget=0.3, time_limit=10)  # recomputation alone cannot reach 0.3
    floor = e.value.smallest_feasible
    fast = link_for_graph(g).bandwidth * 4
    least = solve(g, "swap-recompute", budget="min", bandwidth=fast, time_limit=20)
    budget = (least.peak_bytes + floor) // 2  # below recomputation's floor
    p = solve(g, "swap-recompute", budget=budget, bandwidth=fast, time_limit=20)
    assert p.feasible and p.peak_bytes <= budget < floor
    r = simulate(p.schedule(), link=Link(fast))
    assert r.valid and r.peak_bytes == p.peak_bytes and r.offloads > 0


@pytest.mark.parametrize("solver", ["swap", "swap-recompute"])
def test_every_swap_solver_returns_a_schedule_the_simulator_replays_within_budget(solver):
    g = chain()
    p = solve(g, solver, budget=1.0, time_limit=10)
    assert p.feasible and simulate(p.schedule()).valid and p.peak_bytes <= p.budget


def test_a_recomputation_is_traded_for_a_swap_when_the_copy_is_hidden():
    g = chain()
    s = schedule_from_saved_set(g, ["x", "f1", "f2"])  # f0 computed again from x in the backward
    r = simulate(s, link=FAST)
    assert r.recomputes == 1
    out = trade(s, r.peak_bytes, link=FAST)
    r2 = simulate(out, link=FAST)
    assert r2.valid and r2.recomputes == 0 and r2.offloads == 1
    assert r2.peak_bytes <= r.peak_bytes
    assert r2.predicted_seconds == pytest.approx(r.predicted_seconds - 1.0)  # f0's compute saved
    # over a link too slow to hide the copy, recomputing stays cheaper
    assert trade(s, r.peak_bytes, link=Link(1.0)).statements == s.statements
