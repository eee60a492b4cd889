"""Fission on CNNs (issue 31): the batch is never split across a training-mode batch norm
(its statistics need the whole batch), and the plan says so; in eval mode, and with group
norm or layer norm, the same network splits along the batch, and training with the split
plan gives eager's gradients."""

import pytest
import torch
from torch import nn

import remat


NORMS = {"batch": lambda c: nn.BatchNorm2d(c), "group": lambda c: nn.GroupNorm(4, c),
         "layer": lambda c: nn.GroupNorm(1, c)}


class _Net(nn.Module):
    """Two convolutions with a norm, pooled, and a classifier's cross-entropy."""

    def __init__(self, norm="batch"):
        super().__init__()
        mk = NORMS[norm]
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), mk(16), nn.ReLU(),
                                 nn.Conv2d(16, 16, 3, padding=1), mk(16), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _data():
    torch.manual_seed(0)
    return torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))


def test_training_mode_batch_norm_is_never_split_along_the_batch_and_the_plan_says_why():
    torch.manual_seed(0)
    model = _Net()
    p = remat.plan(model, *_data(), budget="min", for_compiler="eager", cache=False)
    batch_parts = [f for f in p.fissions if f.length == 16]
    assert not batch_parts
    assert "not split: the batch is not split across" in p.summary()
    assert "training-mode batch norm" in p.summary()


@pytest.mark.parametrize("norm", ["batch", "group", "layer"])
def test_eval_mode_batch_norm_and_group_norms_split_along_the_batch_with_eagers_gradients(norm):
    """Eval-mode batch norm (running statistics), group norm and layer norm (per-sample
    statistics; their decomposition reshapes through ``as_strided``, which the parts run as
    ``view``) split the batch."""
    torch.manual_seed(0)
    model = _Net(norm)
    if norm == "batch":
        model.eval()  # running statistics: each sample is normalized on its own
    x, y = _data()
    plans = []
    step = remat.compile(model, budget="min", compiler="eager", cache=False,
                         on_plan=lambda g, p: plans.append(p))
    got = step(x, y)
    got.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    want = model(x, y)
    want.backward()
    assert plans[0].fissions and plans[0].fissions[0].length == 16, plans[0].summary()
    assert " batch parts" in plans[0].summary()
    unsplit = remat.plan(model, x, y, budget="min", solver="magis", for_compiler="eager",
                         cache=False, solver_options={"fission": False})
    assert plans[0].peak_bytes < 0.5 * unsplit.peak_bytes  # predicted: 1.1 MB against 5.5 MB
    torch.testing.assert_close(got, want)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], rtol=1e-4, atol=1e-5, msg=k)
