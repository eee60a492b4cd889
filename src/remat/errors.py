"""Exceptions raised by remat. Each message names what was wrong and what to do."""


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


class InfeasibleBudgetError(RematError):
    """No schedule remat found fits the budget; the message states the smallest that did."""

    def __init__(self, message: str, smallest_feasible: int | None = None):
        super().__init__(message)
        self.smallest_feasible = smallest_feasible
