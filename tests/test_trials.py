"""The budget comparison's models (:func:`remat.zoo.trials.budget_case`): each builds at its
``quick`` size, runs a training step eagerly with a finite loss and gradients, and (slow) is
one graph under ``torch.compile``."""

from __future__ import annotations

import math

import pytest
import torch

from remat.zoo.trials import BUDGET_SIZES, budget_case

# the models issue 30 added; the others are exercised by the scripts' and plan-order tests
NEW = ("gemma2", "bert", "whisper", "swin", "clip", "wav2vec2", "mamba")


pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_model_has_a_default_and_a_quick_size():
    assert set(NEW) <= set(BUDGET_SIZES)
    for name, sizes in BUDGET_SIZES.items():
        assert {"default", "quick"} <= set(sizes), name


@pytest.mark.parametrize("name", NEW)
def test_builds_and_steps_eagerly(name):
    case = budget_case(name, "quick")
    assert case.model.training
    torch.manual_seed(3)
    loss = case.model(*case.inputs)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    params = [p for p in case.model.parameters() if p.requires_grad]
    with_grad = [p for p in params if p.grad is not None]
    assert len(with_grad) >= 0.9 * len(params), f"{len(with_grad)} of {len(params)} parameters got gradients"
    assert all(torch.isfinite(p.grad).all() for p in with_grad)


def test_same_seed_same_model():
    a, b = budget_case("bert", "quick"), budget_case("bert", "quick")
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_one_graph_under_compile(name):
    """No graph breaks: remat plans the whole step as one graph."""
    import remat

    case = budget_case(name, "quick")
    plans = []
    fn = remat.compile(case.model, compiler="eager", cache=False, on_plan=lambda g, p: plans.append(p))
    fn(*case.inputs).backward()
    assert len(plans) == 1
