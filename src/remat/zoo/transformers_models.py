"""``gpt2``, ``bert``, ``vit``: transformers' models from their configs, random weights.

==========  =====================================================  ======================================
entry       tiny                                                   full
==========  =====================================================  ======================================
gpt2        2 layers, 64 wide, 4 heads, vocab 256, (2, 16) tokens  GPT-2 small: 12 x 768, 12 heads,
                                                                   vocab 50257, (8, 1024) tokens
bert        2 layers, 64 wide, 4 heads, ff 256, vocab 256,         BERT-base: 12 x 768, 12 heads, ff 3072,
            (2, 16) tokens                                         vocab 30522, (8, 512) tokens
vit         32x32 image, patch 8, 2 layers, 64 wide, 10 classes,   ViT-B/16: 224x224, 12 x 768, 12 heads,
            batch 2                                                1000 classes, batch 64
==========  =====================================================  ======================================

``small``: 4 layers, 256 wide, 4 heads, ff 1024; gpt2 and bert: vocab 2048, (4, 128)
tokens; vit: 64x64 images, patch 8, 100 classes, batch 8.

Dropout is 0. GPT-2 and BERT compute their loss inside ``forward`` (GPT-2: causal LM with
``loss_type = "ForCausalLM"``, as :class:`GPT2Loss`; BERT: masked LM on ~15% of
the positions), so the output is the loss and ``case.loss`` is the identity. ViT returns
logits; the loss is cross-entropy against fixed random labels. Blocks are the transformer
layers (``lm.transformer.h.i``, ``mlm.bert.encoder.layer.i``, and ``vit.vit.layers.i`` in
transformers 5 / ``vit.vit.encoder.layer.i`` before).
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import _to_device_loss, register
from .mlp import cross_entropy

# layers, width, heads, feed-forward, vocab (or classes), sequence (or image), batch
_GPT2 = {"tiny": (2, 64, 4, 256, 256, 16, 2), "small": (4, 256, 4, 1024, 2048, 128, 4),
         "full": (12, 768, 12, 3072, 50257, 1024, 8)}
_BERT = {"tiny": (2, 64, 4, 256, 256, 16, 2), "small": (4, 256, 4, 1024, 2048, 128, 4),
         "full": (12, 768, 12, 3072, 30522, 512, 8)}
_VIT = {"tiny": (2, 64, 4, 256, 10, 32, 2), "small": (4, 256, 4, 1024, 100, 64, 8),
        "full": (12, 768, 12, 3072, 1000, 224, 64)}


def gpt2_tiny(n_layer=2, n_embd=64, n_head=4, vocab=256, positions=64, dropout=0.0):
    """GPT-2 from transformers' config with random weights (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # otherwise the loss breaks the graph
    return model


class LMLoss(nn.Module):
    """``forward(ids) -> causal LM loss`` of a transformers causal LM (labels = ids)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


class GPT2Loss(LMLoss):
    """The zoo's GPT-2 entry: its own class name, which names its captured graphs."""


def _identity(out):
    return out


def _layer_names(model: nn.Module, n: int) -> list[str]:
    """Qualified names of the transformer layers: the items of the first ``nn.ModuleList`` of
    length ``n`` (its path differs between transformers versions, e.g. ``vit.encoder.layer`` /
    ``vit.layers``)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            return [f"{name}.{i}" for i in range(n)]
    raise RuntimeError(f"no list of {n} layers in {type(model).__name__}")


@register("gpt2", "model", "GPT-2 (transformers GPT2LMHeadModel), causal LM loss inside forward")
def _gpt2(size, batch):
    layers, width, heads, _ff, vocab, seq, b = _GPT2[size]
    b = batch or b
    model = GPT2Loss(gpt2_tiny(n_layer=layers, n_embd=width, n_head=heads, vocab=vocab, positions=seq))
    ids = torch.randint(0, vocab, (b, seq))
    return dict(model=model, inputs=(ids,), loss=_identity,
                blocks=_layer_names(model, layers), batch=b)


class BertMLMLoss(nn.Module):
    """``forward(ids, labels) -> masked-LM loss`` of a ``BertForMaskedLM``."""

    def __init__(self, mlm):
        super().__init__()
        self.mlm = mlm

    def forward(self, ids, labels):
        return self.mlm(input_ids=ids, labels=labels).loss


@register("bert", "model", "BERT (transformers BertForMaskedLM), masked-LM loss inside forward")
def _bert(size, batch):
    from transformers import BertConfig, BertForMaskedLM

    layers, width, heads, ff, vocab, seq, b = _BERT[size]
    b = batch or b
    cfg = BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=ff, max_position_embeddings=max(seq, 512), hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertMLMLoss(BertForMaskedLM(cfg))
    ids = torch.randint(0, vocab, (b, seq))
    masked = torch.rand(b, seq) < 0.15
    masked[:, 0] = True  # at least one label per sequence
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return dict(model=model, inputs=(ids, labels), loss=_identity,
                blocks=_layer_names(model, layers), batch=b)


class ViTLogits(nn.Module):
    """``forward(pixels) -> logits`` of a ``ViTForImageClassification``."""

    def __init__(self, vit):
        super().__init__()
        self.vit = vit

    def forward(self, pixels):
        return self.vit(pixel_values=pixels).logits


@register("vit", "model", "ViT (transformers ViTForImageClassification), image classification")
def _vit(size, batch):
    from transformers import ViTConfig, ViTForImageClassification

    layers, width, heads, ff, classes, image, b = _VIT[size]
    b = batch or b
    cfg = ViTConfig(image_size=image, patch_size=16 if image >= 224 else 8, hidden_size=width,
                    num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff,
                    num_labels=classes, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = ViTLogits(ViTForImageClassification(cfg))
    x = torch.randn(b, 3, image, image)
    y = torch.randint(0, classes, (b,))
    return dict(model=model, inputs=(x,), loss=_to_device_loss(cross_entropy, y),
                blocks=_layer_names(model, layers), batch=b)
