"""What one solve is asked: the :class:`Request`, made and checked once, then passed down.

``remat.compile``/``remat.plan`` (through :class:`remat.lower.options.Options`),
``remat.solve`` and ``cached_solve`` each make one with
:func:`remat.solvers.registry.request`, which reads the budget (:meth:`Budget.parse
<remat.plans.budget.Budget.parse>`) and checks the solver, its options and the time limit, once.
Every layer below (the partitioner's share of a step's budget, the plan cache's key, the
registry's run and judging) takes the request as it is: nothing is parsed or checked again.
A layer that plans with something else (a graph's share of the step's budget, ``auto`` where
a solver may not offload) derives a new request with :meth:`Request.within` or
:meth:`Request.using`, from values it already holds.

>>> from remat.plans.budget import Budget
>>> r = Request("mincut-aggressive", Budget.parse(0.6), 10.0)
>>> r.within(Budget.of_bytes(4096), headroom=0.01).budget.kind, r.budget.text
('bytes', '0.6')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from ..cost.model import CostModel, default_cost_model
from ..graph.graph import Graph
from ..plans.budget import Budget


@dataclass(frozen=True)
class Request:
    """One solve's settings, read and checked. ``budget``: the parsed budget (None: none);
    ``time_limit``: seconds (None: no limit); ``options``: the solver's own (read-only);
    ``headroom``: the share of a byte budget left free
    (:data:`~remat.plans.budget.TORCH_HEADROOM` on a real step); ``cost_model``: None for the
    graph's own (:func:`~remat.cost.model.default_cost_model`)."""

    solver: str
    budget: Budget | None = None
    time_limit: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    headroom: float = 0.0
    cost_model: CostModel | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.options, MappingProxyType):
            object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __reduce__(self):
        # a read-only view of the options cannot be pickled or deep-copied: its dict can
        return (Request, (self.solver, self.budget, self.time_limit, dict(self.options), self.headroom,
                          self.cost_model))

    def within(self, budget: Budget | None, headroom: float = 0.0) -> "Request":
        """The same request for another budget (a graph's share of the step's)."""
        return dataclasses.replace(self, budget=budget, headroom=headroom)

    def using(self, solver: str | None = None, options: Mapping[str, Any] | None = None) -> "Request":
        """The same request with another solver and/or other options."""
        return dataclasses.replace(self, solver=self.solver if solver is None else solver,
                                   options=self.options if options is None else options)

    def cost_model_for(self, graph: Graph) -> CostModel:
        return self.cost_model or default_cost_model(graph)

    def asked_bytes(self, graph: Graph) -> int | None:
        """The budget in bytes for ``graph`` (0 for ``"min"``), None without one."""
        return None if self.budget is None else self.budget.bytes_for(graph)

    def planned_bytes(self, graph: Graph) -> int | None:
        """What the solver plans within: the budget less the headroom; None without one."""
        return None if self.budget is None else self.budget.planned_bytes(graph, self.headroom)

    @property
    def bounded(self) -> bool:
        """A budget in bytes or a fraction (not None, not ``"min"``)."""
        return self.budget is not None and self.budget.kind in ("bytes", "fraction")


__all__ = ["Request"]
