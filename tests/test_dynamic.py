"""Dynamic shapes: one plan for a symbolic graph, no recompile per batch size or sequence length.

remat reads a symbolic size's hint without adding a guard (a guard would specialise the
graph to the first sizes and make dynamo recompile, and remat re-plan, for every new one).
Each case counts the graphs ``torch.compile(dynamic=True)`` compiles on its own (backend
``aot_eager``) and checks that remat compiles and plans exactly as many, with gradients equal
to eager for every shape.
"""

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import remat

pytest.importorskip("torch._inductor")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).sin())


def _steps(fn, model, inputs):
    """Loss, and the gradients of the parameters (and of a float input), per input."""
    out = []
    for x in inputs:
        model.zero_grad()
        if x.is_floating_point():
            x = x.detach().requires_grad_()
        y = fn(x)
        loss = y if y.dim() == 0 else y.square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        out.append([loss.detach()] + grads + ([x.grad.clone()] if x.is_floating_point() else []))
    return out


def _graphs_compiled(fn, model, inputs):
    counters.clear()
    torch._dynamo.reset()
    _steps(fn, model, inputs)
    return counters["stats"]["unique_graphs"]


def _check(model, inputs, compiler="eager", tol=1e-5):
    torch_graphs = _graphs_compiled(torch.compile(model, dynamic=True, backend="aot_eager"), model, inputs)
    plans = []
    step = remat.compile(model, dynamic=True, compiler=compiler, strict=True,
                         on_plan=lambda g, p: plans.append((g, p)))
    counters.clear()
    torch._dynamo.reset()
    got = _steps(step, model, inputs)
    remat_graphs = counters["stats"]["unique_graphs"]
    assert remat_graphs == torch_graphs, (remat_graphs, torch_graphs)
    assert len(plans) == torch_graphs  # one plan per graph, none per new shape
    want = _steps(model, model, inputs)
    for shape_got, shape_want, x in zip(got, want, inputs):
        for a, b in zip(shape_got, shape_want):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{tuple(x.shape)}: {m}")
    return plans


def test_mlp_one_plan_for_three_batch_sizes():
    torch.manual_seed(0)
    model = MLP()
    inputs = [torch.randn(b, 16) for b in (4, 8, 16)]
    plans = _check(model, inputs)
    assert len(plans) == 1
    graph, plan = plans[0]
    # planned at the first call's sizes (the hints), and says the sizes were symbolic
    symbols = graph.meta["dynamic"]["symbols"]
    assert list(symbols.values()) == [4]
    x = next(n for n in graph.nodes if n.meta.get("sym_shape"))
    assert x.shape == (4, 16) and x.meta["sym_shape"] == [next(iter(symbols)), 16]
    assert x.bytes == 4 * 16 * 4
    assert plan.feasible


def test_mlp_with_sequence_dimension_one_plan():
    torch.manual_seed(0)
    model = MLP()
    inputs = [torch.randn(b, t, 16) for b, t in ((4, 5), (8, 5), (16, 7), (4, 9))]
    plans = _check(model, inputs)
    assert len(plans) == 1
    assert sorted(plans[0][0].meta["dynamic"]["symbols"].values()) == [4, 5]


def test_gpt2_tiny_batch_sizes_and_sequence_lengths():
    pytest.importorskip("transformers")
    from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny

    torch.manual_seed(0)
    model = GPT2Loss(gpt2_tiny())
    inputs = [torch.randint(0, 256, (b, t)) for b, t in ((4, 16), (8, 16), (16, 16), (4, 24), (8, 32))]
    plans = _check(model, inputs, tol=1e-4)
    assert len(plans) == 1
    assert plans[0][0].meta["dynamic"]["symbols"]


@pytest.mark.inductor
def test_inductor_mlp_one_plan():
    torch.manual_seed(0)
    model = MLP()
    inputs = [torch.randn(b, 16) for b in (4, 8, 16)]
    plans = _check(model, inputs, compiler="inductor", tol=1e-4)
    assert len(plans) == 1


def test_graph_meta_round_trips_through_json():
    from remat.graph.examples import cos_cos_graph
    from remat.graph.io import graph_from_dict, graph_to_dict

    g = cos_cos_graph()
    g = type(g)(g.nodes, name=g.name, meta={"dynamic": {"symbols": {"s0": 8}}})
    back = graph_from_dict(graph_to_dict(g))
    assert back.meta == g.meta
    assert g.replace_nodes(g.nodes).meta == g.meta
