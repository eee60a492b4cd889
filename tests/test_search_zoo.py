"""MAGIS's search (solver="magis") on the zoo's models through remat.compile: the plans it
runs, fission included, give eager's gradients at 0.4 and 0.2 of the activation memory
without recomputation, and a split graph is what runs."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.plans.budget import Budget
from remat.zoo import registry

from test_budgets_zoo import _grads, _reference, assert_close_to_reference

MODELS = registry.names("model")


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_gradients_equal_eager_under_the_search(name):
    case = registry.build(name, "tiny")
    reference = _reference(case.model, case.inputs)
    for budget in (0.4, 0.2):
        torch._dynamo.reset()
        plans = []
        step = remat.compile(copy.deepcopy(case.model), solver="magis", budget=budget, compiler="eager",
                             strict=True, time_limit=4, solver_options={"iterations": 6},
                             on_plan=lambda g, p: plans.append(p))
        try:
            got = _grads(step, case.inputs)
        except remat.InfeasibleBudgetError as e:
            assert e.smallest_feasible > Budget.parse(budget).bytes_for(e.plan.graph)
            continue
        assert plans and all(p.feasible for p in plans)
        for p in plans:  # a plan with fissions runs on the graph split as it says
            for f in p.fissions:
                assert all(f"{v}__part0" in p.graph for v in f.nodes)
        assert_close_to_reference(got, reference)
    torch._dynamo.reset()


def test_an_mlp_is_split_along_its_batch_and_trains_as_eager():
    """A wide batch: the search splits the step along it (forward and backward, the weight
    gradients summed over the parts) to reach 0.3 of its activation memory."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                torch.nn.GELU(), torch.nn.Linear(256, 8))
    x = torch.randn(1024, 64)
    eager = copy.deepcopy(model)
    eager(x).square().sum().backward()
    plans = []
    step = remat.compile(model, solver="magis", budget=0.3, compiler="eager", strict=True, cache=False,
                         time_limit=20, solver_options={"iterations": 40},
                         on_plan=lambda g, p: plans.append(p))
    step(x).square().sum().backward()
    (plan,) = plans
    assert plan.feasible and plan.fissions
    f = plan.fissions[0]
    assert f.length == 1024 and f.n >= 2 and -1 in f.outputs.values()  # a summed gradient
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


def test_max_overhead_asks_for_the_least_memory_within_that_time():
    """remat.compile(model, max_overhead=0.10): the least memory predicted within 10% of the
    reference step (plain torch.compile's partition), never more than the plan without a
    budget; with a budget in bytes or a fraction it is refused, with "min" it bounds min."""
    from remat.cost.model import default_cost_model
    from remat.plans.budget import reference_seconds

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    x = torch.randn(512, 64)
    (plan,) = remat.plan_all(model, x, max_overhead=0.10, cache=False, time_limit=10)
    (default,) = remat.plan_all(model, x, cache=False)
    limit = plan.time_bound.seconds
    g = default.graph
    assert limit == pytest.approx(1.10 * reference_seconds(g, default_cost_model(g)), rel=1e-6)
    assert plan.predicted_seconds <= limit and plan.peak_bytes <= default.peak_bytes
    (least,) = remat.plan_all(model, x, budget="min", max_overhead=0.10, cache=False, time_limit=10)
    assert least.time_bound.seconds == pytest.approx(limit)
    for budget in (0.5, "6GiB"):
        with pytest.raises(remat.OptionError, match="not both"):
            remat.compile(model, budget=budget, max_overhead=0.1)
