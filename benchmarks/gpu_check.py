"""The short GPU check's driver (issue 28): preflight, an offload micro-test and GPT-2 variants,
one process per variant; see :mod:`remat.bench.gpu_check` for the stages and the row fields.

    python benchmarks/gpu_check.py OUT            # on a GPU, about 10 minutes
    python benchmarks/gpu_check.py OUT --cpu      # the same stages on a CPU (ao ops on stand-ins)

``benchmarks/gpu_check.sh OUT [--cpu]`` runs this after making sure remat imports. Writes
``OUT/preflight.json``, ``OUT/rows.jsonl`` (one JSON row per variant), ``OUT/rows/`` (each
variant's row and log) and prints a table.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYTHONUNBUFFERED", "1")

from remat.bench.gpu_check import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
