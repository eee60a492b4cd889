"""Where the shared reference data lives: ../shared beside the repository (as in CI), or
$REMAT_SHARED_DIR."""

import os
from pathlib import Path

SHARED = Path(os.environ.get("REMAT_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
CHECKMATE_DIR = SHARED / "data" / "checkmate_graphs"
