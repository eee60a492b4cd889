"""remat: make PyTorch training use less memory, and often less time.

remat captures a training step's joint forward+backward graph, decides for every
intermediate tensor whether to save it for the backward or recompute it (the fusion-aware
min cut of Yu & He; Checkmate's schedules under a memory budget), and runs that plan inside
``torch.compile``::

    import remat
    step = remat.compile(model)                 # torch.compile with remat's partitioner
    step = remat.compile(model, budget="6GiB")  # ... within a peak-memory budget
    print(remat.plan(model, x))                 # what is saved, what is recomputed
    torch.compile(model, backend="remat")       # the same, as a dynamo backend

The pipeline, one package per stage: :mod:`remat.graph` (the IR), :mod:`remat.capture`
(PyTorch -> Graph), :mod:`remat.cost`, :mod:`remat.solvers`, :mod:`remat.plans` (Plan,
Schedule, the simulator, budgets) and :mod:`remat.lower` (Plan -> torch.compile). The graph,
cost, plans and solvers do not import torch; ``compile``/``plan`` do.
"""

from __future__ import annotations

import sys

from .errors import (BudgetError, GraphError, InfeasibleBudgetError, OptionError, PlanError,
                     RematBudgetWarning, RematCacheWarning, RematError, RematFallbackWarning, RematOffloadWarning,
                     UnsupportedGraphError)
from .graph import Graph, Node, load_graph, save_graph
from .plans import Decision, Plan, PlanStatus, SavedValue, Schedule
from .solvers import solve

__version__ = "0.2.0"

_TORCH = ("compile", "plan", "plan_all", "frontier", "shapes", "checkpoint", "policy")


_CHUNKED = ("linear_cross_entropy", "chunked_loss")


def __getattr__(name: str):
    if name in ("checkpoint", "policy"):  # eager training: remat.eager
        import importlib

        return getattr(importlib.import_module(f".eager.{name}", __name__), name)
    if name in _CHUNKED:  # a loss along the tokens, for any model's hidden states
        from .eager import chunked

        return getattr(chunked, name)
    if name in _TORCH:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'remat' has no attribute {name!r}")


def _register() -> None:
    """Register ``backend="remat"`` now if torch is loaded; otherwise the package's
    ``torch_dynamo_backends`` entry point registers it when torch looks the name up, so
    that the torch-free layers (graph, solvers, plans) can be imported without torch."""
    if "torch" in sys.modules:
        from .lower.backend import register_backend

        register_backend()


_register()

__all__ = ["Graph", "Node", "Plan", "PlanStatus", "Decision", "SavedValue", "Schedule", "load_graph", "save_graph",
           "solve", "compile", "plan", "plan_all", "frontier", "shapes", "checkpoint", "policy",
           "linear_cross_entropy", "chunked_loss", "RematError", "GraphError", "PlanError",
           "UnsupportedGraphError", "OptionError", "BudgetError", "InfeasibleBudgetError",
           "RematFallbackWarning", "RematCacheWarning", "RematBudgetWarning", "RematOffloadWarning"]
