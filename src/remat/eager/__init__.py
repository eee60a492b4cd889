"""Planned selective activation checkpointing for eager training (no ``torch.compile``).

``remat.checkpoint(model, budget=...)`` (:mod:`remat.eager.checkpoint`) and
``remat.policy(model, budget=...)`` (:mod:`remat.eager.policy`, a ``context_fn`` for
``torch.utils.checkpoint`` and transformers' ``activation_checkpointing_enable``). The stages:
:mod:`~remat.eager.blocks` (which modules are blocks), :mod:`~remat.eager.capture` (a block's
ATen op calls, as SAC's policy sees them), :mod:`~remat.eager.plan` (torch-free: the block's
graph, costs, frontier and the step's choice), :mod:`~remat.eager.summary` (what the user sees).
Submodules load on first use.
"""

from __future__ import annotations

_EXPORTS = {"RematPolicy": "policy", "Planner": "policy", "Summary": "summary", "find_blocks": "blocks"}
# (``checkpoint`` and ``policy`` are submodules here; the functions are ``remat.checkpoint`` and ``remat.policy``)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'remat.eager' has no attribute {name!r}")


__all__ = list(_EXPORTS)
