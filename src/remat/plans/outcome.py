"""What a plan says about how it was reached, as typed values other layers read: the attempts
a solver made on the way (:class:`Attempt`, ``plan.tried``), where the budget asked for was
out of reach, why the plan runs at its least memory instead (:class:`OutOfReach`,
``plan.out_of_reach``), and, for the least memory within a bounded slowdown, the bound and
whether the plan keeps it (:class:`TimeBound`, ``plan.time_bound``).

>>> a = Attempt("descent", "over_budget", 600, 9.0)
>>> Attempt.from_dict(a.to_dict()) == a
True
>>> OutOfReach.from_dict({"message": "too small", "smallest_feasible": 500}).note
''
>>> TimeBound.from_dict(TimeBound(1.0, 2.5, True, 700).to_dict()).met
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Attempt:
    """One plan a solver made on the way to its answer (``auto``'s portfolio, MAGIS's search
    from it): its solver, status and, where it had a valid schedule, its simulated peak,
    predicted seconds and compute cost."""

    solver: str
    status: str
    peak_bytes: int | None = None
    predicted_seconds: float | None = None
    compute_cost: float | None = None
    message: str = ""

    @classmethod
    def of(cls, plan: Any) -> "Attempt":
        """The attempt a :class:`~remat.plans.plan.Plan` was."""
        return cls(plan.solver, str(plan.status), plan.peak_bytes, plan.predicted_seconds,
                   plan.compute_cost, plan.message)

    @classmethod
    def from_dict(cls, d: "Mapping[str, Any] | Attempt") -> "Attempt":
        if isinstance(d, Attempt):
            return d
        return cls(str(d["solver"]), str(d["status"]), d.get("peak_bytes"), d.get("predicted_seconds"),
                   d.get("compute_cost"), str(d.get("message") or ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OutOfReach:
    """The budget a plan was asked for was out of reach, and it runs at the least memory remat
    found instead. ``message``: why (the solver's error); ``smallest_feasible``: the least peak
    that would have met a byte budget, where known; ``note``: what else the user may ask for
    (a plan that met it past ``"min"``'s time bound, and the byte budget that runs it)."""

    message: str
    smallest_feasible: int | None = None
    note: str = ""

    @classmethod
    def from_dict(cls, d: "Mapping[str, Any] | OutOfReach") -> "OutOfReach":
        if isinstance(d, OutOfReach):
            return d
        sf = d.get("smallest_feasible")
        return cls(str(d.get("message") or ""), None if sf is None else int(sf), str(d.get("note") or ""))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimeBound:
    """The slowdown bound a least-memory plan was chosen within (``budget="min"`` or
    ``max_overhead``): ``max_overhead`` (the share of the reference step's time), ``seconds``
    (the bound itself), ``met`` (whether the plan's predicted step keeps it: where even the plan
    without a budget is slower, the fastest plan no larger runs instead) and
    ``default_peak_bytes`` (the plan without a budget's peak, the cap on the plan's)."""

    max_overhead: float
    seconds: float
    met: bool
    default_peak_bytes: int | None = None

    @classmethod
    def from_dict(cls, d: "Mapping[str, Any] | TimeBound") -> "TimeBound":
        if isinstance(d, TimeBound):
            return d
        peak = d.get("default_peak_bytes")
        return cls(float(d["max_overhead"]), float(d["seconds"]), bool(d.get("met", True)),
                   None if peak is None else int(peak))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
