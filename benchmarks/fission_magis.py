"""Where remat's search splits MAGIS's six workloads and what it gains (issue 31).

    python benchmarks/fission_magis.py [--workloads resnet50,bert,...] [--repeats 5]

Writes benchmarks/results/fission_magis.json; see :mod:`remat.bench.fission_workloads`."""

import argparse
import json
import pathlib

import torch
from rich.console import Console

from remat.bench.fission_workloads import WORKLOADS, run_workload, table, to_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "fission_magis.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    console = Console(width=200)
    for name in args.workloads.split(","):
        console.print(f"[bold]{name}[/bold] ...")
        rows += run_workload(name, args.repeats)
        console.print(table(rows[-2:]))
    console.print(table(rows))
    pathlib.Path(args.out).write_text(json.dumps(to_json(rows), indent=1))


if __name__ == "__main__":
    main()
