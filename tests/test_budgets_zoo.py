"""Budgets on the zoo's models (issue 10): under a budget the gradients equal eager's, a
byte budget bounds the step's measured peak (convolutions' scratch measured at capture:
remat.capture.workspace), and a fraction nothing reaches says so."""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.bench.budgeted import budgeted_step, scalar_loss
from remat.plans.budget import TORCH_HEADROOM, Budget
from remat.zoo import registry

MODELS = registry.names("model")


def _grads(model, inputs):
    model.zero_grad(set_to_none=True)
    scalar_loss(model(*inputs)).backward()
    return [p.grad.clone() for p in model.parameters()]


def _reference(model, inputs):
    """Eager gradients in float64 and the error float32 eager itself makes against them (per
    parameter): batch norm over a tiny batch at 1x1 spatial size divides by a variance near
    zero, so float32 gradients of ResNet-18 tiny are 0.77 off float64 ones (of 555) whoever
    computes them. A plan is right when it is about as close to float64 as eager is."""
    exact = _grads(copy.deepcopy(model).double(), [t.double() if t.is_floating_point() else t
                                                   for t in inputs])
    eager = _grads(copy.deepcopy(model), inputs)
    return exact, [float((e.double() - x).abs().max()) for e, x in zip(eager, exact)]


def assert_close_to_reference(got, reference):
    exact, eager_error = reference
    for k, (a, x, e) in enumerate(zip(got, exact, eager_error)):
        err = float((a.double() - x).abs().max())
        bound = 2 * e + 1e-4 * float(x.abs().max()) + 1e-6
        assert err <= bound, f"parameter {k}: gradient off float64 eager by {err:.3g}, eager float32 by {e:.3g}"


@pytest.fixture
def short_stages(monkeypatch):
    """The planner's stages at a quarter of their seconds (:data:`remat.solvers.deadline.SCALE`):
    what is checked holds for whatever plan, or infeasibility, a shorter search reaches (a
    gradient, a measured peak within the budget); a budget nothing reached costs 25 s instead
    of 40-80 s per model."""
    from remat.solvers import deadline

    monkeypatch.setattr(deadline, "SCALE", deadline.DEFAULT_SCALE / 4)  # whatever the suite's safety scale


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_gradients_equal_eager_under_budgets(name, short_stages):
    """Every zoo model under budgets 1.0, 0.6 and 0.3 through remat's eager compiler (inductor's
    decompositions): gradients as close to float64 eager as float32 eager is."""
    case = registry.build(name, "tiny")
    reference = _reference(case.model, case.inputs)
    for budget in (1.0, 0.6, 0.3):
        torch._dynamo.reset()
        plans = []
        step = remat.compile(copy.deepcopy(case.model), budget=budget, compiler="eager", strict=True,
                             time_limit=20, on_plan=lambda g, p: plans.append(p))
        try:
            got = _grads(step, case.inputs)
        except remat.InfeasibleBudgetError as e:
            assert budget < 1.0, "budget=1.0 always fits"
            assert e.smallest_feasible > Budget.parse(budget).bytes_for(e.plan.graph)
            continue
        assert plans and all(p.feasible for p in plans)
        assert_close_to_reference(got, reference)
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "gpt2", "resnet18", "unet", "vit"])
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_measured_peak_within_a_byte_budget(name, size, short_stages):
    if size == "small" and name in ("resnet18", "unet", "vit"):
        pytest.skip("small convolutional models take minutes to measure on this CPU")
    case = registry.build(name, size)
    try:
        r = budgeted_step(case.model, case.inputs, "auto", 0.5)
    except remat.InfeasibleBudgetError as e:  # halfway to the baselines' floor is below auto's
        budget = int(e.smallest_feasible / (1 - TORCH_HEADROOM)) + 1
        r = budgeted_step(case.model, case.inputs, "auto", 0.5, budget=budget)
    assert r.measured_total <= r.budget, (
        f"measured {r.measured_total} bytes over the budget of {r.budget} "
        f"(predicted step peak {r.sim.peak_bytes})")
    assert_close_to_reference([a for _, a, _ in r.grads], _reference(case.model, case.inputs))
