"""The short GPU check's driver (issue 28): preflight, an offload micro-test and GPT-2 variants,
one process per variant; see :mod:`remat.bench.gpu_check` for the stages and the row fields.

    python benchmarks/gpu_check.py OUT            # on a GPU, about 10 minutes
    python benchmarks/gpu_check.py OUT --cpu      # the same stages on a CPU (ao ops on stand-ins)

Every argument but the harness's goes to ``remat.bench.gpu_check`` (``python -m
remat.bench.gpu_check --help`` lists them). ``benchmarks/gpu_check.sh OUT [--cpu]`` runs this
after making sure remat imports. Writes ``OUT/preflight.json``, ``OUT/rows.jsonl`` (one JSON row
per variant), ``OUT/rows/`` (each variant's row and log), prints a table, and copies the rows
(and the preflight, in meta) to ``benchmarks/results/gpu_check.json``
(``benchmarks/results/gpu_check_cpu.json`` with ``--cpu``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("PYTHONUNBUFFERED", "1")

from remat.bench import gpu_check, harness  # noqa: E402


def run(args):
    rest = list(args.rest)
    if args.threads is not None:
        rest += ["--threads", str(args.threads)]
    check = gpu_check.parse_args(rest)
    rc = gpu_check.main(rest)
    if rc:
        return rc
    out = Path(check.out)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if line.strip()]
    meta = {"out": str(out)}
    if (out / "preflight.json").exists():
        meta["preflight"] = json.loads((out / "preflight.json").read_text())
    if check.cpu:
        args.results_stem = "gpu_check_cpu"
    return harness.Result(rows, meta, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, None, argv, doc=__doc__, passthrough=True)


if __name__ == "__main__":
    sys.exit(main())
