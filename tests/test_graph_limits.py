"""Bad input is a remat error at the boundary (remat.graph.limits, remat.graph.io, budgets and
options): each case below crashed, hung or planned nonsense before (OverflowError,
RecursionError, an unbounded gzip, an empty graph planned with a peak of 0). Torch only for the
options of remat.compile and remat.checkpoint."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pytest

import remat
from remat.errors import BudgetError, GraphError, OptionError
from remat.graph import Graph
from remat.graph.examples import cos_cos_graph
from remat.graph.io import graph_to_dict, load_graph
from remat.plans.budget import Budget


def _write(tmp_path, doc, name="g.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc, allow_nan=True))
    return str(path)


def _with(field: str, value, node: int = 4) -> dict:
    doc = graph_to_dict(cos_cos_graph())
    doc["nodes"][node][field] = value
    return doc


@pytest.mark.parametrize("field, value, match", [
    ("bytes", 2**63, "more than 1 PiB"),
    ("bytes", 2**51, "more than 1 PiB"),
    ("flops", float("inf"), "not finite"),
    ("flops", float("nan"), "not finite"),
    ("flops", 1e308, "FLOPs must be a finite number from 0 to 1e\\+30"),
    ("cost", 1e308, "compute cost must be a finite number"),
    ("shape", [-1, 4], "'shape' holds -1"),
    ("shape", [2**60], "'shape' holds"),
    ("shape", [1.5], "'shape' holds 1.5"),
    ("shape", list(range(80)), "at most 64 sizes"),
    ("op", 3.5, "the op is its name as text"),
    ("dtype", ["float32"], "a dtype is its name"),
])
def test_a_field_out_of_bounds_is_refused_at_load(tmp_path, field, value, match):
    with pytest.raises(GraphError, match=match):
        load_graph(_write(tmp_path, _with(field, value)))


def test_numbers_json_has_no_finite_form_for_are_refused(tmp_path):
    text = json.dumps(graph_to_dict(cos_cos_graph())).replace('"flops": 1024', '"flops": 1e400', 1)
    assert "1e400" in text
    (tmp_path / "g.json").write_text(text)
    with pytest.raises(GraphError, match="1e400, which is not finite"):
        load_graph(tmp_path / "g.json")


def test_a_deeply_nested_file_is_refused_quickly(tmp_path):
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(GraphError, match="nested too deeply"):
        load_graph(tmp_path / "deep.json")
    doc = _with("meta", {})
    inner: dict = {}
    doc["nodes"][4]["meta"] = inner
    for _ in range(40):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(GraphError, match="nest"):
        load_graph(_write(tmp_path, doc))


def test_a_gzip_bomb_is_stopped_as_it_inflates(tmp_path, monkeypatch):
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b" " * (64 << 20))
    monkeypatch.setenv("REMAT_MAX_GRAPH_BYTES", str(1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(GraphError, match="larger than 1048576 bytes once decompressed; set \\$REMAT_MAX_GRAPH_BYTES"):
            load_graph(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # read at most the cap (+1 byte), never the 64 MiB it holds
    plain = tmp_path / "big.json"
    plain.write_bytes(b" " * (2 << 20))
    with pytest.raises(GraphError, match="larger than 1048576 bytes; set"):
        load_graph(plain)
    monkeypatch.setenv("REMAT_MAX_GRAPH_BYTES", "lots")
    with pytest.raises(GraphError, match="REMAT_MAX_GRAPH_BYTES='lots' is not a positive number"):
        load_graph(plain)


def test_an_empty_graph_is_refused(tmp_path):
    doc = graph_to_dict(cos_cos_graph())
    doc["nodes"] = []
    with pytest.raises(GraphError, match="has no nodes: there is nothing to plan"):
        load_graph(_write(tmp_path, doc))
    with pytest.raises(GraphError, match="has no nodes"):
        remat.solve(Graph([], name="empty"))
    with pytest.raises(GraphError, match="has no nodes"):
        load_graph(_write(tmp_path, {"nodes": [], "links": []}, "nl.json"))


def test_a_graph_at_the_bounds_plans():
    """The bounds are where the arithmetic still holds: a graph whose every node is 1 PiB
    plans with every solver family, without an overflow."""
    from remat.graph.limits import MAX_NODE_BYTES, MAX_WORK

    g = cos_cos_graph()
    big = g.replace_nodes([n.replace(bytes=MAX_NODE_BYTES if n.bytes else 0, flops=MAX_WORK) for n in g.nodes])
    for solver, budget in [("auto", None), ("auto", 0.9), ("checkmate", 0.9), ("chen-greedy", 0.95),
                           ("magis", 0.9), ("auto", "min")]:
        plan = remat.solve(big, solver, budget=budget, time_limit=5)
        assert plan.feasible and plan.peak_bytes > MAX_NODE_BYTES


@pytest.mark.parametrize("budget, match", [
    ("1e300GiB", "more bytes than any device holds"),
    (10**400, "more bytes than any device holds"),
    ("1e400", "must be positive and finite"),
    (float("inf"), "must be positive and finite"),
    ("nanGiB", "not understood"),
    ([1], "not understood"),
])
def test_a_budget_is_read_without_overflow(budget, match):
    with pytest.raises(BudgetError, match=match):
        Budget.parse(budget)
    with pytest.raises(BudgetError):
        remat.solve(cos_cos_graph(), "auto", budget=budget)


@pytest.mark.parametrize("kwargs, match", [
    ({"solver_options": [1]}, "solver_options must be a dict"),
    ({"solver_options": [1], "max_overhead": 0.1}, "solver_options must be a dict"),
    ({"max_overhead": 10**400}, "max_overhead"),
    ({"max_overhead": float("inf")}, "must be a finite share"),
    ({"bandwidth": float("inf")}, "bandwidth must be"),
])
def test_options_are_checked_when_compile_is_called(kwargs, match):
    with pytest.raises(OptionError, match=match):
        remat.compile(lambda x: x.cos(), compiler="eager", **kwargs)


def test_a_huge_time_limit_is_no_limit_and_a_negative_one_an_error():
    assert remat.solve(cos_cos_graph(), time_limit=10**400).feasible  # before: OverflowError
    with pytest.raises(OptionError, match="time_limit -1000000000000"):
        remat.solve(cos_cos_graph(), time_limit=-10**400)


def test_the_solver_s_options_and_headroom_are_remat_errors():
    with pytest.raises(OptionError, match="headroom"):
        remat.solve(cos_cos_graph(), "auto", budget="1MiB", headroom=-1e300)
    with pytest.raises(OptionError, match="a remat Graph"):
        remat.solve({"nodes": []})


def test_a_path_that_is_not_a_regular_file_is_refused(tmp_path):
    """A device or a folder is refused before it is read (``/dev/zero`` reported a size of 0
    and would have been read forever)."""
    for path in ("/dev/zero", str(tmp_path)):
        with pytest.raises(GraphError, match="not a regular file"):
            load_graph(path)


def test_remat_checkpoint_s_options_are_checked_at_the_call():
    """remat.checkpoint took offload='yes', strict=2 and profile=5 without a word."""
    import torch

    def model():
        return torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]))

    for kwargs, match in [({"offload": "yes"}, "offload must be True"), ({"strict": 2}, "strict must be True"),
                          ({"profile": 5}, "profile must be a remat.cost.model.DeviceProfile"),
                          ({"budget": 10**400}, "more bytes than any device holds")]:
        with pytest.raises((OptionError, BudgetError), match=match):
            remat.checkpoint(model(), **kwargs)
    with pytest.raises(OptionError, match="torch.nn.Module"):
        remat.checkpoint(lambda x: x)
