"""What ``remat fit`` answers: per method, the largest batch (or sequence) that fits, with its
predicted peak and step time (no torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

FIT_FORMAT = "remat-fit"
FIT_VERSION = 1


@dataclass(frozen=True)
class MethodFit:
    """One method's answer. ``size``: the largest batch (or sequence) that fits (0: not even
    the smallest); ``exact``: the next size was probed and does not fit; ``peak_bytes``: the
    predicted peak on one GPU at ``size``, model states included; ``activation_bytes``: what
    the step's plan peaks at above them; ``seconds``: the predicted step time at ``size``;
    ``probes``: sizes planned, ``plan_seconds``: the time spent planning them; ``note``: why
    the method does not apply or stopped (empty when it ran). On Checkmate's graphs, whose costs
    are in a profiled unit, ``seconds`` is None and ``overhead`` the schedule's cost over the
    cost without recomputation."""

    method: str
    description: str
    size: int
    exact: bool
    peak_bytes: int | None
    activation_bytes: int | None
    seconds: float | None
    solver: str | None
    probes: int
    plan_seconds: float
    note: str = ""
    overhead: float | None = None  # Checkmate's graphs: the schedule's cost / the cost with no recomputation

    @property
    def per_item_seconds(self) -> float | None:
        """Step time per batch item (per token of the sequence with ``--sequence``)."""
        return self.seconds / self.size if self.seconds and self.size else None


@dataclass(frozen=True)
class FitResult:
    """``remat fit``'s answer for one model on one GPU: ``what`` is ``"batch"`` or
    ``"sequence"``; ``capacity_bytes`` the GPU's memory (less what was reserved),
    ``states`` the model states' bytes (:class:`remat.fit.states.ModelStates` as a dict, or
    Checkmate's fixed ``2 x params`` bytes), ``methods`` one :class:`MethodFit` each."""

    model: str
    gpu: str
    what: str
    capacity_bytes: int
    states: dict
    methods: list[MethodFit]
    setup: dict = field(default_factory=dict)
    capture_seconds: float = 0.0
    seconds: float = 0.0

    def method(self, name: str) -> MethodFit:
        for m in self.methods:
            if m.method == name:
                return m
        raise KeyError(f"no method {name!r} in this fit; it has {', '.join(m.method for m in self.methods)}")

    def to_dict(self) -> dict:
        return {"format": FIT_FORMAT, "version": FIT_VERSION, "model": self.model, "gpu": self.gpu,
                "what": self.what, "capacity_bytes": self.capacity_bytes, "states": self.states,
                "setup": self.setup, "capture_seconds": round(self.capture_seconds, 3),
                "seconds": round(self.seconds, 3),
                "methods": [{**asdict(m), "plan_seconds": round(m.plan_seconds, 3),
                             "per_item_seconds": m.per_item_seconds} for m in self.methods]}

    @classmethod
    def from_dict(cls, d: dict) -> FitResult:
        """The result :meth:`to_dict` (``remat fit --json``) wrote."""
        if d.get("format") != FIT_FORMAT:
            raise ValueError(f"not a remat fit result (format {d.get('format')!r})")
        names = set(MethodFit.__dataclass_fields__)
        methods = [MethodFit(**{k: v for k, v in m.items() if k in names}) for m in d["methods"]]
        return cls(d["model"], d["gpu"], d["what"], d["capacity_bytes"], d["states"], methods,
                   d.get("setup", {}), d.get("capture_seconds", 0.0), d.get("seconds", 0.0))
