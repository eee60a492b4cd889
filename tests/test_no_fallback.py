"""Models that once planned, or that users train every day, plan with no fallback (``strict=True``
raises where remat would fall back) and give eager's gradients (issue 29).

- An unrolled ``nn.GRUCell`` whose input does not require grad: PyTorch's partition drops a
  reader of a weight the joint graph's backward still holds (the input gradient nobody asked
  for), so the recorded no-recomputation saved set missed that weight and every graph of the
  step failed with "saved set ... misses primal inputs the backward needs" since the fraction's
  reference became PyTorch's saved set (03c925f).
- ``torch.utils.checkpoint`` around blocks with ``F.scaled_dot_product_attention``, and
  transformers' own gradient checkpointing on a Llama with SDPA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import remat
from remat.eager.blocks import enable_transformers_checkpointing


class GRUUnrolled(nn.Module):
    def __init__(self, hidden: int = 48) -> None:
        super().__init__()
        self.cell = nn.GRUCell(hidden, hidden)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(xs.shape[1], xs.shape[2])
        for t in range(xs.shape[0]):
            h = self.cell(xs[t], h)
        return h


class Attention(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = torch.ones(t, t, dtype=torch.bool).tril().expand(b, 1, t, t)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Attention() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def _same_gradients(model: nn.Module, run, compiler: str = "eager", **options) -> None:
    run(model)
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    plans = []
    run(remat.compile(model, compiler=compiler, strict=True, cache=False,
                      on_plan=lambda g, p: plans.append(p), **options))
    assert plans, "nothing was planned"
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("budget", [None, 0.9])
def test_an_unrolled_gru_cell_plans(budget):
    torch.manual_seed(0)
    xs = torch.randn(8, 4, 48)  # does not require grad
    _same_gradients(GRUUnrolled(), lambda m: m(xs).pow(2).sum().backward(), budget=budget)


def test_checkpoint_around_sdpa_blocks_plans():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 32, requires_grad=True)
    _same_gradients(Checkpointed(), lambda m: m(x).pow(2).mean().backward())


def test_transformers_gradient_checkpointing_with_sdpa_plans():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.loss_type = "ForCausalLM"
    enable_transformers_checkpointing(model, use_reentrant=False)
    model.train()
    ids = torch.randint(0, 256, (2, 32))
    _same_gradients(model, lambda m: m(input_ids=ids, labels=ids).loss.backward())
