"""The ``remat`` command line (``remat --help``)."""

from .main import main

__all__ = ["main"]
