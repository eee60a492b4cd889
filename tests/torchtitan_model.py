"""A tiny Llama 3 from torchtitan's own model definition (``torchtitan.models.llama3``), for the
FSDP2 tests (``tests/test_torchtitan_fsdp.py``, ``tests/torchtitan_worker.py``).

torchtitan 0.2 builds it from its model args dataclass (``TransformerModelArgs``, then
``Transformer(args).init_weights()``); 0.3 from config dataclasses (``Llama3Model.Config`` with
one ``Llama3TransformerBlock.Config`` per layer, ``cfg.build()``, then ``init_states()``). Both
keep the layers in an ``nn.ModuleDict`` and rotate with complex-valued frequencies; 0.3 fuses
the attention projections into one ``wqkv``. 0.3's language models attend through FlexAttention,
which has no backward on a CPU (``NotImplementedError`` from torch 2.13); these tests use its
``ScaledDotProductAttention`` (causal, no mask) instead, as 0.2 does by default.

Importing any torchtitan model imports its expert-parallel kernels
(``torchtitan.distributed.minimal_async_ep.kernels``), written in Triton, which a CPU build of
torch does not have and the package does not require. :func:`import_without_triton` puts a
module in their place whose kernels raise if called (a dense Llama never calls them), so the
model definitions import on a CPU; importing this module does it.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from functools import partial

import torch
from torch import nn

DIM, HEADS, KV_HEADS, LAYERS, VOCAB, SEQ = 64, 4, 2, 2, 128, 32

# torchtitan's Triton kernels (expert parallelism, MoE token permutation) that its model
# packages import at the top, by version: 0.3, 0.2
_TRITON_MODULES = {
    "torchtitan.distributed.minimal_async_ep.kernels": (
        "copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
        "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
        "reduce_topk_slots_kernel", "topk_scores_grad_kernel"),
    "torchtitan.models.moe.kernels": ("generate_permute_indices", "fill_indices_wrapper"),
}


def import_without_triton() -> None:
    """Where Triton is missing, stand in for torchtitan's Triton kernels (never called by a
    dense model) so that ``torchtitan.models`` imports."""
    if importlib.util.find_spec("triton") is not None:
        return

    def missing(name):
        def kernel(*args, **kwargs):
            raise RuntimeError(f"torchtitan's {name} needs Triton, which is not installed")
        return kernel

    for path, names in _TRITON_MODULES.items():
        if path not in sys.modules:
            module = types.ModuleType(path)
            for name in names:
                setattr(module, name, missing(name))
            sys.modules[path] = module


import_without_triton()  # before anything imports torchtitan (0.2's own __init__ imports them)


def _legacy() -> bool:
    """torchtitan 0.2's layout (``TransformerModelArgs``, ``Transformer``), which pip picks
    beside transformers 5 (0.3 pins ``datasets<4.8``, whose ``huggingface_hub`` transformers 5
    does not take)."""
    import_without_triton()
    try:
        return importlib.util.find_spec("torchtitan.models.llama3.model.args") is not None
    except ModuleNotFoundError:  # 0.3: torchtitan.models.llama3.model is a module
        return False


def llama3():
    """A 2-layer torchtitan Llama 3 (width 64, 4 heads / 2 kv heads, vocabulary 128, causal
    SDPA), its weights initialised by torchtitan from ``torch.manual_seed(0)``."""
    if _legacy():
        from torchtitan.models.llama3.model.args import TransformerModelArgs
        from torchtitan.models.llama3.model.model import Transformer

        args = TransformerModelArgs(dim=DIM, n_layers=LAYERS, n_heads=HEADS, n_kv_heads=KV_HEADS,
                                    vocab_size=VOCAB, multiple_of=64, max_seq_len=SEQ, attn_type="sdpa")
        torch.manual_seed(0)
        model = Transformer(args)
        with torch.no_grad():  # as torchtitan's trainer calls it
            model.init_weights()
        return model
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3 import Llama3Model
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    linear = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    ones = {"weight": nn.init.ones_}

    def layer():
        attention = make_gqa_config(
            dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, wqkv_param_init=linear, wo_param_init=linear,
            inner_attention=ScaledDotProductAttention.Config(), fuse_qkv=True,
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ, theta=500000.0))
        return Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=DIM, param_init=ones),
            ffn_norm=RMSNorm.Config(normalized_shape=DIM, param_init=ones), attention=attention,
            feed_forward=make_ffn_config(dim=DIM, hidden_dim=4 * DIM, w1_param_init=linear, w2w3_param_init=linear))

    config = Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB, layers=[layer() for _ in range(LAYERS)],
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM,
                                        param_init={"weight": partial(nn.init.normal_, std=1.0)}),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=ones),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=linear))
    torch.manual_seed(0)
    model = config.build()
    model.init_states()
    return model


def block_class() -> type:
    """torchtitan's transformer block class."""
    if _legacy():
        from torchtitan.models.llama3.model.model import TransformerBlock

        return TransformerBlock
    from torchtitan.models.llama3.model import Llama3TransformerBlock

    return Llama3TransformerBlock


def loss(model, ids: torch.Tensor) -> torch.Tensor:
    """The next-token cross-entropy of ``ids`` (torchtitan's models return the logits)."""
    logits = model(ids)
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
