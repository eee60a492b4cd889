"""The cost model: what each op costs to compute and to move through memory.

Two views of one step, both used by the simulator:

- **additive** (Checkmate, seeds/001 Section 4.10): every op has a cost ``C_i`` and a schedule
  costs the sum over its compute statements. ``C_i`` is the node's profiled ``cost`` when it
  has one (Checkmate's graphs do), else a roofline time on a :class:`DeviceProfile`:
  ``max(flops / peak_flops, (output + input bytes) / bandwidth)`` (each op its own kernel).
- **fusion-aware traffic** (seeds/000 Section 3.2): fusible ops (pointwise, reduction, view)
  fuse with their neighbours, so only *materialized* values cost memory traffic: written
  once when computed and read once by each kernel that reads them. A value is materialized
  when it is a primal, an output, not fusible, read by a non-fusible op, or carried from the
  forward into the backward. The predicted time is ``sum(flops) / peak_flops + traffic / bandwidth``, or the
  additive cost when the graph carries profiled costs.

The device numbers are settings: :func:`remat.cost.calibrate.cpu_profile` measures this machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.graph import CATEGORIES, Graph

_REDUCTION = CATEGORIES.index("reduction")


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float  # FLOP/s reachable by large matmuls in the training dtype
    bandwidth: float  # bytes/s of main memory
    launch_seconds: float = 0.0  # fixed cost per kernel
    conv_workspace: float = 0.0  # transient bytes of a convolution, as a multiple of its output


PROFILES = {
    # datasheet numbers: dense TF32 tensor-core throughput and HBM bandwidth
    "a100": DeviceProfile("a100", 156e12, 1.555e12, 4e-6),
    "h100": DeviceProfile("h100", 378e12, 3.35e12, 4e-6),
    "v100": DeviceProfile("v100", 15.7e12, 0.9e12, 4e-6),
    # a 2-core x86 machine: ~50 GFLOP/s fp32 matmul, ~8 GB/s copy (remat.cost.calibrate measures yours)
    # (measured here with benchmarks/conv_workspace.py: a CPU convolution allocates one more
    # buffer of its output's size while it runs, its backward buffers of grad_output's and
    # the input's sizes; either a weight-sized one when the weight is larger)
    "cpu": DeviceProfile("cpu", 50e9, 8e9, 2e-6, conv_workspace=1.0),
}

GPU_PROFILES = {
    # (GPU name contains, training dtype) -> profile: datasheet dense matmul rates (bf16/fp16 on
    # tensor cores; float32 without TF32, PyTorch's default) and HBM bandwidth, taken down to
    # what large kernels reach (about 80% of the matmul rate, 90% of the bandwidth: an H100
    # measured 798 TFLOP/s bf16 and 3.0 TB/s here, an H200 788 TFLOP/s and 4.3 TB/s)
    ("H100", "half"): DeviceProfile("h100-bf16", 790e12, 3.0e12, 5e-6),
    ("H100", "float"): DeviceProfile("h100-fp32", 50e12, 3.0e12, 5e-6),
    ("H200", "half"): DeviceProfile("h200-bf16", 790e12, 4.3e12, 5e-6),
    ("H200", "float"): DeviceProfile("h200-fp32", 50e12, 4.3e12, 5e-6),
    ("A100", "half"): DeviceProfile("a100-bf16", 250e12, 1.6e12, 5e-6),
    ("A100", "float"): DeviceProfile("a100-fp32", 16e12, 1.6e12, 5e-6),
}
"""The profiles of known GPUs; another GPU gets the A100's (a conservative middle)."""


def profile_for_graph(g: Graph) -> DeviceProfile:
    """The device profile of the device a captured graph runs on (``g.meta["device"]``,
    recorded by capture: ``{"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "dtype":
    "bfloat16"}``); the CPU profile for graphs without one (Checkmate's, synthetic ones).

    >>> from remat.graph.examples import cos_cos_graph
    >>> profile_for_graph(cos_cos_graph()).name
    'cpu'
    """
    device = (g.meta or {}).get("device") or {}
    if device.get("type") != "cuda":
        return PROFILES["cpu"]
    kind = "half" if device.get("dtype") in ("bfloat16", "float16") else "float"
    name = str(device.get("name", "")).upper()
    for (gpu, k), profile in GPU_PROFILES.items():
        if gpu in name and k == kind:
            return profile
    return GPU_PROFILES[("A100", kind)]


EAGER_TEMPORARIES = {
    # inductor's fma(a, b, c) runs as (a * b) + c: a product of the output's size (a softmax
    # backward's; T5 quick for 0.5 measured 232,960 bytes, 5.4%, over its prediction there)
    "fma.default": lambda g, n: int(n.bytes),
    # _unsafe_masked_index_put_accumulate(x, mask, indices, values) masks the values and clamps
    # the indices into copies before it scatters (an embedding's backward: 133,120 bytes
    # beside T5 quick's 131,072 of values and 2,048 of indices)
    "_unsafe_masked_index_put_accumulate.default": lambda g, n: sum(int(g[v].bytes) for v in n.inputs[2:]),
}
"""Transient bytes of ops that run as several ATen calls op by op (remat's eager compiler runs
inductor's decompositions without fusing them): ``op -> f(graph, node)``. Inductor computes
them in one kernel. Measured per op with the profiler's allocation records
(``benchmarks/peak_fidelity.py``)."""


@dataclass(frozen=True)
class CostModel:
    """``fused_memory``: the step runs through a fusing compiler (inductor), whose kernels keep
    a fusible value read only by fused kernels in registers: such a value takes no memory
    (:func:`memory_materialized`). Off, every computed value is allocated (op-by-op
    execution, remat's ``eager`` compiler)."""

    device: DeviceProfile = PROFILES["cpu"]
    fused_memory: bool = False

    def op_costs(self, g: Graph) -> list[float]:
        """Additive cost ``C_i`` of computing each node once (0 for primals and tangents)."""
        return g._derived(("op_costs", self.device), self._op_costs)

    def workspace(self, g: Graph) -> list[int]:
        """Transient bytes an op holds while it runs, beyond its inputs and the memory the
        accounting gives its output: a convolution's scratch, as measured at capture on the
        device (``meta["workspace"]``, :mod:`remat.capture.workspace`) or else the device
        profile's formula, and the outputs of a multi-output op (a tuple holds no storage
        of its own; its items are counted when their getitems run, but the op allocates
        them all while it runs). Op by op (without ``fused_memory``), also the temporaries of
        ops that run as several ATen calls there (:data:`EAGER_TEMPORARIES`)."""
        return g._derived(("workspace", self.device, self.fused_memory), self._workspace)

    def _workspace(self, g: Graph) -> list[int]:
        f = self.device.conv_workspace
        out = [int(n.bytes) if n.meta and n.meta.get("container") and not n.meta.get("alias_of")
               else 0 for n in g.nodes]  # a split's items are views: nothing allocated
        for i, n in enumerate(g.nodes):
            if n.meta and "workspace" in n.meta:
                out[i] += int(n.meta["workspace"])
            elif not self.fused_memory and n.op in EAGER_TEMPORARIES:
                out[i] += EAGER_TEMPORARIES[n.op](g, n)
            elif f and n.op.startswith("convolution"):
                # oneDNN reorders the operands to its blocked layouts: the activations
                # (grad_output and input in the backward), or the weight when it is larger
                # (small spatial sizes); benchmarks/conv_workspace.py measures both
                backward = n.op.startswith("convolution_backward")
                weight = g[n.inputs[-1 if backward else 1]].bytes if len(n.inputs) >= 2 else 0
                acts = sum(g[v].bytes for v in n.inputs[:2]) if backward else n.bytes
                out[i] += int(f * max(acts, weight))
        return out

    def uses_profiled_costs(self, g: Graph) -> bool:
        return any(n.cost is not None for n in g.nodes if not n.is_primal)

    def seconds(self, compute_cost: float, traffic_bytes: int, flops: float = 0.0,
                kernels: int = 0, g: Graph | None = None) -> float:
        """Predicted time of a schedule from the totals the simulator gathered."""
        if g is not None and self.uses_profiled_costs(g):
            return compute_cost
        return (flops / self.device.peak_flops + traffic_bytes / self.device.bandwidth
                + kernels * self.device.launch_seconds)

    def _op_costs(self, g: Graph) -> list[float]:
        a = g._arrays
        ins = g.input_indices
        dev = self.device
        out = []
        for i, n in enumerate(g.nodes):
            if n.is_primal or n.role == "tangent" and not n.inputs:
                out.append(0.0 if n.cost is None else float(n.cost))
            elif n.cost is not None:
                out.append(float(n.cost))
            else:
                moved = int(a.bytes[i]) + sum(int(a.bytes[j]) for j in ins[i])
                out.append(max(n.flops / dev.peak_flops, moved / dev.bandwidth) + dev.launch_seconds)
        return out


def materialized(g: Graph) -> np.ndarray:
    """Values written to memory whatever the schedule: primals, outputs, values that are not
    fusible or are read by a library call (a non-fusible op inductor does not generate a
    kernel for: ``meta["inductor_kernel"]``, set by capture; a concatenation or a scatter
    computes its fusible inputs inside its own kernel). The simulator adds the values a
    schedule carries from the forward into the backward (saved values)."""
    a = g._arrays
    return a.primal | a.is_output | a.backward_output | ~a.fusible | library_read(g)


def library_calls(g: Graph) -> np.ndarray:
    """Non-fusible values inductor does not generate a kernel for: library calls."""
    a = g._arrays
    return ~a.fusible & ~inductor_kernels(g)


def library_read(g: Graph) -> np.ndarray:
    """Values a library call reads (or copies: :func:`copied_bases`): inductor writes them
    (``realize_input``). It does so when it lowers that call, and a fusible reader lowered
    before the call computes the value inside itself; the simulator models that for unrolled
    sums only (:func:`remat.plans.simulator._allocations`; OPT's 0.8 plan, BENCHMARKS.md)."""
    def read(g: Graph) -> np.ndarray:
        a = g._arrays
        out = np.zeros(a.n, dtype=bool)
        out[a.user_src[library_calls(g)[a.user_idx]]] = True
        out[copied_bases(g)] = True
        return out
    return g._derived("library_read", read)


def copied_bases(g: Graph) -> list[int]:
    """The bases of capture's ``meta["copied_view"]`` views (a library call reads a view
    inductor cannot take of the base's channels-last storage): inductor writes the base, then
    copies it (:mod:`remat.capture.layouts`); the copy has a storage of its own
    (:func:`storage`)."""
    return g._derived("copied_bases", lambda g: [
        g.index(g.nodes[i].inputs[0]) for i in np.flatnonzero(marked(g, "copied_view")).tolist()])


def inductor_kernels(g: Graph) -> np.ndarray:
    """Non-fusible values inductor still generates a kernel for (capture's
    ``meta["inductor_kernel"]``): not library calls."""
    return marked(g, "inductor_kernel")


def marked(g: Graph, key: str) -> np.ndarray:
    """Which nodes capture marked ``meta[key]`` (``"inductor_kernel"``, ``"unrolled"``,
    ``"copied_view"``, ``"scatters_into_copy"``), derived once per graph."""
    return g._derived(("marked", key), lambda g: np.array(
        [bool(n.meta and n.meta.get(key)) for n in g.nodes], dtype=bool))


def memory_materialized(g: Graph) -> np.ndarray:
    """Values a fusing compiler writes to memory whatever the schedule: those of
    :func:`materialized`, and reductions (a reduction kernel writes its result; small),
    except those inductor unrolls into a pointwise op (capture's ``meta["unrolled"]``)."""
    a = g._arrays
    return materialized(g) | ((a.category == _REDUCTION) & ~marked(g, "unrolled"))


def storage(g: Graph) -> tuple[list[int], list[int]]:
    """``(owner, nbytes)``: the node whose storage each value lives in, and the bytes each
    node's own storage holds. A view (``meta["alias_of"]``, set by capture) lives in its
    base's storage, unless inductor copies it (``meta["copied_view"]``); a tuple
    (``meta["container"]``) holds none of its own (its items do).
    Graphs without these marks (Checkmate's) give every value its own storage."""
    return g._derived("storage", _storage)


def _storage(g: Graph) -> tuple[list[int], list[int]]:
    owner = list(range(len(g)))
    nbytes = [int(n.bytes) for n in g.nodes]
    for i, n in enumerate(g.nodes):
        base = n.meta.get("alias_of") if n.meta else None
        if base is not None and base in g and not n.meta.get("copied_view"):
            owner[i] = owner[g.index(base)]
            nbytes[i] = 0
        elif n.meta and n.meta.get("container"):
            nbytes[i] = 0
    return owner, nbytes


def effective_bytes(g: Graph) -> list[int]:
    """Bytes a value adds when it alone is resident: 0 for views and tuples. Solvers that
    count memory per value (the MILP) use these; the simulator tracks storages exactly."""
    return storage(g)[1]


def default_cost_model(g: Graph | None = None) -> CostModel:
    """The cost model of the device ``g`` runs on (:func:`profile_for_graph`), with fused
    memory when it runs through inductor (``g.meta["compiler"]``, recorded by capture); the
    CPU's without a graph."""
    if g is None:
        return CostModel()
    return CostModel(profile_for_graph(g), fused_memory=(g.meta or {}).get("compiler") == "inductor")


def constant_bytes(g: Graph) -> int:
    """Bytes of the inputs and parameters, counted as the simulator does (per storage)."""
    owner, sizes = storage(g)
    return int(sum(sizes[i] for i, n in enumerate(g.nodes) if n.is_primal and owner[i] == i))
