"""A solver's time limit, counted from when the solver started."""

from __future__ import annotations

import time


class Deadline:
    """``limit`` seconds from now (None: no limit).

    >>> d = Deadline(None)
    >>> d.left(), d.expired()
    (None, False)
    >>> Deadline(0).expired(), Deadline(0).left()
    (True, 0.0)
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
