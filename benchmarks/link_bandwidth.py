"""The host <-> device link of a CUDA GPU, as remat measures it for planning.

What an offloading plan pays for moving activations to host memory and back (seeds/004's swap):
``remat.cost`` prices a copy as its latency plus bytes over this bandwidth. This is
:func:`remat.capture.link.measure_link` (pinned host memory, each direction, CUDA events,
median of repeats), measured afresh and not cached; planning uses
:func:`remat.capture.link.link_for_device`, the same measurement kept once per device. Prints
one Markdown table; without a GPU it says so and exits 0.

    python benchmarks/link_bandwidth.py [--mib 16,64,256] [--repeats 5]
"""

from __future__ import annotations

import sys

from remat.bench import harness


def arguments(ap) -> None:
    ap.add_argument("--mib", default="16,64", help="copy sizes in MiB, comma-separated (default 16,64)")
    ap.add_argument("--repeats", type=int, default=5, help="timed copies per size and direction")


def run(args):
    import torch

    from remat.capture.link import measure_link

    if not torch.cuda.is_available():
        print("link_bandwidth.py: no CUDA GPU here, nothing to measure (a CPU has no host link).")
        return 0
    sizes = tuple(int(m) << 20 for m in args.mib.split(","))
    link = measure_link("cuda", sizes=sizes, repeats=args.repeats)
    print(f"{link['device']}, torch {link['torch']}, pinned host memory, best of {args.mib} MiB copies, "
          f"median of {args.repeats}\n")
    print("| host -> device GB/s | device -> host GB/s | bandwidth (slower) GB/s | latency us |")
    print("|---|---|---|---|")
    print(f"| {link['h2d'] / 1e9:.1f} | {link['d2h'] / 1e9:.1f} | {link['bandwidth'] / 1e9:.1f} | "
          f"{link['latency'] * 1e6:.1f} |")
    return harness.Result([dict(link)], {"mib": args.mib, "repeats": args.repeats}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
