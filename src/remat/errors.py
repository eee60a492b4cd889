"""Exceptions and warnings raised by remat. Each message names what was wrong and what to do.

Every error remat raises on purpose is a :class:`RematError`; those about a value the user
gave (a budget, a solver name, an option) are also ``ValueError``. Inside ``torch.compile``
they reach the caller as themselves, not wrapped in dynamo's ``BackendCompilerFailed``::

    try:
        loss = step(x)
    except remat.InfeasibleBudgetError as e:
        print(e.smallest_feasible)
"""

from __future__ import annotations

from typing import Any


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


class GraphError(RematError, ValueError):
    """A graph is malformed: a cycle, an unknown input, a duplicate name, a bad field."""


class PlanError(RematError):
    """A solver could not produce a valid plan for a graph."""


class UnsupportedGraphError(RematError):
    """remat cannot plan a captured PyTorch graph (an op or value it does not understand).

    Inside ``torch.compile`` this triggers the fallback to PyTorch's own partitioner,
    unless ``strict=True`` was asked for.
    """


class OptionError(RematError, ValueError):
    """A value the caller gave that remat cannot use: an unknown option or solver, a negative
    time limit, inputs with nothing to differentiate; the message says what would work."""


class BudgetError(OptionError):
    """A budget remat cannot read (``1.5``, ``"abc"``): the message says what to write."""


class InfeasibleBudgetError(RematError):
    """No schedule remat found fits the budget; the message states the smallest that did.

    ``smallest_feasible``: that budget in bytes (None when unknown); ``plan``: the best
    :class:`~remat.plans.Plan` the solver returned, with its status and message.
    """

    def __init__(self, message: str, smallest_feasible: int | None = None, plan: Any = None):
        super().__init__(message)
        self.smallest_feasible = smallest_feasible
        self.plan = plan


class RematFallbackWarning(UserWarning):
    """remat could not plan a graph and used PyTorch's own partitioner instead."""


class RematCacheWarning(UserWarning):
    """A cached plan could not be used (a corrupt or stale entry: remat plans again and
    replaces it) or could not be stored."""


class RematBudgetWarning(UserWarning):
    """A graph of a multi-graph step could not meet its share of the step's budget: it runs
    at its least memory and the graphs after it get less (:mod:`remat.step.budget`)."""


class RematOffloadWarning(UserWarning):
    """remat plans a step without offloading where offloading was asked for: this torch's
    copy ops cannot run the lowering on the device (:func:`remat.lower.offload.offload_support`),
    or the host link could not be measured."""
