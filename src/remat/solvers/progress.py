"""Progress of long planning, told to whoever listens (no torch).

Solvers call :func:`report` with a short message at each stage; nothing is printed unless a
listener is installed with :func:`listening`. :func:`shown` installs one that draws a rich
status line on a terminal (``remat plan`` and ``remat.compile(..., verbose=True)`` use it);
:func:`delayed` one that stays silent for :data:`DELAY` seconds and then shows the stages the
same way (what ``remat.compile`` does by default: a plan made in under two seconds prints
nothing, a longer one says what it is doing). Listeners are per thread and nest.

>>> heard = []
>>> with listening(heard.append):
...     report("graph g: the frontier")
>>> heard
['graph g: the frontier']
>>> report("nobody hears this")
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

_local = threading.local()

DELAY = 2.0
"""Seconds :func:`delayed` stays silent: planning that takes longer shows its stages."""


def report(message: str) -> None:
    """Tell the innermost listener of this thread, if any, about ``message``."""
    listeners = getattr(_local, "listeners", None)
    if listeners:
        listeners[-1](message)


@contextlib.contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Within the block, :func:`report` calls ``listener(message)``."""
    stack = getattr(_local, "listeners", None)
    if stack is None:
        stack = _local.listeners = []
    stack.append(listener)
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def shown(title: str, *, plain: bool = True) -> Iterator[None]:
    """Within the block, each reported stage updates a rich status line on stderr when stderr
    is a terminal; otherwise one plain line per stage (``plain``), or nothing."""
    if not sys.stderr.isatty():
        if not plain:
            yield
            return
        with listening(lambda msg: print(f"{title}: {msg}", file=sys.stderr, flush=True)):
            yield
        return
    from rich.console import Console

    with Console(stderr=True).status(title) as status:
        with listening(lambda msg: status.update(f"{title}: {msg}")):
            yield


@contextlib.contextmanager
def delayed(title: str, *, delay: float | None = None, clock: Callable[[], float] = time.monotonic,
            timer: bool = True) -> Iterator[None]:
    """Within the block, like :func:`shown`, but silent for the first ``delay`` seconds
    (default :data:`DELAY`, read at the call) by ``clock``: then the stage reported last is shown, and every stage after it. ``timer``:
    also show it when ``delay`` passes between two reports (a thread waits for it); without,
    only a report after ``delay`` shows anything (tests drive ``clock`` by hand).

    >>> import io, contextlib
    >>> now = [0.0]
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err), delayed("plan", clock=lambda: now[0], timer=False):
    ...     report("quick stage")
    ...     now[0] = 2.5
    ...     report("slow stage")
    >>> err.getvalue()
    'plan: slow stage\\n'
    """
    delay = DELAY if delay is None else float(delay)
    start = clock()
    lock = threading.Lock()
    state = {"last": None, "show": None, "done": False}
    stack = contextlib.ExitStack()

    def start_showing() -> None:  # under the lock
        if state["show"] is None and not state["done"]:
            state["show"] = _shower(title, stack)
            if state["last"] is not None:
                state["show"](state["last"])

    def listener(message: str) -> None:
        with lock:
            state["last"] = message
            if state["show"] is not None:
                state["show"](message)
            elif clock() - start >= delay:
                start_showing()

    def wake() -> None:
        with lock:
            start_showing()

    t = threading.Timer(delay, wake) if timer else None
    if t is not None:
        t.daemon = True
        t.start()
    try:
        with listening(listener):
            yield
    finally:
        if t is not None:
            t.cancel()
        with lock:
            state["done"] = True
            stack.close()


def _shower(title: str, stack: contextlib.ExitStack) -> Callable[[str], None]:
    """What shows one stage: a rich status line (entered on ``stack``) on a terminal, else a
    plain line on stderr."""
    if sys.stderr.isatty():
        from rich.console import Console

        status = stack.enter_context(Console(stderr=True).status(title))
        return lambda msg: status.update(f"{title}: {msg}")
    return lambda msg: print(f"{title}: {msg}", file=sys.stderr, flush=True)
