"""The model ``remat fit`` sizes, and the capture of its training step at a small size (torch).

A model is named one of three ways (:func:`workload`):

- a zoo entry (``"gpt2"``, ``"bert"``, ... :func:`remat.zoo.names`), at a zoo ``size``;
- a transformers config JSON (``config.json`` of a causal LM: ``"model_type"`` and its
  fields), built with random weights by ``AutoModelForCausalLM.from_config``, its causal-LM
  loss inside the step;
- ``"module:factory"``: ``factory(batch=B)`` (``factory(batch=B, sequence=S)`` with a
  sequence) returning a zoo :class:`~remat.zoo.Case`, a dict ``{"model", "inputs"[, "loss",
  "blocks"]}`` or a tuple ``(model, inputs)``; the step is ``loss(model(*inputs))`` (default
  loss: the output itself, or its ``.loss``, summed to a scalar).

:func:`capture_step` is the one place the step is captured. It runs the model once per size (a
small batch or sequence: the search scales the graphs, :mod:`remat.fit.family`), in the
training dtype: for real on this machine, or (``abstract``) built on the meta device and
captured on fake tensors, allocating nothing (:func:`remat.plan_all`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import OptionError
from ..graph.graph import Graph
from .methods import KNOB

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Step:
    """One training step to capture: ``loss(model(*inputs))``, with the model's ``blocks``
    (qualified module names full checkpointing wraps)."""

    model: nn.Module
    inputs: tuple
    loss: Callable[[Any], torch.Tensor]
    blocks: tuple[str, ...]


@dataclass
class Workload:
    """A model at any size: ``step(batch, sequence)`` builds the step; ``sequence`` is the
    default sequence length (None: the model has no sequence dimension ``remat fit`` can
    change), ``max_sequence`` the longest its positions allow."""

    name: str
    step: Callable[[int, int | None], Step]
    sequence: int | None = None
    max_sequence: int | None = None


def _output_loss(out) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        loss = out[0] if isinstance(out, (tuple, list)) else out
    return loss if loss.dim() == 0 else loss.float().sum()


def _positions(model: nn.Module) -> int | None:
    for m in model.modules():
        cfg = getattr(m, "config", None)
        for key in ("max_position_embeddings", "n_positions"):
            if cfg is not None and isinstance(getattr(cfg, key, None), int):
                return int(getattr(cfg, key))
    return None


def _tiled(x, batch: int | None, sequence: int | None):
    """``x`` with its sequence dimension (dim 1 of a 2-D integer tensor) tiled or cut to
    ``sequence``."""
    if not isinstance(x, torch.Tensor) or sequence is None or x.dim() != 2 or x.is_floating_point():
        return x
    reps = -(-sequence // x.shape[1])
    return x.repeat(1, reps)[:, :sequence].contiguous()


def _building(abstract: bool):
    """Where a model is built: on the meta device (nothing allocated) or for real."""
    return torch.device("meta") if abstract else contextlib.nullcontext()


def zoo_workload(name: str, size: str, dtype: torch.dtype, abstract: bool = False) -> Workload:
    from .. import zoo

    device = "meta" if abstract else "cpu"
    with _building(abstract):
        probe = zoo.build(name, size, dtype=dtype, device=device)
    seq = None
    ints = [x for x in probe.inputs if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.dim() == 2]
    if ints and len(ints) == len(probe.inputs) and probe.loss.__name__ == "_identity":
        seq = int(ints[0].shape[1])

    def step(batch: int, sequence: int | None) -> Step:
        with _building(abstract):
            c = zoo.build(name, size, batch=batch, dtype=dtype, device=device)
        if sequence is not None and seq is None:
            raise OptionError(f"zoo entry {name!r} has no sequence dimension remat fit can change "
                              "(its inputs are not token ids with the loss inside the model)")
        inputs = tuple(_tiled(x, batch, sequence) for x in c.inputs)
        return Step(c.model, inputs, c.loss, tuple(c.blocks))

    return Workload(f"{name} ({size})", step, seq, _positions(probe.model) if seq else None)


class _CausalLM(nn.Module):
    """``forward(ids) -> causal LM loss`` (labels = ids)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids, use_cache=False).loss


def config_workload(path: Path, dtype: torch.dtype, sequence: int | None, abstract: bool = False) -> Workload:
    """A transformers causal LM from its config JSON, random weights."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise OptionError(f"cannot read the transformers config {str(path)!r}: {e}") from e
    if not isinstance(data, dict) or "model_type" not in data:
        raise OptionError(f"{str(path)!r} is not a transformers config: it has no 'model_type' "
                          "(save one with config.save_pretrained(dir) or config.to_json_file(path))")
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(data)
    cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    for key in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout"):
        if hasattr(cfg, key):
            setattr(cfg, key, 0.0)
    from ..eager.blocks import find_blocks

    with torch.random.fork_rng(devices=[]), _building(abstract):
        torch.manual_seed(0)
        lm = AutoModelForCausalLM.from_config(cfg)
    lm.loss_type = "ForCausalLM"
    model = _CausalLM(lm).to(dtype).train()
    blocks = tuple(n for n, _ in find_blocks(model))
    vocab = int(getattr(cfg, "vocab_size", 256))
    longest = _positions(model)
    default = sequence or min(longest or 1024, 1024)

    def step(batch: int, seq: int | None) -> Step:
        if abstract:
            ids = torch.zeros((batch, seq or default), dtype=torch.long, device="meta")
        else:
            g = torch.Generator().manual_seed(batch * 7919 + (seq or default))
            ids = torch.randint(0, vocab, (batch, seq or default), generator=g)
        return Step(model, (ids,), lambda out: out, blocks)

    return Workload(Path(path).stem if Path(path).stem != "config" else Path(path).parent.name or "config",
                    step, default, longest)


def factory_workload(spec: str, dtype: torch.dtype) -> Workload:
    mod_name, _, fn_name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise OptionError(f"cannot load the model factory {spec!r} ({type(e).__name__}: {e}); give "
                          "'module:function' importable from here") from e

    def step(batch: int, sequence: int | None) -> Step:
        made = fn(batch=batch) if sequence is None else fn(batch=batch, sequence=sequence)
        if hasattr(made, "model") and hasattr(made, "inputs"):
            model, inputs, loss, blocks = made.model, made.inputs, made.loss, made.blocks
        elif isinstance(made, dict):
            model, inputs = made["model"], made["inputs"]
            loss, blocks = made.get("loss", _output_loss), made.get("blocks")
        elif isinstance(made, tuple) and len(made) == 2:
            (model, inputs), loss, blocks = made, _output_loss, None
        else:
            raise OptionError(f"{spec} returned {type(made).__name__}; return a zoo Case, a dict with "
                              "'model' and 'inputs', or a tuple (model, inputs)")
        if blocks is None:
            from ..eager.blocks import find_blocks

            blocks = [n for n, _ in find_blocks(model)]
        inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                       for x in (inputs if isinstance(inputs, (tuple, list)) else (inputs,)))
        return Step(model.to(dtype).train(), inputs, loss, tuple(blocks))

    return Workload(spec, step, None, None)


def workload(model: str, *, size: str = "full", dtype: str = "bfloat16", sequence: int | None = None,
             abstract: bool = False) -> Workload:
    """The :class:`Workload` ``model`` names (see the module docstring); an
    :class:`~remat.errors.OptionError` says what is wrong with a name remat cannot use.
    ``abstract``: the model and its inputs built on the meta device, nothing allocated (a
    factory is called as it is: build on the meta device inside it to get the same)."""
    from .. import zoo

    tdtype = TORCH_DTYPES[dtype]
    text = str(model)
    if text.endswith(".json") or Path(text).is_file():
        if not Path(text).is_file():
            raise OptionError(f"no transformers config file {text!r}")
        return config_workload(Path(text), tdtype, sequence, abstract)
    if ":" in text:
        return factory_workload(text, tdtype)
    if text not in zoo.names():
        raise OptionError(f"unknown model {text!r}: give a zoo entry ({', '.join(zoo.names('model'))}, ...), "
                          "a transformers config JSON, 'module:factory', or checkmate:NAME for "
                          "Checkmate's graphs")
    return zoo_workload(text, size, tdtype, abstract)


class _TrainStep(nn.Module):
    """``forward(*inputs) -> loss(model(*inputs))``: the step as a module, so that a model on
    the meta device is seen as one (its parameters captured as parameters)."""

    def __init__(self, model: nn.Module, loss: Callable) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, *inputs):
        return self.loss(self.model(*inputs))


def capture_step(step: Step, name: str) -> Graph:
    """The joint graph of ``step`` as remat plans it for inductor, with plain
    ``torch.compile``'s saved set (``meta["reference_saved"]``) and PyTorch's at
    ``activation_memory_budget`` :data:`~remat.fit.methods.KNOB` (``meta["knob_saved"]``)
    recorded. A model on the meta device is captured on fake CPU tensors
    (:func:`remat.plan_all`'s planning without allocating), any other runs once, for real, on
    this machine."""
    from torch._functorch import config as functorch_config

    from ..api import plan_all

    model, loss = step.model, step.loss
    for m in model.modules():  # a training step keeps no KV cache (transformers' models make one)
        cfg = getattr(m, "config", None)
        if getattr(cfg, "use_cache", None):
            cfg.use_cache = False

    train_step = _TrainStep(model, loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with functorch_config.patch(activation_memory_budget=KNOB):
            plans = plan_all(train_step, *step.inputs, solver="torch-mincut", cache=False,
                             for_compiler="inductor")
    if len(plans) != 1:
        raise OptionError(f"the training step of {name} captured as {len(plans)} graphs (graph breaks); "
                          "remat fit sizes a step of one graph: remove the breaks (torch._dynamo.explain "
                          "lists them)")
    g = plans[0].graph
    g.meta["knob_saved"] = list(plans[0].saved_names)
    return g


def block_param_bytes(step: Step) -> int:
    """Bytes of the parameters of the model's largest block (0 without blocks)."""
    sizes = [sum(p.numel() * p.element_size() for p in step.model.get_submodule(b).parameters())
             for b in step.blocks]
    return max(sizes, default=0)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
