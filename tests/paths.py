"""Where the reference data lives: the graphs shipped in the package (remat.data), so a plain
clone's tests need nothing beside the repository."""

from remat.data import CHECKMATE_DIR  # noqa: F401
