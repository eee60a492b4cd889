"""``remat fit``: the largest batch or sequence a training step fits on a GPU, per method.

:func:`fit` captures the step at three small sizes here, scales its graph to any size
(:mod:`remat.fit.family`), and for each method (no checkpointing, plain ``torch.compile``,
full checkpointing, PyTorch's ``activation_memory_budget``, remat at 0.5 and ``"min"``, with
fission and offloading: :mod:`remat.fit.methods`) searches the largest size whose predicted
peak, with the model states (:mod:`remat.fit.states`), fits the GPU's memory
(:mod:`remat.fit.fitting`, :mod:`remat.fit.search`). The torch-free parts import without torch.
"""

from __future__ import annotations

__all__ = ["FitResult", "MethodFit", "ModelStates", "fit", "model_states"]


def __getattr__(name: str):
    if name == "fit":
        from .entry import fit

        return fit
    if name in ("FitResult", "MethodFit"):
        from . import result

        return getattr(result, name)
    if name in ("model_states", "ModelStates"):
        from . import states

        return getattr(states, name)
    raise AttributeError(f"module 'remat.fit' has no attribute {name!r}")
