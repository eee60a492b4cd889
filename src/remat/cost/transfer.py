"""The host <-> device link: what an ``offload`` or a ``reload`` costs (seeds/004 Section 6.2).

A copy of ``b`` bytes takes ``latency + b / bandwidth`` on the link. Where the device has a
copy engine (a GPU) it runs on a copy stream beside compute (``asynchronous``), and costs time
only when compute waits for it (:mod:`remat.plans.simulator`); on a CPU the copy is a memcpy
on the one stream, and its whole time is added.

:func:`link_for_graph` picks the link of the device a graph was captured on:

- **a CUDA GPU**: pinned host memory over PCIe, asynchronous. In this order: the ``bandwidth=``
  given; the link measured on the device, which the torch side writes into
  ``g.meta["device"]["link"]`` before planning (:func:`remat.capture.link.link_for_device`:
  ``{"bandwidth": bytes/s, "latency": seconds, "device": <name>, ...}``), source ``"measured
  on <name>"``; else an assumed figure: :data:`H100_LINK` on an H100 (measured there,
  ``benchmarks/link_bandwidth.py``, BENCHMARKS.md), :data:`DEFAULT_GPU_LINK` on any other GPU
  (an H200 too: its link was never measured here). A copy's latency is the measured one where
  there is one, else :data:`COPY_LATENCY`.
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

import math
from dataclasses import dataclass

from ..graph.graph import Graph
from .model import CostModel, default_cost_model, profile_for_graph

H100_LINK = 54e9
"""Bytes/s an H100's pinned host copies reached each way (benchmarks/link_bandwidth.py): assumed
for an H100 whose link was not measured."""

DEFAULT_GPU_LINK = 25e9
"""Bytes/s of pinned host copies assumed on any other GPU whose link was not measured (PCIe 4.0
x16 in practice)."""

DEFAULT_LINK_SHARE = 0.25
"""For a graph without a device: the share of the forward's activation bytes the link moves
in the forward's compute time (see the module docstring)."""

COPY_LATENCY = 10e-6
"""Seconds a copy costs before its first byte moves (a launch and an event), on a device whose
latency was not measured."""


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


def _positive(x, *, zero: bool = False) -> float | None:
    """``x`` as a float when it is a finite number above 0 (or equal to 0 with ``zero``)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x) if x > 0 or (zero and x == 0) else None


def link_for_graph(g: Graph, cost_model: CostModel | None = None, *, bandwidth: float | None = None,
                   share: float = DEFAULT_LINK_SHARE) -> Link:
    """The link a graph's copies go over (see the module docstring). ``bandwidth``: bytes/s,
    overriding the device's (on a graph without a device: bytes per cost unit).

    >>> from remat.graph.examples import cos_cos_graph
    >>> g = cos_cos_graph()
    >>> g.meta["device"] = {"type": "cuda", "name": "NVIDIA H200"}
    >>> link_for_graph(g).source
    'assumed: PCIe 4.0 x16 (not measured on NVIDIA H200)'
    >>> g.meta["device"]["link"] = {"bandwidth": 55e9, "latency": 8e-6, "device": "NVIDIA H200"}
    >>> link_for_graph(g)
    Link(bandwidth=55000000000.0, asynchronous=True, latency=8e-06, source='measured on NVIDIA H200')
    """
    device = (g.meta or {}).get("device") or {}
    kind = device.get("type")
    if kind == "cuda":
        measured = device.get("link") if isinstance(device.get("link"), dict) else {}
        bw, latency = _positive(measured.get("bandwidth")), _positive(measured.get("latency"), zero=True)
        latency = COPY_LATENCY if latency is None else latency
        name = str(device.get("name") or "")
        if bandwidth:
            return Link(bandwidth, True, latency, "given")
        if bw is not None:
            given = measured.get("source") == "given"  # remat.compile(bandwidth=...)
            return Link(bw, True, latency, "given" if given else
                        f"measured on {measured.get('device') or name or 'the GPU'}")
        if "H100" in name.upper():
            return Link(H100_LINK, True, latency, "assumed: an H100's link as measured on one")
        return Link(DEFAULT_GPU_LINK, True, latency,
                    f"assumed: PCIe 4.0 x16 (not measured on {name or 'this GPU'})")
    if kind == "cpu":
        given = device.get("link") if isinstance(device.get("link"), dict) else {}
        bw = bandwidth or _positive(given.get("bandwidth"))  # remat.compile(bandwidth=...)
        if bw:
            return Link(bw, False, 0.0, "given (a memcpy on the CPU)")
        return Link(profile_for_graph(g).bandwidth / 2, False, 0.0, "a memcpy on the CPU")  # a copy reads and writes
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


def offload_allowed(g: Graph) -> tuple[bool, str]:
    """Whether plans of ``g`` may offload, and why (``g.meta["offload"]``, written by the
    partitioner from the ``offload`` option and what the copies of this torch and device
    support: :func:`remat.lower.offload.offload_support`). Graphs without that mark (saved
    graphs, Checkmate's) may."""
    mark = (g.meta or {}).get("offload")
    if not isinstance(mark, dict):
        return True, ""
    return bool(mark.get("allowed", True)), str(mark.get("reason", ""))
