"""A solver's time limit, counted from when the solver started, and the shares of it that its
stages take.

A stage that may search long (the staged baselines, the peak descent, MAGIS's search and its
re-ordering) gets a *share*: a fraction of one scale, :data:`SCALE` seconds (the default time
limit), and never more than what is left of the call's time limit. Under the default limit,
a longer one or none, each stage gets the seconds it always had (a tenth of 60 s: 6 s); a
caller who asks for 2 s waits 2 s at most, whatever stages run. Lowering :data:`SCALE` (a test
suite may) shortens every stage at once.

These shares are safety stops. The stages that search stop first on work, a count derived
from the graph's size, so that planning one graph with one set of options gives one plan on
an idle machine (``budget="min"`` used to exceed a byte budget in one run and meet it in
the next): the peak descent (:func:`remat.solvers.descent.descent_trials` moves), the staged
baselines that search (:func:`remat.solvers.portfolio.staged_evaluations` schedules each) and
MAGIS's search (:func:`remat.solvers.magis.search.search_states` states). Stops still on the
clock alone: the frontier's (it ends on its own first, a few max-flows), the re-ordering of
the search's best schedule (a DP that ends well within its share on the zoo's graphs),
offloading's swap pass and trade, and Checkmate's MILP (HiGHS is deterministic, but its
time limit is not: the MILP runs only for byte budgets nothing else meets, on graphs of at most
:data:`remat.solvers.portfolio.MILP_MAX_NODES` nodes, under the eager compiler).
"""

from __future__ import annotations

import os
import time

SCALE_ENV = "REMAT_SAFETY_SCALE"
DEFAULT_SCALE = 60.0


def _scale() -> float:
    """``$REMAT_SAFETY_SCALE`` where it is a positive number of seconds, else :data:`DEFAULT_SCALE`."""
    raw = os.environ.get(SCALE_ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_SCALE
    except ValueError:
        value = DEFAULT_SCALE
    return value if value > 0 else DEFAULT_SCALE


SCALE = _scale()
"""The seconds the stages' shares are fractions of: the default time limit
(:data:`remat.solvers.registry.DEFAULT_TIME_LIMIT`), or ``$REMAT_SAFETY_SCALE`` where that is a
positive number of seconds (the test suite sets a large one, so that its plans are decided by
work alone, however loaded the machine: a share of it only stops a search that runs away).
Read when a share is taken."""


class Deadline:
    """``limit`` seconds from now (None: no limit).

    >>> d = Deadline(None)
    >>> d.left(), d.expired()
    (None, False)
    >>> Deadline(0).expired(), Deadline(0).left()
    (True, 0.0)
    >>> Deadline(None).share(0.1).limit == 0.1 * SCALE, Deadline(2).share(0.1).limit <= 2
    (True, True)
    """

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        """Seconds left (never negative), or None without a limit."""
        return None if self.limit is None else max(0.0, self.limit - self.elapsed())

    def expired(self) -> bool:
        return self.limit is not None and self.elapsed() >= self.limit

    def share(self, fraction: float) -> "Deadline":
        """A deadline from now: ``fraction`` of :data:`SCALE` seconds, at most what is left of
        this one."""
        part = fraction * SCALE
        left = self.left()
        return Deadline(part if left is None else min(left, part))


class Work:
    """A count of work (simulated statements, say) with a limit: the deterministic stop of a
    stage, where :class:`Deadline` is the safety stop (None: no limit).

    >>> w = Work(10)
    >>> w.spend(4), w.left(), w.exhausted(), w.affords(7)
    (4, 6, False, False)
    >>> w.spend(6), w.exhausted(), Work(None).exhausted()
    (10, True, False)
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.done = 0
        self.stops: dict[str, str] = {}  # stage -> what stopped it ("work", "time")

    def spend(self, amount: int) -> int:
        self.done += int(amount)
        return self.done

    def left(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.done)

    def exhausted(self) -> bool:
        return self.limit is not None and self.done >= self.limit

    def affords(self, amount: int) -> bool:
        """Whether ``amount`` more fits within the limit."""
        return self.limit is None or self.done + amount <= self.limit
