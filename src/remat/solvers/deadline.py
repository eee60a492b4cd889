"""A solver's time limit, counted from when the solver started, and the shares of it that its
stages take.

A stage that may search long (the staged baselines, the peak descent, MAGIS's search) gets a
*share*: a fraction of the call's *scale*, at most what is left. The scale is the call's time
limit, at most :data:`SCALE` (the default time limit), and :data:`SCALE` without one: under
the default limit, or a longer one, or none, each stage gets the seconds it always had (a
tenth of 60 s: 6 s), and a caller who asks for 2 s gets shares of 2 s.
"""

from __future__ import annotations

import time

SCALE = 60.0
"""Seconds the stages' shares are fractions of, at most: the default time limit
(:data:`remat.solvers.registry.DEFAULT_TIME_LIMIT`). A call with a shorter limit scales its
shares down with it."""


def scale_of(limit: float | None) -> float:
    """The seconds a call with time limit ``limit`` takes its shares of (see the module docstring).

    >>> scale_of(None), scale_of(600), scale_of(2)
    (60.0, 60.0, 2.0)
    """
    return SCALE if limit is None else min(float(limit), SCALE)


class Deadline:
    """``limit`` seconds from now (None: no limit). ``scale``: the seconds its shares are
    fractions of (:meth:`share`); by default :func:`scale_of` ``limit``, and a part of a
    longer call passes that call's.

    >>> d = Deadline(None)
    >>> d.left(), d.expired()
    (None, False)
    >>> Deadline(0).expired(), Deadline(0).left()
    (True, 0.0)
    >>> Deadline(None).share(0.1).limit, Deadline(2).share(0.1).limit <= 0.2
    (6.0, True)
    """

    def __init__(self, limit: float | None, *, scale: float | None = None) -> None:
        self.limit = limit
        self.scale = scale_of(limit) if scale is None else scale
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        """Seconds left (never negative), or None without a limit."""
        return None if self.limit is None else max(0.0, self.limit - self.elapsed())

    def expired(self) -> bool:
        return self.limit is not None and self.elapsed() >= self.limit

    def share(self, fraction: float) -> "Deadline":
        """A deadline from now of ``fraction`` of the scale, at most what is left of this one,
        with the same scale."""
        part = fraction * self.scale
        left = self.left()
        return Deadline(part if left is None else min(left, part), scale=self.scale)
