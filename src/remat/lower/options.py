"""remat's options for a compiled training step, read and checked once (no torch).

``remat.compile``, ``remat.plan``, the ``"remat"`` dynamo backend and the benchmarks all build
their :class:`Options` here, so each accepts the same names and refuses the same mistakes with
the same message: an unknown option lists the valid ones, an unknown solver lists the solvers,
a budget remat cannot read says what to write. The solver's settings are read once, into the
:class:`~remat.solvers.request.Request` that every graph's solve is passed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import OptionError
from ..plans.budget import Budget
from ..solvers.registry import DEFAULT_TIME_LIMIT, request
from ..solvers.request import Request

COMPILERS = ("inductor", "eager")
"""``inductor`` compiles kernels; ``eager`` runs the same partitioned graphs op by op (no
codegen: fast to compile, for tests and inspection)."""

OUTPUTS = ("kept", "dropped")
"""Whether the caller holds the step's outputs (logits, caches) until its backward ends
(``kept``) or drops them when the forward returns (``dropped``)."""


@dataclass(frozen=True)
class Options:
    """How remat plans each graph of a step: the solve's :class:`~remat.solvers.request.Request`
    (solver, budget, time limit, the solver's options; read and checked once, by
    :meth:`create`, and passed down to every graph's solve) and what lowering decides.
    ``on_plan(graph, plan)`` is called for every graph remat plans (not on a compile-cache hit,
    where nothing is planned). ``cache``: look plans up in, and store them in, remat's plan
    cache (:mod:`remat.plans.cache`). ``verbose``: show each planning stage on the terminal
    (does not change the plans)."""

    request: Request = field(default_factory=lambda: Request("auto", time_limit=DEFAULT_TIME_LIMIT))
    strict: bool = False
    compiler: str = "inductor"
    on_plan: Callable[..., Any] | None = None
    cache: bool = True
    verbose: bool = False
    outputs: str = "kept"
    offload: bool = True
    """Let plans offload saved values to host memory where the copies are known to work on
    this torch and device (:func:`remat.lower.offload.offload_support`); False: never."""
    bandwidth: float | None = None
    """Bytes/s of the host link the plans assume, overriding the one measured for the device
    (:mod:`remat.capture.link`)."""
    plans_for: str | None = None
    """The compiler the plans are made for, where it is not the one that runs: ``remat.plan``
    runs ``eager`` to capture without codegen but plans for ``inductor`` (fused memory), as
    ``remat.compile`` would. Not a user option."""
    target: Any = None
    """The device the plans are made for where it is not the one that captures the step
    (:class:`remat.capture.target.Target`: ``remat.plan``'s ``device=`` and ``profile=``): the
    captured graph records it and is priced with its profile. Not a user option."""

    @property
    def solver(self) -> str:
        return self.request.solver

    @property
    def budget(self) -> Budget | None:
        return self.request.budget

    @property
    def time_limit(self) -> float | None:
        return self.request.time_limit

    @property
    def solver_options(self) -> Mapping[str, Any]:
        return self.request.options

    @property
    def planned_compiler(self) -> str:
        """The compiler the plans assume (its memory model): ``plans_for`` or ``compiler``."""
        return self.plans_for or self.compiler

    @classmethod
    def create(cls, *, solver: str = "auto", budget: Any = None, time_limit: Any = DEFAULT_TIME_LIMIT,
               solver_options: Any = None, **kwargs: Any) -> "Options":
        """Checked options from keyword arguments (``budget`` may be text or a number): the
        budget is read here, once, and the solver's settings become the one
        :class:`~remat.solvers.request.Request` the layers below pass down."""
        unknown = sorted(set(kwargs) - set(NAMES))
        if unknown:
            raise OptionError(f"unknown remat option {', '.join(map(repr, unknown))}; remat's options: "
                              f"{', '.join(NAMES)}")
        o = cls(**kwargs)
        parsed = None if budget is None else Budget.parse(budget)
        if not isinstance(o.strict, bool):
            raise OptionError(f"strict must be True or False, not {o.strict!r}")
        if o.compiler not in COMPILERS:
            raise OptionError(f"unknown compiler {o.compiler!r}; use one of {', '.join(COMPILERS)}")
        if o.on_plan is not None and not callable(o.on_plan):
            raise OptionError(f"on_plan must be a function on_plan(graph, plan), not {o.on_plan!r}")
        if not isinstance(o.verbose, bool):
            raise OptionError(f"verbose must be True or False, not {o.verbose!r}")
        if not isinstance(o.cache, bool):
            raise OptionError(f"cache must be True or False, not {o.cache!r}")
        if o.outputs not in OUTPUTS:
            raise OptionError(f"outputs must be 'kept' (the caller holds the step's outputs through "
                              f"the backward) or 'dropped' (it drops them when the forward returns, as "
                              f"model(x).loss.backward() does), not {o.outputs!r}")
        if not isinstance(o.offload, bool):
            raise OptionError(f"offload must be True (offload where the copies work on this torch and "
                              f"device) or False (never offload), not {o.offload!r}")
        if o.bandwidth is not None and (isinstance(o.bandwidth, bool) or not isinstance(o.bandwidth, (int, float))
                                        or not 0 < o.bandwidth < 1e18):  # 1 EB/s: finite, and a float
            raise OptionError(f"bandwidth must be the host link's bytes per second (25e9), not {o.bandwidth!r}")
        req = request(solver, budget=parsed, time_limit=time_limit, options=solver_options, on_graphs=False)
        return dataclasses.replace(o, request=req,
                                   bandwidth=None if o.bandwidth is None else float(o.bandwidth))

    def key(self) -> str:
        """What decides the plans (the callback does not): for compile caches."""
        opts = sorted(self.solver_options.items())
        budget = None if self.budget is None else (self.budget.kind, self.budget.value)
        return (f"{self.solver}|{budget}|{self.time_limit}|{self.strict}|{opts}|cache={self.cache}"
                f"|for={self.planned_compiler}|outputs={self.outputs}|offload={self.offload}"
                f"|bandwidth={self.bandwidth}"
                f"|target={None if self.target is None else self.target.key()}")


NAMES = ("solver", "budget", "time_limit", "strict", "compiler", "solver_options", "on_plan", "cache",
         "verbose", "outputs", "offload", "bandwidth")
"""remat's options, as ``remat.compile`` and the ``"remat"`` backend take them."""
