"""Transient memory of CPU convolutions, measured against the cost model's workspace.

A CPU convolution (oneDNN) allocates buffers beyond its inputs and outputs while it runs:
layout reorders of its operands. The simulator and the Checkmate MILP add
:meth:`remat.cost.model.CostModel.workspace` at the moment each op runs: on the ``cpu``
profile one buffer of the output's size for a forward convolution, and buffers of
grad_output's and the input's sizes for its backward (plus the outputs of a multi-output op,
which it allocates while running); either term is replaced by the weight's size when that is
larger (small spatial sizes). This script measures the transient (peak during the call
less the bytes it leaves allocated) with the profiler's allocation records over a few
shapes, beside the model's figure, and prints the ratio measured / model.

    python benchmarks/conv_workspace.py [--threads 2]
"""

from __future__ import annotations


import sys
import torch
from torch.profiler import ProfilerActivity, profile

from remat.capture.workspace import quiet_stderr as _quiet_stderr
from remat.bench import harness

SHAPES = [  # batch, in channels, out channels, spatial, kernel, stride, output mask
    (16, 8, 8, 32, 3, 1, (True, True, True)),
    (4, 32, 64, 16, 3, 1, (True, True, True)),
    (4, 64, 64, 16, 1, 1, (True, True, True)),
    (8, 64, 128, 32, 3, 2, (True, True, True)),
    (8, 64, 128, 32, 3, 2, (False, True, True)),
    (2, 3, 64, 56, 7, 2, (False, True, True)),
    (8, 128, 128, 14, 3, 1, (True, False, False)),
    (8, 32, 32, 16, 3, 1, (True, True, False)),
    (2, 128, 256, 4, 3, 1, (True, True, True)),
    (2, 64, 64, 8, 3, 1, (True, True, True)),
    (2, 256, 256, 2, 3, 1, (False, True, False)),
]


def transient(fn) -> int:
    """Peak bytes allocated during ``fn()`` above the bytes it leaves allocated."""
    fn()
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()  # kept: its outputs stay allocated, so they are not counted as transient
    del out
    events = sorted((e.start_ns(), int(e.nbytes())) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    total = peak = 0
    for _, b in events:
        total += b
        peak = max(peak, total)
    return peak - total


def arguments(ap) -> None:
    pass


def run(args):
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| shape (N, Cin, Cout, HxW, k, stride) | mask | fw measured / output | "
          "bw measured / (grad_out + input) |")
    print("| --- | --- | ---: | ---: |")
    rows = []
    for n, ci, co, hw, k, s, mask in SHAPES:
        x = torch.randn(n, ci, hw, hw)
        w = torch.randn(co, ci, k, k)
        p = k // 2
        y = torch.nn.functional.conv2d(x, w, stride=s, padding=p)
        go = torch.randn_like(y)
        fw = transient(lambda: torch.ops.aten.convolution(x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1))
        bw = transient(lambda: torch.ops.aten.convolution_backward(
            go, x, w, [co], [s, s], [p, p], [1, 1], False, [0, 0], 1, list(mask)))
        model_fw = max(y.numel(), w.numel()) * 4  # remat.cost.model's cpu profile
        model_bw = max(go.numel() + x.numel(), w.numel()) * 4
        print(f"| {n}, {ci}, {co}, {hw}x{hw}, {k}, {s} | {''.join('1' if m else '0' for m in mask)} "
              f"| {fw / model_fw:.2f} | {bw / model_bw:.2f} |")
        rows.append({"n": n, "cin": ci, "cout": co, "hw": hw, "k": k, "stride": s,
                     "mask": "".join("1" if m else "0" for m in mask), "fw_bytes": fw, "model_fw_bytes": model_fw,
                     "fw_ratio": fw / model_fw, "bw_bytes": bw, "model_bw_bytes": model_bw, "bw_ratio": bw / model_bw})
    return harness.Result(rows, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
