"""First-call time of an LM whose head dominates: plain torch.compile against remat with the head
split in n token parts, the parts unrolled (n copies of their ops) or as one subgraph called n
times (``remat.bench.fission_compile``; one fresh interpreter per row, caches off, inductor).

Columns: the first call (wall and CPU seconds, the C++ compiles included: one compile thread),
the seconds inside inductor (``compile_fx_inner``, forward and backward; wall and CPU), remat's
partitioner, a steady step, the peak above the step's start and the
simulator's prediction, the largest gradient difference from eager autograd, the op counts of
the forward and backward as inductor lowers them (a subgraph's once) and the subgraph calls.

    python benchmarks/fission_compile.py [--parts 4,8] [--vocab 16000] [--seq 1024] [--layers 2]
        [--hidden 256] [--methods torch.compile,unrolled,loop] [--threads 1] [--compile-threads 1]
        [--timeout 1800]

Writes ``benchmarks/results/fission_compile.json``.
"""

from __future__ import annotations

import sys

from remat.bench import fission_compile as FC
from remat.bench import harness


def arguments(ap) -> None:
    ap.add_argument("--parts", default="4,8", help="numbers of parts, comma-separated")
    ap.add_argument("--methods", default=",".join(FC.METHODS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=16000)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per row")
    ap.add_argument("--compile-threads", type=int, default=1, help="inductor's compile_threads (0: its default)")
    ap.set_defaults(threads=1)


def run(args):
    config = {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab, "seq": args.seq, "batch": args.batch}
    rows = []
    for method in args.methods.split(","):
        for n in [int(x) for x in args.parts.split(",")] if method != "torch.compile" else [0]:
            row = FC.in_subprocess(method, n, config, threads=args.threads, timeout=args.timeout,
                                   compile_threads=args.compile_threads)
            rows.append(row)
            print(f"  {method:>13} {n or '':>2}: {row['status'][:60]} first {row.get('first_s', '-')} s, "
                  f"inductor {row.get('inductor_s', '-')} s", file=sys.stderr, flush=True)
    print(f"\nLlama {config}, inductor ({args.compile_threads or 'default'} compile threads), CPU, "
          f"{args.threads} thread(s)\n")
    print(FC.table(rows))
    return harness.Result(rows, {"config": config}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
