"""remat: make PyTorch training use less memory, and often less time.

remat captures a training step's joint forward+backward graph, decides for every
intermediate tensor whether to save it for the backward or recompute it (the fusion-aware
min cut of Yu & He), and runs that plan inside ``torch.compile``::

    import remat
    step = remat.compile(model)                 # torch.compile with remat's partitioner
    print(remat.plan(model, x))                 # what is saved, what is recomputed
    torch.compile(model, backend="remat")       # the same, as a dynamo backend

The graph IR, the solvers and plans (``remat.graph``, ``remat.solvers``, ``remat.plans``)
do not import torch; ``compile``/``plan`` do.
"""

from __future__ import annotations

from .errors import GraphError, PlanError, RematError, UnsupportedGraphError
from .graph.graph import Graph, Node
from .graph.io import load_graph, save_graph
from .plans.plan import Plan, SavedValue

__version__ = "0.1.0"

_LAZY = {"compile", "plan", "plan_all", "remat_backend", "RematPartitioner", "RematFallbackWarning"}


def __getattr__(name: str):
    if name in _LAZY:
        from . import api
        from .lower import partitioner

        return getattr(api, name, None) or getattr(partitioner, name)
    raise AttributeError(f"module 'remat' has no attribute {name!r}")


def _register() -> None:
    """Register ``backend="remat"`` now if torch is loaded; otherwise the package's
    ``torch_dynamo_backends`` entry point registers it when torch looks the name up, so
    that the torch-free layers (graph, solvers, plans) can be imported without torch."""
    import sys

    if "torch" in sys.modules:
        from .lower.backend import register_backend

        register_backend()


_register()

__all__ = ["Graph", "Node", "Plan", "SavedValue", "load_graph", "save_graph", "compile", "plan",
           "plan_all", "GraphError", "PlanError", "RematError", "UnsupportedGraphError"]
