"""remat's options for a compiled training step, read and checked once (no torch).

``remat.compile``, the ``"remat"`` dynamo backend and the benchmarks all build their
:class:`Options` here, so each accepts the same names and refuses the same mistakes with the
same message: an unknown option lists the valid ones, an unknown solver lists the solvers, a
budget remat cannot read says what to write.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import OptionError
from ..plans.budget import Budget
from ..solvers import DEFAULT_TIME_LIMIT, check_options, check_time_limit

COMPILERS = ("inductor", "eager")
"""``inductor`` compiles kernels; ``eager`` runs the same partitioned graphs op by op (no
codegen: fast to compile, for tests and inspection)."""

OUTPUTS = ("kept", "dropped")
"""Whether the caller holds the step's outputs (logits, caches) until its backward ends
(``kept``) or drops them when the forward returns (``dropped``)."""


@dataclass(frozen=True)
class Options:
    """How remat plans each graph of a step. ``on_plan(graph, plan)`` is called for every
    graph remat plans (not on a compile-cache hit, where nothing is planned). ``cache``: look
    plans up in, and store them in, remat's plan cache (:mod:`remat.plans.cache`).
    ``verbose``: show each planning stage on the terminal (does not change the plans)."""

    solver: str = "auto"
    budget: Budget | None = None
    time_limit: float | None = DEFAULT_TIME_LIMIT
    strict: bool = False
    compiler: str = "inductor"
    solver_options: Mapping[str, Any] = field(default_factory=dict)
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

    @property
    def planned_compiler(self) -> str:
        """The compiler the plans assume (its memory model): ``plans_for`` or ``compiler``."""
        return self.plans_for or self.compiler

    @classmethod
    def create(cls, **kwargs: Any) -> "Options":
        """Checked options from keyword arguments (``budget`` may be text or a number)."""
        unknown = sorted(set(kwargs) - set(NAMES))
        if unknown:
            raise OptionError(f"unknown remat option {', '.join(map(repr, unknown))}; remat's options: "
                              f"{', '.join(NAMES)}")
        o = cls(**kwargs)
        budget = None if o.budget is None else Budget.parse(o.budget)
        if not isinstance(o.strict, bool):
            raise OptionError(f"strict must be True or False, not {o.strict!r}")
        if o.compiler not in COMPILERS:
            raise OptionError(f"unknown compiler {o.compiler!r}; use one of {', '.join(COMPILERS)}")
        if o.on_plan is not None and not callable(o.on_plan):
            raise OptionError(f"on_plan must be a function on_plan(graph, plan), not {o.on_plan!r}")
        if not isinstance(o.solver_options, Mapping):
            raise OptionError(f"solver_options must be a dict of the solver's options, not {o.solver_options!r}")
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
                                        or not o.bandwidth > 0):
            raise OptionError(f"bandwidth must be the host link's bytes per second (25e9), not {o.bandwidth!r}")
        check_options(o.solver, dict(o.solver_options), budget)
        return cls(o.solver, budget, check_time_limit(o.time_limit), o.strict, o.compiler,
                   dict(o.solver_options), o.on_plan, o.cache, o.verbose, o.outputs, o.offload,
                   None if o.bandwidth is None else float(o.bandwidth))

    def key(self) -> str:
        """What decides the plans (the callback does not): for compile caches."""
        opts = sorted(self.solver_options.items())
        budget = None if self.budget is None else (self.budget.kind, self.budget.value)
        return (f"{self.solver}|{budget}|{self.time_limit}|{self.strict}|{opts}|cache={self.cache}"
                f"|for={self.planned_compiler}|outputs={self.outputs}|offload={self.offload}"
                f"|bandwidth={self.bandwidth}")


NAMES = ("solver", "budget", "time_limit", "strict", "compiler", "solver_options", "on_plan", "cache",
         "verbose", "outputs", "offload", "bandwidth")
