"""Progress of long planning, told to whoever listens (no torch).

Solvers call :func:`report` with a short message at each stage; nothing is printed unless a
listener is installed with :func:`listening`. :func:`shown` installs one that draws a rich
status line on a terminal (``remat plan`` and ``remat.compile(..., verbose=True)`` use it).
Listeners are per thread and nest.

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
from typing import Callable, Iterator

_local = threading.local()


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
