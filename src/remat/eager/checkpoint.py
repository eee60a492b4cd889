"""``remat.checkpoint(model, budget=...)``: planned selective checkpointing for eager training.

Applied in place, like FSDP2's ``fully_shard``; returns the model. Each block (see
:mod:`remat.eager.blocks`) runs under non-reentrant ``torch.utils.checkpoint`` with a SAC
policy remat plans (:mod:`remat.eager.policy`); blocks whose plan saves everything, and blocks
remat cannot capture, run unwrapped. On a transformers model that supports gradient
checkpointing the same policy goes through transformers' own route,
``model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False,
"context_fn": ...})``; on any other model remat replaces each block's ``forward`` (an
instance attribute) by one that checkpoints it.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint as _torch_checkpoint

from ..errors import OptionError
from .blocks import enable_transformers_checkpointing
from . import lm_head
from .policy import Planner, RematPolicy, _raw_forward


def checkpoint(model: torch.nn.Module, budget="full", blocks=None, *, strict: bool = False,
               offload: bool = False, profile=None, route: str = "auto", head: bool = True) -> torch.nn.Module:
    """Plan and apply selective activation checkpointing to ``model``'s blocks; returns ``model``.

    - ``budget``: for the whole training step. A fraction ``f`` (``0.5``, ``"50%"``) is ``f`` times
      the step's predicted peak above resident memory without checkpointing (the blocks' saved
      activations, measured at capture, plus what autograd saves outside the blocks, measured
      in the first step); bytes (``"2GiB"``, an int) bound the step's peak including the
      parameters and their gradients (optimizer state is not counted); ``"min"``: the least
      memory; ``"full"`` (the default): full checkpointing's predicted peak, with the least
      recomputation that keeps it; ``None``: no budget, as everywhere in remat: the step as it runs
      without checkpointing (nothing recomputed). Out of reach: a :class:`remat.RematBudgetWarning` naming the least reachable,
      and the step runs at that least; with ``strict=True``, :class:`remat.InfeasibleBudgetError`.
    - ``blocks``: which modules are blocks (a class, a list of module names, a predicate
      ``f(name, module)``); default: transformers' layers, else same-class children of a ModuleList,
      Sequential or ModuleDict (torchtitan's layers).
    - ``offload``: when true, the plan also keeps values in host memory where their two copies
      over the measured link (:func:`remat.eager.offload.eager_link`) cost less than their
      recomputation, or fit beside the block's compute on an asynchronous link
      (:func:`remat.eager.offload.choose_offloads`); a checkpointed block moves them through
      :func:`remat.eager.offload.wrap_sac_contexts`; a block left unwrapped keeps what autograd
      saves on the device. The plan's ``decisions`` (:func:`remat.eager.plan.decisions`) map each
      op call ``(op name, call index)`` to ``"save"``, ``"recompute"`` or ``"offload"``.
    - ``head``: on a transformers causal LM (peft's wrappers included), plan its head and loss
      too: in a training call with ``labels``, the output embedding, the model's logit
      post-processing and its loss run along the tokens a chunk at a time, with the
      gradients of each chunk taken in the forward (Liger-Kernel's fused linear cross-entropy,
      in plain torch: :mod:`remat.eager.lm_head`), when the budget asks for it; the loss and its
      gradients are the model's and ``outputs.logits`` is None. ``head=False`` keeps the model's
      own head. Any other model can call :func:`remat.linear_cross_entropy` on its hidden states.
    - ``route``: ``"auto"`` (transformers' ``activation_checkpointing_enable`` on models with
      ``supports_gradient_checkpointing``, else remat's own wrapper), ``"transformers"`` or ``"wrap"``.

    Plans are made at the first training call of each (block class, input signature) and cached;
    ``model.remat_summary()`` reports what each block class saves and recomputes, and the
    predicted peak and step time against no and full checkpointing. Calls without grad (eval,
    ``torch.no_grad()``) run the blocks as they are.
    """
    if route not in ("auto", "transformers", "wrap"):
        raise OptionError(f"route={route!r}: use 'auto', 'transformers' or 'wrap'")
    old = getattr(model, "_remat_planner", None)
    if old is not None:
        _undo(model, old)
    if not isinstance(head, bool):
        raise OptionError(f"head must be True (plan the head and loss of a causal LM) or False, not {head!r}")
    planner = Planner(model, budget=budget, blocks=blocks, strict=strict, profile=profile, offload=offload,
                      head=head)
    hf = bool(getattr(model, "supports_gradient_checkpointing", False)) and hasattr(model, "gradient_checkpointing_enable")
    if route == "transformers" and not hf:
        raise OptionError(f"{type(model).__name__} does not support transformers' gradient checkpointing: "
                          "use route='auto' or 'wrap'")
    use_hf = hf and route != "wrap" and all(hasattr(m, "_can_checkpoint_with_cache") for _, m in planner.blocks)
    planner.install_hooks()
    if use_hf:
        planner.hf_route = True
        fn = RematPolicy(planner)
        kwargs = {"use_reentrant": False, "context_fn": fn}
        enable_transformers_checkpointing(model, **kwargs)
    else:
        for name, m in planner.blocks:
            m.forward = functools.partial(_checkpointed_forward, planner, name, m, _raw_forward(m))
    lm_head.install(planner)
    model._remat_planner = planner
    model.remat_summary = planner.summary
    return model


def _checkpointed_forward(planner: Planner, name: str, module, forward, *args, **kwargs):
    if not (torch.is_grad_enabled() and module.training):
        return forward(*args, **kwargs)
    # the block's pre-hook has planned this call's signature (Planner._pre_hook)
    bp = planner.plans.get(planner.block_key.get(name))
    point = planner.choice.get(name)
    if bp is None or not bp.supported or point is None:
        return forward(*args, **kwargs)
    if point.unwrapped:  # holds what autograd saves, on the device (the plan's memory model)
        return forward(*args, **kwargs)
    # saving nothing is plain checkpointing (Planner.context_fn returns no dispatch mode then)
    return _torch_checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                             context_fn=functools.partial(planner.context_fn, planner.tables(bp, point), name),
                             **kwargs)


def _undo(model, planner: Planner) -> None:
    planner.remove_hooks()
    lm_head.uninstall(planner)
    for _, m in planner.blocks:
        if "forward" in m.__dict__:
            del m.__dict__["forward"]
    for attr in ("_remat_planner", "remat_summary"):
        if attr in model.__dict__:
            del model.__dict__[attr]
