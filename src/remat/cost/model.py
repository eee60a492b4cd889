"""The cost model: what each op costs to compute and to move through memory.

Two views of one step, both used by the simulator:

- **additive** (Checkmate, seeds/001 Section 4.10; and how remat's ``eager`` compiler runs a
  step, every op its own kernel: :attr:`CostModel.per_op`): every op has a cost ``C_i`` and a
  schedule costs the sum over its compute statements. ``C_i`` is the node's profiled ``cost``
  when it has one (Checkmate's graphs do), else ``max(arithmetic, (output + input bytes) /
  bandwidth) + fixed`` on a :class:`DeviceProfile` (a view moves no bytes).
- **fusion-aware traffic** (seeds/000 Section 3.2): fusible ops (pointwise, reduction, view)
  fuse with their neighbours, so only *materialized* values cost memory traffic: written
  once when computed and read once by each kernel that reads them. A value is materialized
  when it is a primal, an output, not fusible, read by a non-fusible op, or carried from the
  forward into the backward. The predicted time is ``arithmetic + traffic / bandwidth +
  kernels * launch_seconds`` (a materialized value is one kernel), or the additive cost when
  the graph carries profiled costs.

**Per-kernel pricing** (issue 31). A kernel costs a fixed time whatever its size
(``launch_seconds`` per kernel of a fusing compiler, ``op_seconds`` per op run op by op), and
a small matmul or convolution reaches a fraction of the device's peak: an op's arithmetic takes
``flops / rate(flops)``, the rate read off the profile's efficiency curve (``matmul_curve``,
``conv_curve``: FLOP/s measured at a few sizes of one call, interpolated in log-log space,
clamped at both ends; ``peak_flops`` without a curve). A region split into n parts
(fission) runs n kernels of 1/n the work each: it pays n fixed costs and n small-kernel rates
where the whole paid one, with no rule of fission's own.

The device numbers are settings: :func:`remat.cost.calibrate.cpu_profile` measures this machine
(and :func:`~remat.cost.calibrate.cuda_profile` a GPU).
"""

from __future__ import annotations

import dataclasses

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from ..graph.graph import CATEGORIES, Graph, Node
from . import pricing

_REDUCTION = CATEGORIES.index("reduction")

Curve = tuple  # ((flops of one call, FLOP/s it reaches), ...), ascending in flops


@dataclass(frozen=True)
class DeviceProfile:
    """A device's numbers. ``peak_flops``: FLOP/s of large matmuls in the training dtype;
    ``bandwidth``: bytes/s of main memory; ``launch_seconds``: the fixed cost of one kernel of
    a fusing compiler (launch, or on a CPU the call of a generated kernel); ``conv_workspace``:
    a convolution's transient bytes as a multiple of its output; ``op_seconds``: the fixed cost
    of one op run op by op (remat's ``eager`` compiler: ATen dispatch from Python; None: as
    ``launch_seconds``); ``view_seconds``: that of a view op by op (None: as ``op_seconds``);
    ``matmul_curve`` / ``conv_curve``: the FLOP/s one call reaches at a few sizes
    (:data:`Curve`; empty: ``peak_flops`` at every size; a convolution without its own curve
    reads the matmul's); ``bandwidth_curve``: the bytes/s one op moving that many bytes
    reaches, ``((bytes, bytes/s), ...)`` (on a CPU, data that fits a cache moves faster than
    ``bandwidth``, a large copy's; the additive view reads it, empty: ``bandwidth``);
    ``element_seconds``: the arithmetic of a pointwise or reduction op per element it
    computes or reduces (an ``erf``'s, an ``exp``'s: work the graph counts no FLOPs for; 0:
    none, the default profiles' setting, which planning uses); ``memory``: bytes of device
    memory (None: not known, as for a CPU, whose memory is the host's)."""

    name: str
    peak_flops: float
    bandwidth: float
    launch_seconds: float = 0.0
    conv_workspace: float = 0.0
    op_seconds: float | None = None
    view_seconds: float | None = None
    matmul_curve: Curve = ()
    conv_curve: Curve = ()
    bandwidth_curve: Curve = ()
    element_seconds: float = 0.0
    memory: int | None = None

    @classmethod
    def from_record(cls, record: dict) -> DeviceProfile:
        """The profile a graph records (``g.meta["device"]["profile"]``: its fields as JSON values,
        curves as lists of pairs, written by remat; :mod:`remat.cost.profile_json` reads a
        user's file, with checks)."""
        known = {f.name for f in dataclasses.fields(cls)}
        curves = ("matmul_curve", "conv_curve", "bandwidth_curve")
        return cls(**{k: tuple(tuple(p) for p in v) if k in curves else v for k, v in record.items() if k in known})

    @property
    def op_fixed(self) -> float:
        """Fixed seconds of one op run op by op."""
        return self.launch_seconds if self.op_seconds is None else self.op_seconds

    @property
    def view_fixed(self) -> float:
        """Fixed seconds of one view op run op by op."""
        return self.op_fixed if self.view_seconds is None else self.view_seconds

    def rate(self, flops: float, kind: str = "matmul") -> float:
        """FLOP/s one call of ``flops`` reaches: ``kind`` ``"matmul"`` or ``"conv"`` read
        their efficiency curve (log-log interpolation, clamped at its ends), anything else
        ``peak_flops``.

        >>> p = DeviceProfile("t", 100e9, 1e9, matmul_curve=((1e3, 1e9), (1e5, 1e11)))
        >>> round(p.rate(1e4) / 1e9, 3), p.rate(1e2), p.rate(1e9), p.rate(1e4, "other")
        (10.0, 1000000000.0, 100000000000.0, 100000000000.0)
        """
        curve = self.conv_curve if kind == "conv" and self.conv_curve else \
            self.matmul_curve if kind in ("matmul", "conv") else ()
        return curve_rate(curve, flops) if curve else self.peak_flops

    def moved_rate(self, nbytes: float) -> float:
        """Bytes/s of one op that moves ``nbytes`` (:attr:`bandwidth_curve`, else
        ``bandwidth``)."""
        return curve_rate(self.bandwidth_curve, nbytes) if self.bandwidth_curve else self.bandwidth

    def rates(self, flops: np.ndarray, kinds: np.ndarray) -> np.ndarray:
        """:meth:`rate` of each call: ``flops[i]`` of kind ``kinds[i]`` (the codes of
        :func:`remat.cost.pricing.kernel_kinds`), bit for bit."""
        out = np.full(len(flops), float(self.peak_flops))
        if self.matmul_curve:  # a convolution without a curve of its own reads the matmul's
            on = kinds == pricing.MATMUL if self.conv_curve else kinds != pricing.OTHER
            out[on] = pricing.curve_rates(self.matmul_curve, flops[on])
        if self.conv_curve:
            on = kinds == pricing.CONV
            out[on] = pricing.curve_rates(self.conv_curve, flops[on])
        return out

    def moved_rates(self, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`moved_rate` of each op moving ``nbytes[i]``, bit for bit."""
        if self.bandwidth_curve:
            return pricing.curve_rates(self.bandwidth_curve, nbytes)
        return np.full(len(nbytes), float(self.bandwidth))


def curve_rate(curve: Curve, flops: float) -> float:
    """The rate of ``curve`` at ``flops``: linear in log(flops) -> log(rate) between its
    points, its first point's rate below them and its last point's above."""
    if flops <= curve[0][0]:
        return float(curve[0][1])
    if flops >= curve[-1][0]:
        return float(curve[-1][1])
    x = math.log(flops)
    for (f0, r0), (f1, r1) in itertools.pairwise(curve):
        if flops <= f1:
            t = (x - math.log(f0)) / (math.log(f1) - math.log(f0))
            return math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0)))
    return float(curve[-1][1])  # not reached


ITEMSIZE = pricing.ITEMSIZE
"""Bytes per element by dtype name (others: 4)."""


def elements(g: Graph, n: Node) -> float:
    """The elements a pointwise op computes (its output's) or a reduction reduces (its largest
    input's); 0 for other ops."""
    if n.category == "pointwise":
        return n.bytes / ITEMSIZE.get(str(n.dtype), 4)
    if n.category == "reduction" and n.inputs:
        u = max((g[v] for v in n.inputs), key=lambda u: u.bytes)
        return u.bytes / ITEMSIZE.get(str(u.dtype), 4)
    return 0.0


def kernel_kind(n: Node) -> str:
    """Which efficiency curve prices ``n``'s arithmetic: ``"conv"`` (convolutions and their
    backward), ``"matmul"`` (every other compute-intensive op: matmuls, attention), ``"other"``."""
    if n.category != "compute":
        return "other"
    return "conv" if n.op.startswith("convolution") else "matmul"


CPU_MATMUL_SHAPE = ((8.2e3, 0.07), (6.6e4, 0.37), (5.2e5, 0.79), (4.2e6, 1.0))
"""A CPU matmul's rate as a share of its peak, by the FLOPs of one call (measured here with
:func:`remat.cost.calibrate.cpu_profile`, one thread: 16^3 reaches 7%, 64^3 79%, 128^3 and
more the peak, 160-170 GFLOP/s)."""

CPU_CONV_SHAPE = ((7.4e4, 0.04), (1.2e6, 0.23), (9.4e6, 0.44), (7.5e7, 0.93), (6.0e8, 1.0))
"""A CPU 3x3 convolution's rate as a share of the matmul peak, by FLOPs (measured the same
way: batch 1 x 8 channels at 8x8 reaches 4%, 8 x 64 at 32x32 the peak). Not in the default
profile (its convolutions read the matmul's curve): with it, ``budget="min"`` on ResNet-18
tiny under inductor priced recomputing its small convolutions up to 2x dearer and kept a
plan above the knob's least (``tests/test_plan_order.py``); the calibrated profile carries
the measured curve."""

CPU_MOVED = ((2e5, 30e9), (1.6e6, 25e9), (1.3e7, 22e9), (5e7, 15e9), (2e8, 5.5e9))
"""Bytes/s of one op by op pointwise op, by the bytes it moves (reads and writes), its operands
cold (measured here with :func:`remat.cost.calibrate.cpu_profile`: an ATen ``mul`` whose
operands come from a pool larger than the caches; a 64 MiB operand's output is allocated
afresh, page faults included)."""

GPU_MATMUL_SHAPE = ((3.4e7, 0.02), (2.7e8, 0.08), (2.1e9, 0.25), (1.7e10, 0.6), (1.4e11, 0.9),
                    (1.1e12, 1.0))
"""A GPU matmul's rate as a share of its tensor-core peak, by FLOPs (256^3 ... 8192^3): an
estimate from cuBLAS's usual times (a 256^3 matmul takes about as long as a launch; the peak
needs about 4096^3), not measured here. Replace it with a measurement:
``remat.cost.calibrate.cuda_profile()`` times the same sizes with CUDA events."""


def shaped(peak: float, shape) -> Curve:
    """A :data:`Curve` of ``shape`` (``(flops, share of the peak)`` pairs) at ``peak`` FLOP/s."""
    return tuple((float(f), float(share) * peak) for f, share in shape)


def _gpu(name: str, peak: float, bandwidth: float, memory: int | None = None) -> DeviceProfile:
    # a kernel's launch and dispatch: about 5 us from PyTorch; op by op the same
    return DeviceProfile(name, peak, bandwidth, 5e-6, matmul_curve=shaped(peak, GPU_MATMUL_SHAPE),
                         memory=memory)


PROFILES = {
    # datasheet numbers: dense TF32 tensor-core throughput and HBM bandwidth
    "a100": _gpu("a100", 156e12, 1.555e12),
    "h100": _gpu("h100", 378e12, 3.35e12),
    "v100": _gpu("v100", 15.7e12, 0.9e12),
    # a 2-core x86 machine: ~50 GFLOP/s fp32 matmul, ~8 GB/s copy (remat.cost.calibrate measures yours)
    # (measured here with benchmarks/conv_workspace.py: a CPU convolution allocates one more
    # buffer of its output's size while it runs, its backward buffers of grad_output's and
    # the input's sizes; either a weight-sized one when the weight is larger). An op run op by
    # op costs 2.5 us here (remat's eager compiler: a chain of 400 tiny ops, per compute; an
    # ATen add alone 2.1 us), a kernel of inductor's about 2 us; small matmuls (and
    # convolutions: CPU_CONV_SHAPE says why not their own curve) reach a share of the peak
    # (CPU_MATMUL_SHAPE), an op by op pointwise op moves its bytes at CPU_MOVED's rate
    "cpu": DeviceProfile("cpu", 50e9, 8e9, 2e-6, conv_workspace=1.0, op_seconds=2.5e-6,
                         matmul_curve=shaped(50e9, CPU_MATMUL_SHAPE), bandwidth_curve=CPU_MOVED),
}

GiB = 1 << 30


@dataclass(frozen=True)
class Datasheet:
    """A GPU's published figures: dense (no sparsity) FLOP/s by training dtype, main-memory
    bandwidth (bytes/s) and capacity (bytes; the "80 GB" of a datasheet read as GiB, as the
    HBM stacks hold it: ``torch.cuda`` reports 1-2% less, what the driver keeps)."""

    label: str
    bf16: float
    fp16: float
    fp32: float
    tf32: float
    bandwidth: float
    memory: int


DATASHEETS = {
    # NVIDIA's datasheets (dense tensor-core rates, half the "with sparsity" figures): bf16 and
    # fp16 run at one rate on these parts. fp32 is the CUDA cores' rate, not TF32's: PyTorch
    # runs float32 matmuls without TF32 unless torch.backends.cuda.matmul.allow_tf32 (or
    # torch.set_float32_matmul_precision("high")) says otherwise; tf32 is there for that case.
    # The RTX 4090's fp16/bf16 is the rate with fp32 accumulation (PyTorch's), half its
    # fp16-accumulate figure.
    "H100": Datasheet("NVIDIA H100 SXM5 80GB HBM3", 989.4e12, 989.4e12, 66.9e12, 494.7e12, 3.35e12, 80 * GiB),
    "H200": Datasheet("NVIDIA H200 SXM 141GB HBM3e", 989.4e12, 989.4e12, 66.9e12, 494.7e12, 4.8e12, 141 * GiB),
    "A100-40GB": Datasheet("NVIDIA A100 SXM4 40GB HBM2", 312e12, 312e12, 19.5e12, 156e12, 1.555e12, 40 * GiB),
    "A100-80GB": Datasheet("NVIDIA A100 SXM4 80GB HBM2e", 312e12, 312e12, 19.5e12, 156e12, 2.039e12, 80 * GiB),
    "L4": Datasheet("NVIDIA L4 24GB GDDR6", 121e12, 121e12, 30.3e12, 60e12, 0.3e12, 24 * GiB),
    "RTX4090": Datasheet("NVIDIA GeForce RTX 4090 24GB GDDR6X", 165.2e12, 165.2e12, 82.6e12, 82.6e12,
                         1.008e12, 24 * GiB),
}
"""Published figures of the GPUs remat knows by name (:func:`remat.cost.profiles.resolve_profile`)."""

MATMUL_SHARE = 0.8
BANDWIDTH_SHARE = 0.9
"""The shares of a datasheet's matmul rate and bandwidth that large kernels reach, which the
named profiles price at: an H100 measured 798 TFLOP/s bf16 (0.81 of 989) and 3.0 TB/s (0.9 of
3.35), an H200 788 TFLOP/s and 4.3 TB/s (0.9 of 4.8)."""

DTYPES = ("bf16", "fp16", "fp32")


def datasheet_profile(gpu: str, dtype: str = "bf16") -> DeviceProfile:
    """The profile of a GPU of :data:`DATASHEETS` training in ``dtype`` (``"bf16"``,
    ``"fp16"``, ``"fp32"``): the datasheet's rate and bandwidth at :data:`MATMUL_SHARE` and
    :data:`BANDWIDTH_SHARE`, its memory, 5 us a kernel and small matmuls at
    :data:`GPU_MATMUL_SHAPE`'s share of the peak. Named ``"<gpu>-<dtype>"`` in lower case.

    >>> p = datasheet_profile("H100")
    >>> p.name, round(p.peak_flops / 1e12), p.memory // GiB
    ('h100-bf16', 792, 80)
    """
    sheet = DATASHEETS[gpu]
    return _gpu(f"{gpu.lower()}-{dtype}", MATMUL_SHARE * getattr(sheet, dtype),
                BANDWIDTH_SHARE * sheet.bandwidth, sheet.memory)


GPU_PROFILES = {(gpu, kind): datasheet_profile(gpu, "bf16" if kind == "half" else "fp32")
                for gpu in DATASHEETS for kind in ("half", "float")}
"""``(GPU, "half" | "float") -> profile``: the GPUs of :data:`DATASHEETS` in bf16 (fp16 runs at
the same rate) and in float32 (without TF32, PyTorch's default). A captured graph on one of
them is priced so (:func:`profile_for_graph`); another GPU gets the A100 80GB's (a conservative
middle). On a GPU, ``remat.cost.calibrate.cuda_profile()`` measures the fixed cost and the
curve, and ``remat.cost.CostModel(cuda_profile())`` predicts with them."""


def datasheet_gpu(device_name: str) -> str | None:
    """The :data:`DATASHEETS` entry a CUDA device name is (``"NVIDIA H100 80GB HBM3"`` ->
    ``"H100"``, ``"NVIDIA A100-SXM4-40GB"`` -> ``"A100-40GB"``, ``"NVIDIA L4"`` -> ``"L4"``,
    not ``"NVIDIA L40S"``), or None.

    >>> datasheet_gpu("NVIDIA GeForce RTX 4090"), datasheet_gpu("NVIDIA L40S")
    ('RTX4090', None)
    """
    words = re.findall(r"[A-Z0-9]+", device_name.upper())
    joined = "".join(words)
    if "H100" in words:
        return "H100"
    if "H200" in words:
        return "H200"
    if any(w.startswith("A100") for w in words):
        return "A100-40GB" if "40GB" in joined else "A100-80GB"
    if "L4" in words:
        return "L4"
    if "RTX4090" in joined:
        return "RTX4090"
    return None


def profile_for_graph(g: Graph) -> DeviceProfile:
    """The device profile of the device a captured graph runs on (``g.meta["device"]``,
    recorded by capture: ``{"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "dtype":
    "bfloat16"}``): the profile recorded there when the graph was planned for a target (its
    ``"profile"``, a measured file's or a datasheet's numbers), else the datasheet GPU its name
    says; the CPU profile for graphs without one (Checkmate's, synthetic ones).

    >>> from remat.graph.examples import cos_cos_graph
    >>> profile_for_graph(cos_cos_graph()).name
    'cpu'
    """
    device = (g.meta or {}).get("device") or {}
    record = device.get("profile")
    if isinstance(record, dict):  # planned for a target (remat.plan(..., device=/profile=)): its profile
        return DeviceProfile.from_record(record)
    if device.get("type") != "cuda":
        return PROFILES["cpu"]
    kind = "half" if device.get("dtype") in ("bfloat16", "float16") else "float"
    return GPU_PROFILES[(datasheet_gpu(str(device.get("name", ""))) or "A100-80GB", kind)]


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
    execution, remat's ``eager`` compiler).

    ``per_op``: the step runs op by op (remat's ``eager`` compiler), every op its own kernel:
    its time is the additive view's (:meth:`op_costs` summed over the schedule's computes:
    every op reads its inputs and writes its output, and pays ``op_seconds``). Off, the
    fusion-aware view's (:meth:`seconds`)."""

    device: DeviceProfile = PROFILES["cpu"]
    fused_memory: bool = False
    per_op: bool = False

    def op_costs(self, g: Graph) -> list[float]:
        """Additive cost ``C_i`` of computing each node once (0 for primals and tangents): its
        profiled ``cost`` where it has one; a view's arithmetic and ``view_fixed``; any other
        op's ``max(arithmetic, (output + input bytes) / moved_rate) + op_fixed``."""
        return g._derived(("op_costs", self.device), lambda g: self.op_cost_array(g).tolist())

    def op_cost_array(self, g: Graph) -> np.ndarray:
        """:meth:`op_costs` as a float64 array (read-only), priced for all nodes at once."""
        dev = self.device

        def costs(g: Graph) -> np.ndarray:
            a = g._arrays
            arith = self.arithmetic_array(g)
            moved = pricing.moved_bytes(g)
            traffic = np.zeros(a.n)
            np.divide(moved, dev.moved_rates(moved), out=traffic, where=moved != 0)
            out = np.maximum(arith, traffic) + dev.op_fixed
            out[a.view] = arith[a.view] + dev.view_fixed  # a view moves nothing; op by op it is still a call
            out[pricing.placeholders(g)] = 0.0
            profiled = ~np.isnan(a.cost)
            out[profiled] = a.cost[profiled]
            return out
        return g._derived(("op_cost_array", dev), costs)

    def arithmetic(self, g: Graph) -> list[float]:
        """Seconds of each node's arithmetic: its FLOPs at the rate a call of its size reaches
        (:meth:`DeviceProfile.rate`; a matmul or convolution split in n parts runs each part
        at its smaller size's rate), plus ``element_seconds`` per element it computes or
        reduces (:func:`elements`)."""
        return g._derived(("arithmetic", self.device), lambda g: self.arithmetic_array(g).tolist())

    def arithmetic_array(self, g: Graph) -> np.ndarray:
        """:meth:`arithmetic` as a float64 array (read-only), priced for all nodes at once."""
        dev = self.device

        def seconds(g: Graph) -> np.ndarray:
            flops = g._arrays.flops
            out = np.zeros(len(flops))
            np.divide(flops, dev.rates(flops, pricing.kernel_kinds(g)), out=out, where=flops != 0)
            if dev.element_seconds:
                out = out + dev.element_seconds * pricing.element_counts(g)
            return out
        return g._derived(("arithmetic_array", dev), seconds)

    def uses_additive_time(self, g: Graph) -> bool:
        """Whether a schedule's time is the sum of its computes' :meth:`op_costs`: the graph
        carries profiled costs, or the step runs op by op (``per_op``)."""
        return self.per_op or self.uses_profiled_costs(g)

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
        nodes, a = g.nodes, g._arrays
        out = [0] * len(nodes)
        for i in a.meta_nodes:
            m = nodes[i].meta
            if m.get("container") and not m.get("alias_of"):  # a split's items are views: nothing allocated
                out[i] = int(nodes[i].bytes)
        # only nodes with a mark, or an op that holds temporaries, can hold a workspace
        ops = set(a.ops)
        special = {op for op in ops if op in EAGER_TEMPORARIES} if not self.fused_memory else set()
        if f:
            special |= {op for op in ops if op.startswith("convolution")}
        marks = [i for i in a.meta_nodes if "workspace" in nodes[i].meta]
        if special:
            marks += [i for i, op in enumerate(a.ops) if op in special]
        for i in sorted(set(marks)):
            n = nodes[i]
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
        """Whether a node other than a primal carries a profiled ``cost``."""
        a = g._arrays
        return bool((~np.isnan(a.cost) & ~a.primal).any())

    def seconds(self, compute_cost: float, traffic_bytes: int, arithmetic: float = 0.0,
                kernels: int = 0, g: Graph | None = None) -> float:
        """Predicted time of a schedule from the totals the simulator gathered: the summed
        :meth:`op_costs` of its computes (``compute_cost``) in the additive view
        (:meth:`uses_additive_time`), else its arithmetic seconds (:meth:`arithmetic`), its
        traffic over the bandwidth and ``launch_seconds`` per kernel."""
        if self.per_op or g is not None and self.uses_profiled_costs(g):
            return compute_cost
        return arithmetic + traffic_bytes / self.device.bandwidth + kernels * self.device.launch_seconds


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
    def marks(g: Graph) -> np.ndarray:
        out = np.zeros(len(g), dtype=bool)
        nodes = g.nodes
        out[[i for i in g._arrays.meta_nodes if nodes[i].meta.get(key)]] = True
        return out
    return g._derived(("marked", key), marks)


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
    return g._derived("storage", lambda g: tuple(x.tolist() for x in storage_arrays(g)))


def storage_arrays(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """:func:`storage` as arrays (read-only): ``owner`` int64, ``nbytes`` as
    :attr:`GraphArrays.bytes <remat.graph.graph.GraphArrays>` (int64, or Python ints)."""
    return g._derived("storage_arrays", _storage)


def _storage(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    a = g._arrays
    owner = np.arange(a.n, dtype=np.int64)
    nbytes = a.bytes.copy()
    nodes, index = g.nodes, g._index
    for i in a.meta_nodes:  # in graph order: a view's base has its owner before the view
        m = nodes[i].meta
        base = m.get("alias_of")
        if base is not None and base in index and not m.get("copied_view"):
            owner[i] = owner[index[base]]
            nbytes[i] = 0
        elif m.get("container"):
            nbytes[i] = 0
    return owner, nbytes


def effective_bytes(g: Graph) -> list[int]:
    """Bytes a value adds when it alone is resident: 0 for views and tuples. Solvers that
    count memory per value (the MILP) use these; the simulator tracks storages exactly."""
    return storage(g)[1]


def default_cost_model(g: Graph | None = None) -> CostModel:
    """The cost model of the device ``g`` runs on (:func:`profile_for_graph`), with fused
    memory when it runs through inductor (``g.meta["compiler"]``, recorded by capture), op by
    op (``per_op``: the additive view's time) when it runs through remat's ``eager`` compiler;
    the CPU's without a graph."""
    if g is None:
        return CostModel()
    compiler = (g.meta or {}).get("compiler")
    return CostModel(profile_for_graph(g), fused_memory=compiler == "inductor", per_op=compiler == "eager")


def constant_bytes(g: Graph) -> int:
    """Bytes of the inputs and parameters, counted as the simulator does (per storage)."""
    owner, sizes = storage_arrays(g)
    own = g._arrays.primal & (owner == np.arange(len(owner)))
    return int(sizes[own].sum()) if own.any() else 0
