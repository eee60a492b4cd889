"""The host <-> device link: what an ``offload`` or a ``reload`` costs (seeds/004 Section 6.2).

A copy of ``b`` bytes takes ``latency + b / bandwidth`` on the link. Where the device has a
copy engine (a GPU) it runs on a copy stream beside compute (``asynchronous``), and costs time
only when compute waits for it (:mod:`remat.plans.simulator`); on a CPU the copy is a memcpy
on the one stream, and its whole time is added.

:func:`link_for_graph` picks the link of the device a graph was captured on:

- **a CUDA GPU**: pinned host memory over PCIe, asynchronous. The H100 measured 54-55 GB/s each
  way with pinned buffers (``benchmarks/link_bandwidth.py``, BENCHMARKS.md); other GPUs get
  :data:`DEFAULT_GPU_LINK` (PCIe 4.0 x16 as measured in practice, half PCIe 5.0's).
- **a CPU** (remat's CPU lowering copies into a separate host buffer): a copy at the memory
  bandwidth of the device profile, on the compute stream.
- **a graph without a device** (Checkmate's graphs, synthetic ones), whose costs are in an
  unknown unit: an asynchronous link that moves :data:`DEFAULT_LINK_SHARE` of the forward's
  activation bytes in the forward's compute time. That is the ratio of a V100 over PCIe 3.0
  (12 GB/s) training VGG-16 at batch 256, Checkmate's setting: about 15 GB of activations
  in a forward of about 0.4 s, so 4.8 GB moved, a third; a quarter is taken. A transformer on
  an H100 moves far less of its activations in its forward (about a twentieth for GPT-2 small
  at 8 x 1024 in bf16), so this default is kind to swapping; ``share=`` changes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph.graph import Graph
from .model import CostModel, default_cost_model, profile_for_graph

H100_LINK = 54e9
"""Bytes/s an H100's pinned host copies reached each way (benchmarks/link_bandwidth.py)."""

DEFAULT_GPU_LINK = 25e9
"""Bytes/s of pinned host copies on a GPU remat has not measured (PCIe 4.0 x16 in practice)."""

DEFAULT_LINK_SHARE = 0.25
"""For a graph without a device: the share of the forward's activation bytes the link moves
in the forward's compute time (see the module docstring)."""

COPY_LATENCY = 10e-6
"""Seconds a copy costs before its first byte moves (a launch and an event), on a device."""


@dataclass(frozen=True)
class Link:
    """``bandwidth``: bytes per unit of the graph's time (seconds, or its profiled cost unit);
    ``asynchronous``: copies run on a stream of their own; ``latency``: per copy, same unit;
    ``source``: how the numbers were chosen."""

    bandwidth: float
    asynchronous: bool = True
    latency: float = 0.0
    source: str = ""

    def seconds(self, nbytes: int) -> float:
        """Time of one copy of ``nbytes``."""
        return self.latency + nbytes / self.bandwidth


def link_for_graph(g: Graph, cost_model: CostModel | None = None, *, bandwidth: float | None = None,
                   share: float = DEFAULT_LINK_SHARE) -> Link:
    """The link a graph's copies go over (see the module docstring). ``bandwidth``: bytes/s,
    overriding the device's (on a graph without a device: bytes per cost unit)."""
    device = (g.meta or {}).get("device") or {}
    kind = device.get("type")
    if kind == "cuda":
        name = str(device.get("name", "")).upper()
        bw = bandwidth or (H100_LINK if "H100" in name or "H200" in name else DEFAULT_GPU_LINK)
        return Link(bw, True, COPY_LATENCY, "measured on an H100" if bandwidth is None and bw == H100_LINK
                    else "given" if bandwidth else "PCIe 4.0 default")
    if kind == "cpu":
        bw = bandwidth or profile_for_graph(g).bandwidth / 2  # a copy reads and writes
        return Link(bw, False, 0.0, "a memcpy on the CPU")
    if bandwidth:
        return Link(bandwidth, True, 0.0, "given")
    cm = cost_model or default_cost_model(g)
    a = g._arrays
    costs = cm.op_costs(g)
    fwd = (a.forward & ~a.primal).tolist()
    seconds = sum(c for c, f in zip(costs, fwd) if f)
    moved = sum(int(b) for b, f in zip(a.bytes.tolist(), fwd) if f)
    if seconds <= 0 or moved <= 0:
        return Link(float("inf"), True, 0.0, "no forward to scale by")
    return Link(share * moved / seconds, True, 0.0, f"moves {share:g} of the forward's activations in its time")
