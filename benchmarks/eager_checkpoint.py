"""Eager checkpointing side by side (issue 32): no checkpointing, full checkpointing, torchtitan-style
op SAC, offload-everything and remat.checkpoint at 0.8, 0.6, 0.4, 0.2 and min, on a transformers
Llama, BERT (dropout) and a CNN, eager, on this machine.

    python benchmarks/eager_checkpoint.py --quick          # about 2-4 minutes on 2 CPUs
    python benchmarks/eager_checkpoint.py [--models llama,bert,cnn] [--budgets 0.8,0.6,0.4,0.2]
        [--size quick|default] [--repeats 10] [--threads N]

Prints the table and the issue's targets, and writes ``benchmarks/results/eager_checkpoint.json``
(``--results``). See :mod:`remat.bench.eager` for the rows, the columns and the targets.
"""

from __future__ import annotations

import os
import sys

os.environ["REMAT_CACHE_DIR"] = "off"  # every run plans

from remat.bench import eager, harness  # noqa: E402


def main(argv=None) -> int:
    return harness.main(__file__, eager.run, eager.arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
