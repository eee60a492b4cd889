"""Where remat's search splits MAGIS's six workloads and what it gains (issue 31).

    python benchmarks/fission_magis.py [--workloads resnet50,bert,...] [--repeats 5]

Writes benchmarks/results/fission_magis.json; see :mod:`remat.bench.fission_workloads`."""

import sys

from rich.console import Console

from remat.bench import harness
from remat.bench.fission_workloads import WORKLOADS, run_workload, table, to_json


def arguments(ap) -> None:
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.set_defaults(threads=1)


def run(args) -> harness.Result:
    rows = []
    console = Console(width=200)
    for name in args.workloads.split(","):
        console.print(f"[bold]{name}[/bold] ...")
        rows += run_workload(name, args.repeats)
        console.print(table(rows[-2:]))
    console.print(table(rows))
    return harness.Result(to_json(rows), {"workloads": args.workloads}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
