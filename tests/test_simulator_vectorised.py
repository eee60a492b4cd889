"""The simulator's array path (remat.plans.simulator.vectorised) gives the replay's result,
field by field, and the schedule builder's shortcuts (shared statements, the remembered codes,
the remembered backward work) never change an answer: torch-free."""

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from remat.cost.model import CostModel, DeviceProfile, default_cost_model
from remat.cost.transfer import Link
from remat.errors import PlanError
from remat.graph.examples import cos_cos_graph
from remat.graph.graph import Graph, Node
from remat.graph.io import load_graph
from remat.graph.synthetic import synthetic_joint_graph
from remat.plans.saved_set import backward_work
from remat.plans.schedule import Schedule, Statement, schedule_from_saved_set
from remat.plans.simulator import simulate
from remat.plans.simulator.replay import replay
from remat.plans.simulator.state import Replay
from remat.plans.simulator.vectorised import Times, vectorised
from remat.solvers import solve
from strategies import joint_graphs


def _replayed(s: Schedule, cm: CostModel, **kw):
    return replay(s, Replay(s, cm, Link(float("inf")), timeline=kw.get("timeline", True),
                            kernel_groups=True, copies=False))


def _same(a, b) -> None:
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    assert da.keys() == db.keys()
    for k in da:
        assert da[k] == db[k], k


def _check(s: Schedule, cm: CostModel | None = None) -> bool:
    """The array path's result equals the replay's (True), or it left the schedule to the replay."""
    cm = cm or default_cost_model(s.graph)
    for timeline in (True, False):
        fast = vectorised(s, cm, timeline=timeline)
        slow = _replayed(s, cm, timeline=timeline)
        if fast is None:
            assert simulate(s, cm, timeline=timeline) == slow
            return False
        _same(fast, slow)
    return True


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=joint_graphs(max_forward=10, max_backward=6), seed=hst.integers(0, 2**16))
def test_array_path_equals_the_replay_on_saved_sets_and_broken_schedules(g, seed):
    rng = np.random.default_rng(seed)
    forward = [n.name for n in g.nodes if n.role == "forward"]
    primals = [n.name for n in g.nodes if n.is_primal]
    try:
        s = schedule_from_saved_set(g, primals + [x for x in forward if rng.random() < 0.5])
    except PlanError:
        return
    other = CostModel(DeviceProfile("t", peak_flops=1e9, bandwidth=1e8, launch_seconds=1e-6))
    # a valid compute/free schedule always takes the array path
    assert _check(s) or not simulate(s).valid
    assert _check(s, other) or not simulate(s).valid
    stmts = list(s.statements)
    if len(stmts) > 2:  # dropped, repeated and swapped statements: the replay names the problem
        k = int(rng.integers(len(stmts)))
        for broken in (stmts[:k] + stmts[k + 1:], stmts[:k + 1] + stmts[k:], stmts[::-1], stmts[:k]):
            _check(Schedule(g, broken))


def test_array_path_on_synthetic_and_checkmate_graphs_with_several_solvers():
    for g in (synthetic_joint_graph(400, seed=3), load_graph("checkmate:ResNet50"), load_graph("checkmate:VGG16")):
        for solver in ("mincut-conservative", "mincut-aggressive", "checkpoint-all", "chen-sqrtn"):
            assert _check(solve(g, solver).schedule()), solver


def test_views_share_storage_on_the_array_path():
    b = 64
    nodes = [Node("x", "input", (), role="input", bytes=b),
             Node("a", "mul", ("x",), bytes=b),
             Node("v", "view", ("a",), bytes=b, category="view", meta={"alias_of": "a"}),
             Node("w", "transpose", ("v",), bytes=b, category="view", meta={"alias_of": "v"}),
             Node("o", "sum", ("w", "a"), bytes=4, is_output=True),
             Node("t", "tangent", (), role="tangent", bytes=4),
             Node("gw", "mul", ("t", "w"), role="backward", bytes=b),
             Node("gx", "mul", ("gw", "a"), role="backward", bytes=b, backward_output=True)]
    g = Graph(nodes)
    for saved in (["a", "w"], ["a"], ["x", "a", "v", "w"]):
        assert _check(schedule_from_saved_set(g, ["x"] + saved))


def test_times_are_made_when_first_read_and_equal_the_replays():
    g = cos_cos_graph()
    s = schedule_from_saved_set(g, ["add_2"])
    r = simulate(s)
    assert isinstance(r.times, Times) and r.times._items is None
    assert len(r.times) == len(s.statements) and r.times._items is None
    want = _replayed(s, default_cost_model(g)).times
    assert r.times == want and want == r.times and list(r.times) == want and r.times[3] == want[3]
    assert [k for k, *_ in r.times].count("compute") == len(s.computes)


def test_a_schedule_changed_after_it_was_built_is_judged_as_it_is():
    g = cos_cos_graph()
    s = schedule_from_saved_set(g, ["add_2"])
    assert simulate(s).valid
    k = s.statements.index(Statement("free", "add"))
    s.statements[k] = Statement("free", "add_1")  # freed twice now: the remembered codes are stale
    r = simulate(s)
    assert not r.valid and "not resident" in r.errors[0]
    same_list = schedule_from_saved_set(g, ["add_2"])
    same_list.statements.append(Statement("free", "add"))
    assert not simulate(same_list).valid


def test_remembered_backward_work_answers_only_the_same_saved_set():
    g = cos_cos_graph()
    a = backward_work(g, ["add_2"])
    b = backward_work(g, ["add_2", "cos"])
    assert a.recomputed == ("cos",) and b.recomputed == ()
    assert backward_work(g, ["add_2"]) == a
    assert backward_work(g, ["cos", "add_2"]).recomputed == ()


def test_saved_set_schedules_share_the_graphs_statements():
    g = synthetic_joint_graph(300, seed=1)
    plan = solve(g, "mincut-conservative")
    s1 = schedule_from_saved_set(g, plan.saved_names)
    s2 = schedule_from_saved_set(g, plan.saved_names)
    assert s1.statements == s2.statements and s1.statements is not s2.statements
    assert all(x is y for x, y in zip(s1.statements, s2.statements))
    assert all(type(x) is Statement for x in s1.statements)
