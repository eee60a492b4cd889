"""transformers' names for its own checkpointing, as the tests call it: transformers 5's
``activation_checkpointing*`` where they exist, the older ``gradient_checkpointing*``
otherwise (5.x keeps those as deprecated aliases that warn)."""

from __future__ import annotations

import dataclasses


def checkpointing_arguments(kwargs: dict) -> dict:
    """``TrainingArguments`` keywords turning on transformers' checkpointing with ``kwargs`` for
    ``torch.utils.checkpoint``."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "activation_checkpointing" in names:
        return {"activation_checkpointing": True, "activation_checkpointing_kwargs": kwargs}
    return {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": kwargs}
