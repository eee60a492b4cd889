"""Batch scaling of Checkmate graphs and the maximum-batch search (torch-free, fast)."""

from __future__ import annotations

import json

import pytest

from remat.graph.graph import Graph, Node
from remat.graph.io import graph_from_dict
from remat.graph.batch import base_batch_of, scale_batch
from remat.bench.max_batch import cost_split, max_batch, one_forward_overhead, probe_batch
from remat.plans.simulator import simulate
from remat.solvers.baselines import BASELINES, checkpoint_all
from remat.plans.plan import Plan


def checkmate_chain(n: int = 4, batch: int = 8, per_example: int = 100) -> Graph:
    """A Checkmate-style node-link training graph of an ``n``-layer chain at ``batch``."""
    nodes, links = [], []
    for i in range(n):
        nodes.append({"id": i, "name": f"layer{i}", "backward": False, "cost_cpu": 10 * (i + 1),
                      "cost_ram": per_example * batch * (i + 1)})
        if i:
            links.append({"source": i - 1, "target": i})
    nodes.append({"id": n, "name": "Loss", "backward": True, "cost_cpu": 1, "cost_ram": 4 * batch})
    links.append({"source": n - 1, "target": n})
    for k, i in enumerate(reversed(range(n))):  # gradient of layer i reads layer i-1 and the next grad
        j = n + 1 + k
        nodes.append({"id": j, "name": f"layer{i}_backward", "backward": True, "cost_cpu": 20,
                      "cost_ram": per_example * batch * (i + 1)})
        links.append({"source": j - 1, "target": j})
        links.append({"source": i, "target": j})
        if i:
            links.append({"source": i - 1, "target": j})
    data = {"directed": True, "multigraph": False, "nodes": nodes, "links": links,
            "graph": {"name": f"chain (test)_{batch}_(4, 4, 1)_train"}}
    return graph_from_dict(json.loads(json.dumps(data)), f"chain_{batch}_4_4_1_train_nx.json")


def test_base_batch_from_names():
    assert base_batch_of("VGG19 (MLSys)_256_(224, 224, 3)_train") == 256
    assert base_batch_of("VGG19_256_224_224_3_train_nx") == 256
    assert base_batch_of("fcn_8_vgg_32_416_608_3_train_nx") == 32
    assert base_batch_of("fcn_8_vgg (MLSys)_32_(416, 608, 3)_train") == 32
    assert base_batch_of("random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14") is None


def test_scale_batch_doubles_activations_and_keeps_structure():
    g = checkmate_chain(batch=8)
    g2 = scale_batch(g, 16)
    assert base_batch_of(g2.name) == 16
    assert [n.name for n in g2.nodes] == [n.name for n in g.nodes]
    assert g2.edges == g.edges
    assert [n.role for n in g2.nodes] == [n.role for n in g.nodes]
    assert [n.is_output for n in g2.nodes] == [n.is_output for n in g.nodes]
    for a, b in zip(g.nodes, g2.nodes):
        assert b.bytes == 2 * a.bytes, a.name  # data input, activations, gradients, loss
        if a.cost is not None:
            assert b.cost == pytest.approx(2 * a.cost)
    assert g2["data"].bytes == 16 * 4 * 4 * 1 * 4
    # scaling back, and scaling a scaled graph (the batch is read from the new name)
    assert [n.bytes for n in scale_batch(g2, 8).nodes] == [n.bytes for n in g.nodes]
    assert [n.bytes for n in scale_batch(g2, 24).nodes] == [3 * n.bytes for n in g.nodes]
    # the cost limit of one extra forward pass is batch-invariant
    assert one_forward_overhead(g2) == pytest.approx(one_forward_overhead(g))
    total, fwd = cost_split(g)
    assert total == 10 + 20 + 30 + 40 + 1 + 4 * 20 and fwd == 100


def test_scale_batch_keeps_params_and_needs_a_batch():
    g = Graph([Node("x", "placeholder", (), role="input", bytes=40, category="input"),
               Node("w", "placeholder", (), role="param", bytes=1000, category="input"),
               Node("y", "mm", ("x", "w"), role="forward", bytes=80, cost=5.0)], name="plain")
    with pytest.raises(ValueError, match="base_batch"):
        scale_batch(g, 4)
    g4 = scale_batch(g, 4, base_batch=2)
    assert [n.bytes for n in g4.nodes] == [80, 1000, 160]
    assert g4["y"].cost == 10.0


def test_checkpoint_all_peak_is_linear_in_batch():
    g = checkmate_chain(batch=8)
    p8 = checkpoint_all(g).peak_bytes
    assert checkpoint_all(scale_batch(g, 24)).peak_bytes == 3 * p8


@pytest.mark.parametrize("solver", ["checkpoint-all", "chen-sqrtn", "griewank"])
def test_max_batch_is_largest_feasible(solver):
    g = checkmate_chain(n=5, batch=8)
    fn = BASELINES[solver]
    limit = one_forward_overhead(g)
    budget = 3 * checkpoint_all(g).peak_bytes  # about 24 examples' worth with no recomputation
    r = max_batch(g, fn, budget, limit)
    assert r.exact and r.batch >= 8 and r.infeasible_batch == r.batch + 1
    ok, _ = probe_batch(g, fn, r.batch, budget, limit)
    bad, _ = probe_batch(g, fn, r.batch + 1, budget, limit)
    assert ok.feasible and not bad.feasible
    # brute force: every batch up to the answer is feasible, the next few are not
    feas = [probe_batch(g, fn, b, budget, limit)[0].feasible for b in range(1, r.batch + 4)]
    assert feas == [True] * r.batch + [False] * 3
    # the search is independent of where it starts
    for start in (1, r.batch, r.batch + 1, 4 * r.batch):
        assert max_batch(g, fn, budget, limit, start=start).batch == r.batch


def test_max_batch_checkpoint_all_matches_closed_form():
    g = checkmate_chain(n=5, batch=8)
    per_example = checkpoint_all(g).peak_bytes // 8  # every byte in this graph is per-example
    budget = 100 * per_example + per_example // 2
    r = max_batch(g, BASELINES["checkpoint-all"], budget, one_forward_overhead(g))
    assert r.batch == 100  # the artifact's eq. 11: floor(budget / memory per example)


def test_max_batch_cost_limit_and_nothing_fits():
    g = checkmate_chain(n=5, batch=8)
    fn = BASELINES["chen-sqrtn"]
    budget = 3 * checkpoint_all(g).peak_bytes
    loose = max_batch(g, fn, budget, None).batch
    assert loose >= 24  # recomputation lets sqrt(n) fit more than checkpoint-all's 24
    # sqrt(n) recomputes, so with no overhead allowed it never qualifies
    r = max_batch(g, fn, budget, 1.0)
    assert r.batch == 0 and r.infeasible_batch == 1 and r.exact
    assert {p.status for p in r.probes} <= {"over_cost", "over_budget"}
    assert any(p.status == "over_cost" and p.overhead > 1.0 for p in r.probes)


def test_max_batch_flags_time_limited_probes():
    g = checkmate_chain(n=3, batch=8)

    def timed_out(graph, budget):
        return Plan.without_schedule(graph, solver="fake", status="no_solution",
                                     message="no schedule found within the time limit (Time limit reached)")

    r = max_batch(g, timed_out, 1e12, 2.0, max_batch_size=64)
    assert r.batch == 0 and not r.exact and r.undecided == [1, 5, 7, 8]
    r = max_batch(g, timed_out, 1e12, 2.0, max_undecided=2)
    assert len(r.probes) == 2 and r.batch == 0 and not r.exact


def test_probe_uses_simulated_schedule():
    g = checkmate_chain(n=4, batch=8)
    p, res = probe_batch(g, BASELINES["checkpoint-all"], 16, 1e12, 1.0)
    assert p.feasible and p.overhead == pytest.approx(1.0)
    assert p.peak_bytes == simulate(res.schedule()).peak_bytes


def test_graph_scaling_is_torch_free():
    import subprocess
    import sys

    code = ("import sys, json; from remat.bench.max_batch import max_batch, "
            "one_forward_overhead; from remat.graph.batch import scale_batch; from remat.solvers.baselines import BASELINES; "
            "from remat.graph import Graph, Node; "
            "g = Graph([Node('x', 'placeholder', (), role='input', bytes=8, category='input'), "
            "Node('y', 'f', ('x',), bytes=16, cost=1.0)], name='m_2_1_1_1'); "
            "assert scale_batch(g, 4)['y'].bytes == 32; "
            "max_batch(g, BASELINES['checkpoint-all'], 1000, one_forward_overhead(g)); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
