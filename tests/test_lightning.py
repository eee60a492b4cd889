"""Lightning's Trainer with remat: ``remat.compile`` and ``remat.checkpoint`` on a
LightningModule train 3 steps with the losses of plain training.

Importing Lightning wraps ``torch.compile`` (``lightning.fabric.wrappers``) and deep-copies its
keyword arguments; remat's backend object could not be copied before (``TypeError: cannot
pickle 'mappingproxy' object``), so only ``backend="remat"`` without a budget worked.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from torch import nn

import remat


@pytest.fixture
def pl():
    """``lightning.pytorch``, with ``torch.compile`` as Lightning leaves it for the test, and
    restored after it (the wrapper is process-wide)."""
    original = torch.compile
    try:
        import lightning.pytorch as lightning
        from lightning.fabric.wrappers import _capture_compile_kwargs
    except ImportError:
        pytest.skip("lightning is not installed")
    if not hasattr(torch.compile, "__wrapped__"):  # imported before, and restored after that test
        torch.compile = _capture_compile_kwargs(original)
    yield lightning
    torch.compile = original


def _net(pl):
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = nn.ModuleList(Block(32) for _ in range(3))
            self.head = nn.Linear(32, 1)
            self.losses: list[torch.Tensor] = []

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)  # kept by _Losses: a list here recompiles each step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def _fit(pl, wrap) -> list[float]:
    class Losses(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            module.losses.append(outputs["loss"].detach())

    torch.manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(48, 32), torch.randn(48, 1))
    net = _net(pl)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[Losses()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's advice on workers and logging
        trainer.fit(wrap(net), torch.utils.data.DataLoader(data, batch_size=16))
    return [float(x) for x in net.losses]


def test_trainer_fit_with_remat_compile_and_remat_checkpoint(pl):
    plain = _fit(pl, lambda m: m)
    plans: list = []
    compiled = _fit(pl, lambda m: remat.compile(m, compiler="eager", budget=0.5,
                                                on_plan=lambda g, p: plans.append(p)))
    least = _fit(pl, lambda m: remat.compile(m, compiler="eager", budget="min"))
    checkpointed = _fit(pl, lambda m: remat.checkpoint(m, budget=0.5))
    assert len(plain) == len(compiled) == len(least) == len(checkpointed) == 3
    for run in (compiled, least, checkpointed):
        assert run == pytest.approx(plain, rel=1e-5, abs=1e-6)
    assert plans and all(p.feasible and "fallback" not in p.details for p in plans)  # remat planned the step
    assert len(plans) == 1  # one graph, planned once: the step compiles once


def test_the_backend_copies_and_pickles_with_its_options(pl):
    compiled = remat.compile(nn.Linear(4, 4), budget="1GiB", compiler="eager", time_limit=12)
    kwargs = compiled._compile_kwargs  # what Lightning kept: a deep copy
    backend = kwargs["backend"]
    assert copy.deepcopy(backend) is backend  # one backend per remat.compile: its step budget is shared
    again = pickle.loads(pickle.dumps(backend))
    assert again.options == backend.options and again.options.budget.text == "1GiB"
    assert again.options.time_limit == 12 and again.model_bytes == backend.model_bytes
