"""Progress of long planning, told to whoever listens (no torch, no terminal code here).

Solvers call :func:`report` with a short message at each stage; nothing is printed unless a
listener is installed with :func:`listening` (the command line and ``verbose=True`` install
one that draws a rich status line). Listeners are per thread and nest.

>>> heard = []
>>> with listening(heard.append):
...     report("graph g: the frontier")
>>> heard
['graph g: the frontier']
>>> report("nobody hears this")
"""

from __future__ import annotations

import contextlib
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
