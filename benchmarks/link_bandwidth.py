"""The host <-> device link of a CUDA GPU: copy bandwidth (pinned and pageable host memory, each
direction) and how much a copy on a side stream slows a matmul running beside it.

What an offloading plan pays for moving activations to host memory and back (seeds/004's swap):
``remat.cost`` prices a copy as bytes over this bandwidth. Prints one Markdown table.

    PYTHONPATH=src python benchmarks/link_bandwidth.py [--mib 256] [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics

import torch


def _time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` timed with CUDA events, after one warm-up."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("link_bandwidth.py needs a CUDA GPU")
    n = args.mib << 20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    rows = []
    for pinned in (True, False):
        host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned).fill_(1)
        h2d = _time(lambda: dev.copy_(host, non_blocking=pinned), args.repeats)
        d2h = _time(lambda: host.copy_(dev, non_blocking=pinned), args.repeats)
        rows.append((f"{'pinned' if pinned else 'pageable'} host", n / h2d / 1e9, n / d2h / 1e9))
    # overlap: a bf16 matmul alone, then with a pinned device->host copy on a side stream
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()

    def matmuls():
        for _ in range(4):
            a @ a

    def both():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)
        matmuls()
        torch.cuda.current_stream().wait_stream(side)

    alone, together = _time(matmuls, args.repeats), _time(both, args.repeats)
    copy_alone = _time(lambda: host.copy_(dev, non_blocking=True), args.repeats)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.mib} MiB per copy\n")
    print("| host memory | host -> device GB/s | device -> host GB/s |\n|---|---|---|")
    for name, up, down in rows:
        print(f"| {name} | {up:.1f} | {down:.1f} |")
    print(f"\n4 bf16 8192^3 matmuls: {alone * 1e3:.2f} ms alone, {together * 1e3:.2f} ms with a "
          f"{args.mib} MiB pinned device->host copy on a side stream ({copy_alone * 1e3:.2f} ms alone): "
          f"overlap hides {max(0.0, alone + copy_alone - together) / copy_alone:.0%} of the copy")


if __name__ == "__main__":
    main()
