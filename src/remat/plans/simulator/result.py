"""What the simulator returns: :class:`SimResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import PlanError

MAX_ERRORS = 20
"""Problems a result lists at most."""


@dataclass
class SimResult:
    valid: bool
    errors: list[str]
    peak_bytes: int
    peak_statement: int  # index of the statement at which the peak is first reached (-1: at start)
    timeline: list[int]  # bytes resident after each statement
    constant_bytes: int  # inputs and parameters, resident throughout
    end_bytes: int  # resident when the schedule ends (kept values and leaks)
    compute_cost: float  # additive per-op cost (Checkmate): sum over compute statements
    traffic_bytes: int  # fusion-aware memory traffic of the computed values
    predicted_seconds: float  # the cost model's time for the whole schedule
    computes: int
    recomputes: int  # compute statements beyond the first of each node
    meta: dict = field(default_factory=dict)
    # swapping (offload/reload statements) on two streams, in the graph's time unit
    offloads: int = 0
    reloads: int = 0
    copy_seconds: float = 0.0  # the copy stream's busy time (on a CPU, copies on the one stream)
    wait_seconds: float = 0.0  # added to the step by copies: compute waiting, or copies after it
    host_peak_bytes: int = 0  # host memory the offloaded values take at most
    times: list = field(default_factory=list)  # (stream, start, end) per statement, with timeline

    def within(self, budget: float) -> bool:
        return self.valid and self.peak_bytes <= budget

    def check(self) -> "SimResult":
        """Raise :class:`PlanError` naming the first problem when the schedule is invalid."""
        if not self.valid:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            raise PlanError(f"invalid schedule: {self.errors[0]}{more}")
        return self
