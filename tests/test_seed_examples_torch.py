"""The seeds' worked examples, captured from real PyTorch and planned by remat.plan."""

import json

import pytest
import torch

import remat
from remat.zoo.mlp import MLP
from remat.zoo.patterns import f1, f2, gelu_erf, tanh_tanh
from remat.plans.plan import Plan


def _inputs(n, numel=1024):
    torch.manual_seed(0)
    return [torch.randn(numel, requires_grad=True) for _ in range(n)]


def test_cos_cos_saves_only_the_sum():
    """seeds/000 Sec. 2.3 and seeds/002: f1 saves x = a+b+c+d (add_2) and nothing else."""
    p = remat.plan(f1, *_inputs(4))
    assert [s.name for s in p.saved_activations] == ["add_2"]
    assert p.saved_activation_bytes == 1024 * 4
    assert p.recomputed == ["cos"]


def test_cos_cos_baselines_save_more_or_equal():
    """Naive AD (no recomputation) saves x and cos(x): two tensors, twice the cut cost."""
    xs = _inputs(4)
    ours = remat.plan(f1, *xs)
    none = remat.plan(f1, *xs, solver="no-recompute")
    torch_mc = remat.plan(f1, *xs, solver="torch-mincut")
    assert sorted(s.name for s in none.saved_activations) == ["add_2", "cos"]
    assert none.cost == 2 * ours.cost
    assert torch_mc.saved_activation_bytes >= ours.saved_activation_bytes


def test_dropout_like_mask_saves_bool_not_float():
    """seeds/000 Sec. 2.3 f2: save the bool mask (1 byte/elt), never the float random tensor."""
    p = remat.plan(f2, *_inputs(1))
    acts = p.saved_activations
    assert len(acts) == 1 and acts[0].dtype == "bool"
    assert p.saved_activation_bytes == 1024
    assert "random" in " ".join(p.banned.values())


@pytest.mark.parametrize("fn", [tanh_tanh, gelu_erf], ids=["tanh-tanh", "gelu-erf"])
def test_fused_chains_save_only_the_input(fn):
    """seeds/000 Sec. 1 and Table 1: tanh(tanh(x)) and erf-GeLU save nothing beyond x."""
    p = remat.plan(fn, *_inputs(1))
    assert p.saved_activations == []
    assert [s.role for s in p.saved] == ["input"]


def test_aggressive_mode_also_finds_the_seed_answers():
    p = remat.plan(f1, *_inputs(4), solver="mincut-aggressive")
    assert [s.name for s in p.saved_activations] == ["add_2"]


def test_plan_json_round_trip_and_summary():
    p = remat.plan(f1, *_inputs(4))
    d = json.loads(p.to_json())
    assert d["format"] == "remat.plan" and d["saved_activation_bytes"] == 4096
    assert d["saved"][0] == {"name": "add_2", "shape": [1024], "dtype": "float32", "nbytes": 4096,
                             "role": "activation", "module": None}
    q = Plan.from_dict(d)
    assert q.saved == p.saved and q.cost == p.cost
    text = p.summary()
    assert "add_2" in text and "mincut" in text


def test_plan_roles_distinguish_params_inputs_activations():
    torch.manual_seed(0)
    p = remat.plan(MLP(), torch.randn(16, 32))
    roles = {s.role for s in p.saved}
    assert roles <= {"input", "param", "activation"}
    assert "activation" in roles
    assert all(s.nbytes > 0 and s.shape is not None for s in p.saved)


def test_plan_without_grad_explains():
    with pytest.raises(ValueError, match="requires_grad"):
        remat.plan(tanh_tanh, torch.randn(8))


def test_unknown_solver_and_mode_are_rejected_early():
    with pytest.raises(ValueError, match="unknown solver"):
        remat.compile(f1, solver="magic")
    with pytest.raises(ValueError, match="unknown torch.compile mode 'fast'"):
        remat.compile(f1, mode="fast")  # mode is torch.compile's; remat's two modes are solvers
