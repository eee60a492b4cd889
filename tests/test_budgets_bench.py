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


def _range_rows(**changes):
    """A model's rows of the budget range that pass every item-3 check; ``changes``: budget ->
    fields to change on that row."""
    R = B.Row
    rows = [R("m", B.REFERENCE, "-", peak_bytes=100, fraction=1.0, ratio=1.0, first_s=2.0),
            R("m", "remat", "0.8", 0.8, peak_bytes=79, fraction=0.79, ratio=1.0, predicted=0.79,
              predicted_time=1.0, first_s=3.0),
            R("m", "remat", "0.6", 0.6, peak_bytes=61, fraction=0.61, ratio=1.1, predicted=0.6, predicted_time=1.1),
            R("m", "remat", "0.4", 0.4, peak_bytes=50, fraction=0.5, ratio=1.2, predicted=0.5, predicted_time=1.3,
              out_of_reach=True, budget_warning="budget '0.4' is out of reach for 'm': the least memory remat "
                                                "finds ... Its step is predicted 1.3x plain torch.compile's."),
            R("m", "remat", "min", peak_bytes=50, fraction=0.5, ratio=1.2, predicted=0.5, predicted_time=1.3),
            R("m", "remat", "overhead 0.1", peak_bytes=60, fraction=0.6, ratio=1.12, predicted=0.6,
              predicted_time=1.1)]
    for r in rows:
        for k, v in changes.get(r.budget, {}).items():
            setattr(r, k, v)
    return rows


def test_range_checks_pass_on_rows_that_meet_item_3():
    lines = B.range_checks(_range_rows(), 0.1)
    assert len(lines) == 6 and all(": yes" in line for line in lines), lines
    assert "(warned: 0.4 -> 0.500 at 1.20x)" in lines[0]


def test_range_checks_name_each_failing_cell():
    lines = B.range_checks(_range_rows(**{
        "0.6": dict(peak_bytes=64, fraction=0.64, predicted=0.64),    # missed by 4.7%, not warned
        "0.4": dict(ratio=1.5, budget_warning="budget '0.4' is out of reach"),  # slower than min, a bare warning
        "min": dict(peak_bytes=70, fraction=0.7),                     # not the least measured
        "overhead 0.1": dict(ratio=1.2, predicted=0.65, predicted_time=1.15)}), 0.1)  # slow, dominated by 0.6
    assert "NO: 0.6 -> 0.640 (predicted 0.640), not warned; 0.4 (the warning names no least" in lines[0]
    assert "NO: less at 0.6 0.640, 0.4 0.500, overhead 0.1 0.600" in lines[1]
    assert "<= 1.1 x (1 + 5%): NO (1.20" in lines[2]
    assert "NO: overhead 0.1 (0.650, 1.15x) by 0.6 (0.640, 1.10x)" in lines[3]
    assert "NO: 0.4 1.50x" in lines[4]
    assert "yes" in lines[5]
    rises = B.range_checks(_range_rows(**{"0.6": dict(peak_bytes=85, fraction=0.85)}), 0.1)[5]
    assert "NO: 0.8 0.790 -> 0.6 0.850" in rises


def test_range_summary_and_table():
    rows = _range_rows()
    rows[1].first_ratio = 1.5
    text = B.range_summary({"m": rows}, [0.8, 0.6, 0.4])
    assert "| m | 0.79 (1.00x) | 0.61 (1.10x) | 0.50* (1.20x) | 0.50 (1.20x) | 0.60 (1.12x) | 1.50 .. 1.50 |" in text
    assert "| 0.4 | ok | 0.00 | 0.500 | 0.500 | 1.20 [-, -] | 1.30 | budget, out of reach |" in B.range_table(rows)
    assert [m.kind for m in B.range_methods([0.5], 0.1)] == [B.REFERENCE, B.NO_RECOMPUTE] + ["remat"] * 4
