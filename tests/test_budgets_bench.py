"""remat.bench.budgets (``benchmarks/budgets_vs_torch.py``): its gradient checks and the issue's
checks on rows; (slow) one small model through every method."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from remat.bench import budgets as B
from remat.zoo.trials import Case, make_step


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return nn.functional.dropout(torch.tanh(self.a(x)), 0.1).pow(2).mean() + self.b(torch.tanh(self.a(x))).sum()


def _tiny(dtype=torch.float64):
    torch.manual_seed(0)
    return Tiny().to(dtype), (torch.randn(8, 16, dtype=dtype),)


def test_directional_check_agrees_with_autograd_and_catches_a_wrong_gradient():
    model, inputs = _tiny()
    make_step(model, model, inputs, seed=B.SEED)()
    dirs = B.directions(model, 2)
    assert B.directional_error(model, model, inputs, dirs, 1e-3) < 1e-5
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad.mul_(1.5)
    assert B.directional_error(model, model, inputs, dirs, 1e-3) > 0.2
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # parameters restored


def test_grad_rel_err():
    model, inputs = _tiny()
    make_step(model, model, inputs, seed=B.SEED)()
    ref = B.grads_of(model)
    assert B.grad_rel_err(model, ref) == 0.0
    model.b.weight.grad.add_(1e-3 * max(float(g.abs().max()) for g in ref))
    assert B.grad_rel_err(model, ref) == pytest.approx(1e-3)


def test_checks_judge_the_rows():
    rows = [B.Row("m", B.REFERENCE, "-", peak_bytes=100, fraction=1.0, fd=1e-4),
            B.Row("m", "remat", "0.6", 0.6, peak_bytes=55, fraction=0.55, fd=1e-4),
            B.Row("m", "remat", "0.4", 0.4, peak_bytes=50, fraction=0.50, warned="RematBudgetWarning: x"),
            B.Row("m", "remat", "0.2", 0.2, status="refused: InfeasibleBudgetError", smallest_feasible=0.45),
            B.Row("m", "remat", "0.3", 0.3, peak_bytes=50, fraction=0.5),
            B.Row("m", "knob", "0", 0.0, peak_bytes=60, fraction=0.6, fd=0.3)]
    lines = B.checks(rows)
    assert lines[0].startswith("- no fraction refused: NO: 0.2") and "smallest 0.450" in lines[0]
    assert "NO: 0.3 -> 0.500" in lines[1] and "warned, not judged: 0.4 -> 0.500" in lines[1]
    assert "least <= the knob's least: yes" in lines[2]
    assert "NO: knob 0 0.3" in lines[3]
    assert "| remat | 0.2 | refused: InfeasibleBudgetError (smallest 0.450) |" in B.table(rows)


@pytest.mark.slow
def test_every_method_on_a_small_model():
    model, inputs = _tiny(torch.float32)
    case = Case("tiny", "tiny", model, inputs)
    ms = B.methods([0.5], [0.5, 0.0])
    rows = B.run_model(case, ms, B.Settings(compiler="eager"), repeats=1)
    assert [(r.method, r.budget) for r in rows] == [(m.kind, m.budget) for m in ms]
    ref = rows[0]
    assert ref.method == B.REFERENCE and ref.fraction == 1.0 and ref.ratio == 1.0
    for r in rows:
        assert r.status == "ok" or r.status.startswith("refused"), (r.method, r.budget, r.status, r.note)
        if r.status == "ok":
            assert r.peak_bytes is not None and r.fraction is not None and r.fd is not None
            assert r.grad_ref is not None and r.grad_eager is not None
    assert all(r.plan_s is not None for r in rows if r.method in ("remat", "knob") and r.status == "ok")
