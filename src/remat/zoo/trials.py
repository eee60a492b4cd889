"""Models the scripts in ``benchmarks/`` run beside the registered zoo (:mod:`remat.zoo.registry`).

They are not registered (``remat bench`` and the zoo's tests do not see them): each belongs
to a benchmark's table and keeps that table's sizes.

- :func:`budget_case`: transformers causal LMs (GPT-2, Llama, Qwen2, Mistral, Gemma2, Mamba),
  T5, BERT (masked LM, dropout), Whisper, Swin, CLIP (contrastive loss), Wav2Vec2 (a
  classifier), a CNN with BatchNorm, a ResNet-18, a Mixtral MoE, a LoRA fine-tune of a Llama
  (:class:`LoRALinear`) and a ConvNeXt-style CNN (:class:`ConvNeXt`), each with its loss,
  each one graph under ``torch.compile`` (``benchmarks/budgets_vs_torch.py``,
  ``budget_range.py``, ``predictions.py``, ``plan_order.py``, ``staged_time.py``).
- :func:`magis_case`: MAGIS's workloads scaled down (zoo entries with their loss, and a nested
  U-Net) (``benchmarks/magis_table.py``).
- :data:`USER_TRIALS`: the user trials' models (BLOOM, OPT, Phi, ViT, a VGG-like CNN,
  GPT-NeoX), each with its step (``benchmarks/user_trial.py``, ``predictions.py``).
- :class:`Mixer`, :class:`WideMLP` (``magis_trial.py``), :class:`MobileNetLike`
  (``mobilenet_trial.py``), :class:`SkipMLP` (``offload_trial.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .transformers_models import LMLoss


@dataclass
class Case:
    """One benchmark model and its inputs: ``model(*inputs)`` returns the scalar loss."""

    name: str
    description: str
    model: nn.Module
    inputs: tuple
    config: dict = field(default_factory=dict)
    gradient_bytes: int = 0


def copy_inputs(inputs: tuple) -> tuple:
    """Fresh copies of the input tensors (``requires_grad`` kept), so each method gets its own."""
    return tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)


def make_step(fn: Callable, model: nn.Module, inputs: tuple, grads: str = "keep",
              seed: int | None = None) -> Callable[[], torch.Tensor]:
    """A training step: gradients zeroed in place (``grads="keep"``:
    ``zero_grad(set_to_none=False)``) or set to None (``grads="none"``), the generator seeded
    with ``seed`` if given (every method draws the same dropout masks), then
    ``fn(*inputs).backward()``; returns the detached loss."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> torch.Tensor:
        for p in params:
            if p.grad is not None:
                if grads == "keep":
                    p.grad.zero_()  # opt.zero_grad(set_to_none=False)
                else:
                    p.grad = None
        if seed is not None:
            torch.manual_seed(seed)
        loss = fn(*inputs)
        loss.backward()
        return loss.detach()

    return step


# -- the models of the budget comparison (budgets_vs_torch) -----------------------------------------

class Seq2SeqLoss(nn.Module):
    """``forward(ids, labels) -> loss`` of a T5ForConditionalGeneration."""

    def __init__(self, t5: nn.Module):
        super().__init__()
        self.t5 = t5

    def forward(self, ids, labels):
        return self.t5(input_ids=ids, labels=labels).loss


class ClassifierLoss(nn.Module):
    """``forward(x, y) -> cross-entropy`` of an image classifier."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


class OutputLoss(nn.Module):
    """``forward(*inputs) -> model(**{name: input for each name}, **fixed).loss``: a
    transformers model whose output carries its loss (masked LM, speech seq2seq, image and
    audio classification, CLIP's contrastive loss with ``return_loss=True``)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...], **fixed):
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.fixed = fixed

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)), **self.fixed).loss


# name -> {size: (config)}; "quick" sizes are for the smoke run, "gpu" sizes for a GPU (the
# issue's GPT-2 small and a Llama with Llama-3.2-1B's widths, batch 8 x 1024)
BUDGET_SIZES = {
    # layers, width, heads, vocab, batch, seq
    "gpt2": {"default": (4, 256, 4, 2048, 4, 128), "quick": (2, 128, 4, 1024, 4, 64),
             "gpu": (12, 768, 12, 50257, 8, 1024)},
    # layers, width, heads, kv heads, ff, vocab, batch, seq[, tied embeddings]
    "llama": {"default": (4, 256, 4, 2, 688, 2048, 4, 128), "quick": (2, 128, 4, 2, 344, 1024, 4, 64),
              "gpu": (4, 2048, 32, 8, 8192, 128256, 8, 1024, True)},
    # layers, width, heads, kv heads, ff, vocab, batch, seq (the Qwen2 user trial of BENCHMARKS.md)
    "qwen2": {"default": (4, 256, 4, 2, 768, 2048, 4, 128), "quick": (3, 128, 4, 2, 384, 1024, 4, 64)},
    # the same, Mistral with a sliding window of a quarter of the sequence
    "mistral": {"default": (4, 256, 4, 2, 768, 2048, 4, 128), "quick": (3, 128, 4, 2, 384, 1024, 4, 64)},
    # enc layers, dec layers, d_model, heads, d_ff, vocab, batch, seq
    "t5": {"default": (2, 2, 256, 4, 1024, 2048, 4, 128), "quick": (1, 1, 128, 4, 512, 1024, 4, 64)},
    # layers, width, heads, kv heads, head dim, ff, vocab, batch, seq (window a quarter of seq, soft caps)
    "gemma2": {"default": (4, 256, 4, 2, 64, 768, 2048, 4, 128), "quick": (2, 128, 4, 2, 32, 384, 1024, 4, 64)},
    # layers, width, heads, ff, vocab, batch, seq (hidden and attention dropout 0.1, masked-LM loss)
    "bert": {"default": (4, 256, 4, 1024, 2048, 4, 128), "quick": (2, 128, 4, 512, 1024, 4, 64)},
    # enc layers, dec layers, d_model, heads, ff, mel bins, frames, vocab, batch, target length
    "whisper": {"default": (2, 2, 256, 4, 1024, 80, 256, 2048, 4, 64),
                "quick": (1, 1, 128, 4, 512, 40, 128, 1024, 4, 32)},
    # embed dim, depths, heads, window, image, patch, batch (drop path 0.1, hidden dropout 0.1)
    "swin": {"default": (48, (2, 2, 2), (2, 4, 8), 4, 32, 2, 16), "quick": (32, (1, 1), (2, 4), 4, 32, 2, 8)},
    # text layers, vision layers, width, heads, ff, vocab, text seq, image, patch, batch
    "clip": {"default": (2, 2, 256, 4, 1024, 2048, 32, 64, 8, 16), "quick": (1, 1, 128, 4, 512, 1024, 16, 32, 8, 8)},
    # conv dims, layers, width, heads, ff, classes, batch, samples (classification, dropouts 0.1)
    "wav2vec2": {"default": ((64, 64, 64), 2, 256, 4, 1024, 10, 4, 3200),
                 "quick": ((32, 32), 2, 128, 4, 512, 10, 4, 1600)},
    # layers, width, state size, vocab, batch, seq
    "mamba": {"default": (2, 128, 16, 2048, 4, 64), "quick": (2, 64, 8, 1024, 4, 32)},
    # channels, blocks, batch, image
    "cnn": {"default": (16, 3, 32, 32), "quick": (16, 2, 16, 32)},
    # zoo resnet18 tiny (width 8, one block per stage), batch, image 32
    "resnet18": {"default": (32,), "quick": (16,)},
    # layers, width, heads, kv heads, expert ff, experts, top-k, vocab, batch, seq (transformers Mixtral)
    "mixtral": {"default": (2, 256, 4, 2, 512, 4, 2, 2048, 4, 128), "quick": (2, 128, 4, 2, 256, 4, 2, 1024, 4, 64)},
    # the llama sizes, base weights frozen; LoRA rank, alpha, dropout on q_proj and v_proj
    "lora": {"default": ((4, 256, 4, 2, 688, 2048, 4, 128), 8, 16, 0.05),
             "quick": ((2, 128, 4, 2, 344, 1024, 4, 64), 8, 16, 0.05)},
    # stage widths, blocks per stage, image, stem patch, batch
    "convnext": {"default": ((32, 64, 128), (2, 2, 2), 64, 4, 16), "quick": ((16, 32, 64), (1, 1, 1), 32, 2, 8)},
}


def budget_case(name: str, size: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
                seed: int = 0) -> Case:
    """A model of ``benchmarks/budgets_vs_torch.py`` (and the scripts that share its models) at
    ``size`` (a key of :data:`BUDGET_SIZES`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        case = _build(name, BUDGET_SIZES[name][size])
    _install_output_hooks(case.model)
    case.model = case.model.to(device=device, dtype=dtype).train()
    case.inputs = tuple(x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype)
                        for x in case.inputs)
    return case


def _install_output_hooks(model: nn.Module) -> None:
    """Install transformers' output-capturing hooks now: it installs them lazily in the first
    forward, and under ``torch.compile`` that breaks the first call's graph (Wav2Vec2: the step
    stays two graphs)."""
    try:
        from transformers.modeling_utils import PreTrainedModel
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:
        return
    for m in model.modules():
        if isinstance(m, PreTrainedModel):
            try:
                maybe_install_capturing_hooks(m)
            except Exception:  # noqa: BLE001 - a model without recorded outputs: nothing to install
                pass


def _build(name: str, cfg: tuple) -> Case:
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        layers, width, heads, vocab, b, seq = cfg
        lm = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                                        n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                        bos_token_id=0, eos_token_id=0))
        lm.loss_type = "ForCausalLM"  # otherwise the loss breaks the graph
        return Case(name, f"GPT-2 ({layers} x {width}, {heads} heads, vocab {vocab}), batch {b} x {seq}",
                    LMLoss(lm), (torch.randint(0, vocab, (b, seq)),))
    if name in ("llama", "qwen2", "mistral"):
        from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                                  Qwen2ForCausalLM)

        layers, width, heads, kv, ff, vocab, b, seq, *tied = cfg
        config, causal_lm = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "mistral": (MistralConfig, MistralForCausalLM)}[name]
        extra = {"sliding_window": seq // 4} if name == "mistral" else {}
        lm = causal_lm(config(vocab_size=vocab, hidden_size=width, intermediate_size=ff,
                              num_hidden_layers=layers, num_attention_heads=heads,
                              num_key_value_heads=kv, max_position_embeddings=max(seq, 256),
                              attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                              pad_token_id=0, tie_word_embeddings=bool(tied and tied[0]), **extra))
        lm.loss_type = "ForCausalLM"
        title = {"llama": "Llama", "qwen2": "Qwen2", "mistral": f"Mistral (window {seq // 4})"}[name]
        return Case(name, f"{title} ({layers} x {width}, {heads} heads / {kv} kv, ff {ff}, vocab {vocab}), "
                          f"batch {b} x {seq}", LMLoss(lm), (torch.randint(0, vocab, (b, seq)),))
    if name == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        enc, dec, width, heads, ff, vocab, b, seq = cfg
        t5 = T5ForConditionalGeneration(T5Config(vocab_size=vocab, d_model=width, d_kv=width // heads, d_ff=ff,
                                                 num_layers=enc, num_decoder_layers=dec, num_heads=heads,
                                                 dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                                                 eos_token_id=1))
        ids = torch.randint(2, vocab, (b, seq))
        labels = torch.randint(2, vocab, (b, seq))
        return Case(name, f"T5 ({enc}+{dec} layers x {width}, {heads} heads, ff {ff}, vocab {vocab}), "
                          f"batch {b} x {seq}", Seq2SeqLoss(t5), (ids, labels))
    if name == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM

        layers, width, heads, kv, hd, ff, vocab, b, seq = cfg
        lm = Gemma2ForCausalLM(Gemma2Config(vocab_size=vocab, hidden_size=width, intermediate_size=ff,
                                            num_hidden_layers=layers, num_attention_heads=heads,
                                            num_key_value_heads=kv, head_dim=hd, query_pre_attn_scalar=hd,
                                            max_position_embeddings=max(seq, 256), sliding_window=seq // 4,
                                            attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                                            pad_token_id=0, use_cache=False))
        lm.loss_type = "ForCausalLM"
        return Case(name, f"Gemma2 ({layers} x {width}, {heads} heads / {kv} kv, head dim {hd}, ff {ff}, vocab {vocab}, "
                          f"window {seq // 4}, soft caps 50/30), batch {b} x {seq}",
                    LMLoss(lm), (torch.randint(0, vocab, (b, seq)),))
    if name == "bert":
        from transformers import BertConfig, BertForMaskedLM

        layers, width, heads, ff, vocab, b, seq = cfg
        bert = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers,
                                          num_attention_heads=heads, intermediate_size=ff,
                                          max_position_embeddings=max(seq, 512), hidden_dropout_prob=0.1,
                                          attention_probs_dropout_prob=0.1, pad_token_id=0))
        ids = torch.randint(1, vocab, (b, seq))
        labels = torch.where(torch.rand(b, seq) < 0.15, ids, torch.full_like(ids, -100))  # 15% of tokens
        return Case(name, f"BERT masked LM ({layers} x {width}, {heads} heads, ff {ff}, vocab {vocab}, hidden and "
                          f"attention dropout 0.1), batch {b} x {seq}",
                    OutputLoss(bert, ("input_ids", "labels")), (ids, labels))
    if name == "whisper":
        from transformers import WhisperConfig, WhisperForConditionalGeneration

        enc, dec, width, heads, ff, mels, frames, vocab, b, tgt = cfg
        w = WhisperForConditionalGeneration(WhisperConfig(
            vocab_size=vocab, num_mel_bins=mels, encoder_layers=enc, decoder_layers=dec,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ff, decoder_ffn_dim=ff,
            d_model=width, max_source_positions=frames // 2, max_target_positions=max(tgt, 64),
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, decoder_start_token_id=1, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, use_cache=False, begin_suppress_tokens=None, suppress_tokens=None))
        features = torch.randn(b, mels, frames)
        labels = torch.randint(3, vocab, (b, tgt))
        return Case(name, f"Whisper ({enc}+{dec} layers x {width}, {heads} heads, ff {ff}, {mels} mel bins x "
                          f"{frames} frames, vocab {vocab}), batch {b}, {tgt} target tokens",
                    OutputLoss(w, ("input_features", "labels")), (features, labels))
    if name == "swin":
        from transformers import SwinConfig, SwinForImageClassification

        dim, depths, heads, window, image, patch, b = cfg
        swin = SwinForImageClassification(SwinConfig(
            image_size=image, patch_size=patch, embed_dim=dim, depths=list(depths), num_heads=list(heads),
            window_size=window, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0, drop_path_rate=0.1,
            num_labels=10, problem_type="single_label_classification"))
        return Case(name, f"Swin ({image} px, patch {patch}, dim {dim}, depths {list(depths)}, heads {list(heads)}, "
                          f"window {window}, drop path 0.1, hidden dropout 0.1), batch {b}",
                    OutputLoss(swin, ("pixel_values", "labels")),
                    (torch.randn(b, 3, image, image), torch.randint(0, 10, (b,))))
    if name == "clip":
        from transformers import CLIPConfig, CLIPModel

        tl, vl, width, heads, ff, vocab, seq, image, patch, b = cfg
        common = dict(hidden_size=width, intermediate_size=ff, num_attention_heads=heads, dropout=0.0,
                      attention_dropout=0.0)
        clip = CLIPModel(CLIPConfig(
            text_config=dict(vocab_size=vocab, num_hidden_layers=tl, max_position_embeddings=seq,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, **common),
            vision_config=dict(num_hidden_layers=vl, image_size=image, patch_size=patch, **common),
            projection_dim=width // 2))
        return Case(name, f"CLIP ({tl} text + {vl} vision layers x {width}, {heads} heads, ff {ff}, vocab {vocab}, "
                          f"{image} px patch {patch}, contrastive loss), batch {b} x {seq} tokens",
                    OutputLoss(clip, ("input_ids", "pixel_values"), return_loss=True),
                    (torch.randint(3, vocab, (b, seq)), torch.randn(b, 3, image, image)))
    if name == "wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

        convs, layers, width, heads, ff, classes, b, samples = cfg
        kernels, strides = (10,) + (3,) * (len(convs) - 1), (5,) + (2,) * (len(convs) - 1)
        # a classifier (mean-pooled): transformers' CTC loss breaks the graph (a data-dependent check
        # of the labels, masked_select, and aten._ctc_loss's output shape)
        w2v = Wav2Vec2ForSequenceClassification(Wav2Vec2Config(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff,
            conv_dim=convs, conv_kernel=kernels, conv_stride=strides, num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, hidden_dropout=0.1, activation_dropout=0.1, attention_dropout=0.1,
            final_dropout=0.1, layerdrop=0.0, apply_spec_augment=False, classifier_proj_size=width // 2,
            num_labels=classes, problem_type="single_label_classification"))
        # no graph break before the first conv (it sets requires_grad on its input, for gradient
        # checkpointing's sake); the parameters keep their gradients
        w2v.wav2vec2.feature_extractor._requires_grad = False
        frames = samples
        for k, st in zip(kernels, strides):
            frames = (frames - k) // st + 1
        return Case(name, f"Wav2Vec2 classifier (convs {list(convs)}, {layers} x {width}, {heads} heads, ff {ff}, "
                          f"dropouts 0.1, {classes} classes), batch {b} x {samples} samples ({frames} frames)",
                    OutputLoss(w2v, ("input_values", "labels")),
                    (torch.randn(b, samples), torch.randint(0, classes, (b,))))
    if name == "mamba":
        from transformers import MambaConfig, MambaForCausalLM

        layers, width, state, vocab, b, seq = cfg
        lm = MambaForCausalLM(MambaConfig(vocab_size=vocab, hidden_size=width, state_size=state,
                                          num_hidden_layers=layers, use_cache=False, bos_token_id=0,
                                          eos_token_id=0, pad_token_id=0))
        lm.loss_type = "ForCausalLM"
        return Case(name, f"Mamba ({layers} x {width}, state {state}, vocab {vocab}), batch {b} x {seq}",
                    LMLoss(lm), (torch.randint(0, vocab, (b, seq)),))
    if name == "cnn":
        from remat.zoo.cnn import ConvBN

        channels, blocks, b, image = cfg
        return Case(name, f"CNN + BatchNorm (ConvBN, {channels} channels, {blocks} residual blocks), "
                          f"batch {b} x 3 x {image} x {image}",
                    ClassifierLoss(ConvBN(channels=channels, blocks=blocks)),
                    (torch.randn(b, 3, image, image), torch.randint(0, 10, (b,))))
    if name == "resnet18":
        from remat.zoo.cnn import BasicBlock, ResNet

        (b,) = cfg
        return Case(name, f"ResNet-18 (width 8, one block per stage), batch {b} x 3 x 32 x 32",
                    ClassifierLoss(ResNet(BasicBlock, (1, 1, 1, 1), 8, 10)),
                    (torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))))
    if name == "mixtral":
        from transformers import MixtralConfig, MixtralForCausalLM

        layers, width, heads, kv, ff, experts, top, vocab, b, seq = cfg
        lm = MixtralForCausalLM(MixtralConfig(
            vocab_size=vocab, hidden_size=width, intermediate_size=ff, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, num_local_experts=experts, num_experts_per_tok=top,
            max_position_embeddings=max(seq, 256), attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
            pad_token_id=0, use_cache=False, output_router_logits=False))
        lm.loss_type = "ForCausalLM"
        return Case(name, f"Mixtral MoE ({layers} x {width}, {heads} heads / {kv} kv, {experts} experts of ff {ff}, "
                          f"top-{top}, vocab {vocab}, experts {lm.config._experts_implementation}), batch {b} x {seq}",
                    LMLoss(lm), (torch.randint(0, vocab, (b, seq)),))
    if name == "lora":
        llama_cfg, rank, alpha, dropout = cfg
        base = _build("llama", llama_cfg)
        lm = base.model.lm
        for p in lm.parameters():
            p.requires_grad_(False)
        for layer in lm.model.layers:
            attn = layer.self_attn
            attn.q_proj = LoRALinear(attn.q_proj, rank, alpha, dropout)
            attn.v_proj = LoRALinear(attn.v_proj, rank, alpha, dropout)
        trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
        return Case(name, f"LoRA fine-tune of a {base.description.split(', batch')[0]}: base weights frozen, "
                          f"rank {rank} (alpha {alpha}, dropout {dropout:g}) on q_proj and v_proj, "
                          f"{trainable} trainable parameters (plain torch, peft's layout, B std 0.01), batch "
                          f"{llama_cfg[6]} x {llama_cfg[7]}", base.model, base.inputs)
    if name == "convnext":
        dims, depths, image, patch, b = cfg
        return Case(name, f"ConvNeXt-style CNN (stem patch {patch}, widths {list(dims)}, blocks {list(depths)}: "
                          f"depthwise 7x7, LayerNorm, pointwise MLP x4 with GELU, layer scale), "
                          f"batch {b} x 3 x {image} x {image}",
                    ClassifierLoss(ConvNeXt(dims, depths, patch, 10)),
                    (torch.randn(b, 3, image, image), torch.randint(0, 10, (b,))))
    raise ValueError(f"unknown model {name!r}; models: {', '.join(BUDGET_SIZES)}")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable low-rank update, as peft's LoRA layer:
    ``base(x) + B(A(dropout(x))) * alpha / rank``, A Kaiming-uniform as peft's; B small
    (std 0.01) where peft starts it at zeros, as after some steps of training, so that A's
    gradient is not zero (the benchmarks' gradient checks)."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16, dropout: float = 0.0):
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=5 ** 0.5)
        nn.init.normal_(self.lora_b.weight, std=0.01)
        self.dropout = nn.Dropout(dropout)
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + self.lora_b(self.lora_a(self.dropout(x))) * self.scale


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block (Liu et al. 2022): depthwise 7x7 conv, LayerNorm over channels,
    pointwise MLP (4x, GELU), layer scale, residual."""

    def __init__(self, dim: int, layer_scale: float = 1e-6):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # N, H, W, C
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of an N, C, H, W tensor."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """A small ConvNeXt: a patchify stem (conv ``patch`` x ``patch``, stride ``patch``) and
    LayerNorm, stages of :class:`ConvNeXtBlock` joined by LayerNorm + 2x2 stride-2 convs, global
    average pooling, LayerNorm and a linear head."""

    def __init__(self, dims=(16, 32, 64), depths=(1, 1, 1), patch: int = 2, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], patch, stride=patch), ChannelNorm(dims[0], eps=1e-6)]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                layers += [ChannelNorm(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))



def loss_case(name: str):
    """``(model, inputs, loss)`` of ``zoo:NAME`` (the zoo's tiny size) or of a budget model
    (``NAME`` of :data:`BUDGET_SIZES`, quick; its model returns the loss): what the peak
    fidelity benchmark and its tests plan."""
    if name.startswith("zoo:"):
        from remat.zoo import registry

        c = registry.build(name[4:], "tiny")
        return c.model, c.inputs, c.loss
    c = budget_case(name, "quick")
    return c.model, c.inputs, (lambda out: out)

# -- the user trials: models no test names, each with its training step ------------------------------

def seeded_step(model: nn.Module, loss: Callable):
    """A training step: gradients zeroed, the generator seeded (every method draws the same
    dropout masks), ``loss()`` computed and its backward run. ``loss()`` may return the model's
    output instead (its ``.loss`` is run): the step then holds that output through the
    backward, as a loop that reads ``out.logits`` does."""

    def step():
        model.zero_grad(set_to_none=False)
        torch.manual_seed(3)
        out = loss()
        getattr(out, "loss", out).backward()

    return step


def bloom() -> nn.Module:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    cfg = BloomConfig(vocab_size=1024, hidden_size=128, n_layer=3, n_head=4, hidden_dropout=0.1,
                      attention_dropout=0.0)
    return BloomForCausalLM(cfg).train()


def opt() -> nn.Module:
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=3, ffn_dim=512, num_attention_heads=4,
                    max_position_embeddings=128, word_embed_proj_dim=128, dropout=0.1, attention_dropout=0.0)
    return OPTForCausalLM(cfg).train()


def phi() -> nn.Module:
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=1024, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
                    num_attention_heads=4, max_position_embeddings=128, partial_rotary_factor=0.5,
                    resid_pdrop=0.1, embd_pdrop=0.0, attention_dropout=0.0)
    return PhiForCausalLM(cfg).train()


def vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=128, num_hidden_layers=3,
                    num_attention_heads=4, intermediate_size=256, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.0, num_labels=10,
                    # set here, else the first call sets it and dynamo recompiles (both planned)
                    problem_type="single_label_classification")
    return ViTForImageClassification(cfg).train()


class VGGLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from remat.zoo.cnn import PooledConvBN

        self.net = PooledConvBN(widths=(16, 32, 64, 64), classes=10, side=32)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def vgg() -> nn.Module:
    torch.manual_seed(0)
    return VGGLoss().train()


def gptneox() -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=512, max_position_embeddings=128, use_parallel_residual=True,
                        attention_dropout=0.0, hidden_dropout=0.0)
    return GPTNeoXForCausalLM(cfg).train()


def lm_step(fn, model, ids):
    """``fn(input_ids=ids, labels=ids).loss`` backward, the generator seeded."""
    return seeded_step(model, lambda: fn(input_ids=ids, labels=ids).loss)


def lm_step_holding(fn, model, ids):
    """A step that holds the model's output (logits, cache) through the backward."""
    return seeded_step(model, lambda: fn(input_ids=ids, labels=ids))


def vit_step(fn, model, inputs):
    images, labels = inputs
    return seeded_step(model, lambda: fn(pixel_values=images, labels=labels).loss)


def vgg_step(fn, model, inputs):
    images, labels = inputs
    return seeded_step(model, lambda: fn(images, labels))


def gptneox_step(fn, model, ids, hold: bool = False):
    """GPT-NeoX's step (no dropout, so not seeded); ``hold``: the output lives through the backward."""

    def step():
        model.zero_grad(set_to_none=False)
        if hold:
            out = fn(input_ids=ids, labels=ids)
            out.loss.backward()
        else:
            fn(input_ids=ids, labels=ids).loss.backward()

    return step


def token_ids() -> torch.Tensor:
    return torch.randint(0, 1024, (4, 64), generator=torch.Generator().manual_seed(1))


def images() -> tuple:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


@dataclass(frozen=True)
class Trial:
    """A user trial: ``build()`` makes the model, ``make(fn, model, inputs)`` its step on
    ``inputs()``; ``solvers``: remat's solvers the trial's table adds a row for."""

    title: str
    build: Callable[[], nn.Module]
    make: Callable
    inputs: Callable[[], object]
    solvers: tuple[str, ...] = ()


USER_TRIALS: dict[str, Trial] = {
    "bloom": Trial("BLOOM (3 x 128, 4 heads, vocab 1024, hidden dropout 0.1), batch 4 x 64", bloom, lm_step,
                   token_ids),
    "opt": Trial("OPT (3 x 128, ffn 512, 4 heads, vocab 1024, dropout 0.1), batch 4 x 64", opt, lm_step,
                 token_ids, ("torch-mincut",)),
    "phi": Trial("Phi (3 x 128, ff 512, 4 heads, partial rotary 0.5, resid dropout 0.1), batch 4 x 64, "
                 "output held through the backward", phi, lm_step_holding, token_ids, ("torch-mincut",)),
    "vit": Trial("ViT (32 px, patch 4, 3 x 128, 4 heads, ff 256, hidden dropout 0.1), batch 16", vit, vit_step,
                 images, ("torch-mincut",)),
    "vgg": Trial("VGG-like CNN (PooledConvBN 16-32-64-64, 32 px), batch 16", vgg, vgg_step, images),
    "gptneox": Trial("GPT-NeoX (3 x 128, 4 heads, ff 512, parallel residual), batch 4 x 64", gptneox,
                     gptneox_step, token_ids),
}

# -- the MAGIS workloads (magis_table) ------------------------------------------------------------

def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class NestedUNet(nn.Module):
    """U-Net++ (Zhou et al. 2018), without deep supervision: node ``X[i][j]`` (level ``i``,
    ``j``-th node of the level) is a double conv (conv-BN-ReLU twice) of the concatenation of
    every earlier node of its level, ``X[i][0..j-1]`` (the dense skip connections), and the
    bilinear upsampling of ``X[i+1][j-1]``; ``X[i][0]`` is the encoder (max pool of
    ``X[i-1][0]``). The output is a 1x1 conv of ``X[0][levels]``. Channels ``base * 2**i``."""

    def __init__(self, base: int = 8, levels: int = 4, in_channels: int = 3, classes: int = 2):
        super().__init__()
        c = [base * 2 ** i for i in range(levels + 1)]
        self.levels = levels
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.nodes = nn.ModuleDict()
        for i in range(levels + 1):
            for j in range(levels + 1 - i):
                cin = (in_channels if i == 0 else c[i - 1]) if j == 0 else c[i] * j + c[i + 1]
                self.nodes[f"x{i}_{j}"] = _double_conv(cin, c[i])
        self.final = nn.Conv2d(c[0], classes, 1)

    def forward(self, x):
        X: list[list[torch.Tensor]] = [[] for _ in range(self.levels + 1)]
        X[0].append(self.nodes["x0_0"](x))
        for i in range(1, self.levels + 1):  # down the encoder; after each level, its diagonal
            X[i].append(self.nodes[f"x{i}_0"](self.pool(X[i - 1][0])))
            for j in range(1, i + 1):  # X[i-j][j] needs X[i-j+1][j-1], computed just before
                lvl = i - j
                X[lvl].append(self.nodes[f"x{lvl}_{j}"](torch.cat(X[lvl][:j] + [self.up(X[lvl + 1][j - 1])], 1)))
        return self.final(X[0][self.levels])



class WithLoss(nn.Module):
    """A zoo case's model with its loss: ``forward(*inputs) -> loss``, so that the whole step
    is one graph."""

    def __init__(self, model: nn.Module, loss: Callable):
        super().__init__()
        self.model = model
        self.loss_fn = loss

    def forward(self, *inputs):
        return self.loss_fn(self.model(*inputs))


class SegmentationLoss(nn.Module):
    """``forward(x) -> cross-entropy per pixel`` against fixed labels."""

    def __init__(self, net: nn.Module, labels: torch.Tensor):
        super().__init__()
        self.net = net
        self.register_buffer("labels", labels, persistent=False)

    def forward(self, x):
        return nn.functional.cross_entropy(self.net(x), self.labels)


# name -> size -> (zoo size, batch) for zoo entries; unetpp: (base, levels, image, batch)
MAGIS_SIZES: dict[str, dict[str, tuple]] = {
    "resnet50": {"default": ("small", 4), "quick": ("tiny", 8)},
    "bert": {"default": ("small", 4), "quick": ("tiny", 8)},
    "vit": {"default": ("small", 8), "quick": ("tiny", 8)},
    "unet": {"default": ("small", 4), "quick": ("tiny", 4)},
    "unetpp": {"default": (8, 4, 64, 2), "quick": (4, 2, 32, 4)},
    "gpt2": {"default": ("small", 4), "quick": ("tiny", 8)},
}
MAGIS_TITLES = {"resnet50": "ResNet-50", "bert": "BERT (MLM)", "vit": "ViT", "unet": "U-Net",
          "unetpp": "nested U-Net (U-Net++-like)", "gpt2": "GPT-2 (stands in for GPT-Neo)"}


def magis_case(name: str, size: str, seed: int = 0) -> Case:
    """A workload of ``benchmarks/magis_table.py`` at ``size`` (a key of :data:`MAGIS_SIZES`)."""
    cfg = MAGIS_SIZES[name][size]
    if name == "unetpp":
        base, levels, image, b = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = NestedUNet(base, levels)
            x = torch.randn(b, 3, image, image)
            y = torch.randint(0, 2, (b, image, image))
        model = SegmentationLoss(net, y).train()
        desc = (f"{MAGIS_TITLES[name]}: base {base}, {levels} levels, {image}x{image} px, 2 classes, batch {b}")
        return Case(name, desc, model, (x,), {"base": base, "levels": levels, "image": image, "batch": b})
    from remat.zoo.registry import build as zoo_build

    zoo_size, b = cfg
    zc = zoo_build(name, zoo_size, batch=b, seed=seed)
    model = WithLoss(zc.model, zc.loss).train()
    shapes = ", ".join("x".join(map(str, s)) for s in zc.input_shapes())
    desc = f"{MAGIS_TITLES[name]}: zoo {name} {zoo_size}, batch {zc.batch}, inputs {shapes}"
    return Case(name, desc, model, tuple(zc.inputs), {"zoo_size": zoo_size, "batch": zc.batch,
                                                      "inputs": zc.input_shapes()})


# -- the small models of single trials ---------------------------------------------------------------

class MixerBlock(nn.Module):
    def __init__(self, tokens: int, channels: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(),
                                      nn.Linear(4 * channels, channels))

    def forward(self, x):
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class WideMLP(nn.Module):
    """Three linear layers with GELUs on a wide batch, a sum-of-squares loss: activations
    dominate, and the loss sums over the batch (a region can hold the whole step)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                 nn.Linear(256, 8))

    def forward(self, x, labels):
        return (self.net(x) - nn.functional.one_hot(labels, 8)).square().sum()


class Mixer(nn.Module):
    def __init__(self, tokens: int = 64, channels: int = 128, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(48, channels)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, channels) for _ in range(depth)])
        self.head = nn.Linear(channels, classes)

    def forward(self, patches, labels):
        x = self.blocks(self.embed(patches))
        return nn.functional.cross_entropy(self.head(x.mean(1)), labels)



class InvertedResidual(nn.Module):
    def __init__(self, c: int, expand: int = 4) -> None:
        super().__init__()
        h = c * expand
        self.f = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.f(x)


class MobileNetLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU6())
        self.body = nn.Sequential(*[InvertedResidual(16) for _ in range(4)])
        self.head = nn.Linear(16, 10)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.head(self.body(self.stem(x)).mean((2, 3))), y)



class SkipMLP(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.enc = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d)) for _ in range(4)])
        self.dec = nn.ModuleList([nn.Sequential(nn.Linear(2 * d, d), nn.SiLU()) for _ in range(4)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        skips = []
        for e in self.enc:
            x = e(x)
            skips.append(x)
        for d, s in zip(self.dec, reversed(skips)):
            x = d(torch.cat([x, s], -1))
        return self.head(x).logsumexp(-1).mean()


# -- one model and its step, by name (predictions, partition_ranking, peak_trace) ---------------------

def model_case(name: str, device: str = "cpu"):
    """(model, step maker) of a budget model (:func:`budget_case`, ``quick``) or a user trial
    (:data:`USER_TRIALS`): ``make(fn, model)`` returns the training step of ``fn``, a compiled
    ``model``. GPT-NeoX's step holds its output through the backward, as a user's loop does."""
    if name in USER_TRIALS:
        t = USER_TRIALS[name]
        inputs = t.inputs()
        inputs = inputs.to(device) if isinstance(inputs, torch.Tensor) else tuple(x.to(device) for x in inputs)
        if name == "gptneox":
            return t.build().to(device), lambda fn, model: gptneox_step(fn, model, inputs, hold=True)
        return t.build().to(device), lambda fn, model: t.make(fn, model, inputs)
    case = budget_case(name, "quick", torch.float32, device)

    def make(fn, model):
        return make_step(fn, model, copy_inputs(case.inputs), "keep")

    return case.model, make
