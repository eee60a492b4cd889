"""The state of a replay: what each value is (read once from the Graph and the cost model)
and where the step stands (residency, storages, the two streams' clocks, the totals).

Memory counts the inputs and parameters (resident throughout) plus every computed value until
it is freed; a view shares its base's storage, which stays allocated while any value living in
it is resident (``refs``); a value is counted from the moment its op starts, while its inputs
are still resident.

On a CPU, inductor's C++ backend emits consecutive kernels as one function, allocating their
outputs before it and freeing what died after it: a storage that dies between kernels stays
allocated until the next library call (an extern kernel: a matmul, a convolution) or the
phase's end, though a kernel may still write into it in place (:meth:`Replay.drop`,
:meth:`Replay.flush`). GPT-NeoX's plan for 0.8 measured 1.6% above its prediction: a
recomputed layer norm's output was allocated beside the logits and their gradient, which the
schedule had freed.
"""

from __future__ import annotations

from ...cost.model import CostModel, constant_bytes, library_calls, marked, materialized, storage
from ...cost.transfer import Link
from ...graph.graph import Graph
from ..schedule import Schedule, dropped_outputs, kept_to_end, never_recomputed
from .fusion import allocations
from .inplace import donor_ok, dying, reordered
from .layout import layout_copies
from .tuples import items_of, root_tangents, tuple_workspace
from .result import MAX_ERRORS


class Replay:
    """Everything :func:`~.replay.simulate` reads and updates while it walks a schedule."""

    def __init__(self, schedule: Schedule, cm: CostModel, link: Link, *, timeline: bool,
                 kernel_groups: bool, copies: bool) -> None:
        g: Graph = schedule.graph
        self.g, self.cm, self.link, self.timeline, self.copies = g, cm, link, timeline, copies
        a = g._arrays
        self.ins = g.input_indices
        self.owner, self.sizes = storage(g)
        self.primal = primal = a.primal.tolist()
        self.keep = (kept_to_end(g) & ~dropped_outputs(g)).tolist()
        self.once = never_recomputed(g).tolist()
        self.op_cost = cm.op_costs(g)
        self.work = tuple_workspace(g, cm)  # transient bytes while an op runs
        self.items = items_of(g)  # a tuple's items: allocated when the tuple's op runs (.tuples)
        self.tuple_held: list = [()] * a.n  # item storages a resident tuple still holds
        self.root = root_tangents(g)  # a loss's gradient: held by autograd to the step's end
        self.fusible = a.fusible.tolist()
        self.raw = a.bytes.tolist()  # traffic moves a view's own bytes; memory counts storages
        self.forward = a.forward.tolist()
        self.arith = cm.arithmetic(g)  # seconds of each op's FLOPs at its size's rate
        self.mat = materialized(g).tolist()
        self.profiled = cm.uses_additive_time(g)  # a compute takes its op cost
        device = cm.device
        self.bandwidth, self.launch = device.bandwidth, device.launch_seconds

        # values: residency, and the storages they hold
        self.resident = list(primal)
        self.refs = [0] * a.n  # a storage is held while any value living in it is resident
        for i, p in enumerate(primal):
            if p:
                self.refs[self.owner[i]] += 1
        self.computed = [False] * a.n
        self.held: list = [()] * a.n  # storages a value computed inside its readers keeps alive
        self.counted = [True] * a.n  # the resident value holds a reference to its storage
        self.errors: list[str] = []

        # memory
        self.constant = constant_bytes(g)
        self.copy_ends = layout_copies(schedule, g)
        self.mem = self.constant + sum(self.copy_ends.values())
        self.peak, self.peak_at = self.mem, -1
        self.tl: list[int] = []

        # the totals of CostModel.seconds, and the phase
        self.compute_cost = 0.0
        self.traffic_total = 0
        self.arith_total = 0.0  # seconds of arithmetic
        self.kernels = 0
        self.n_computes = 0
        self.backward = False  # the phase: the backward starts with the first non-forward compute
        self.phase = [False] * a.n  # the phase each resident value was computed in
        self.written = [False] * a.n  # the resident value has been written to memory
        self.read_by_fused = [0] * a.n  # 1 + phase in which fused kernels have read the value

        # the two streams: clocks, when each resident value is ready, when its host copy is done
        self.t_comp = self.t_copy = self.busy_copy = self.busy_compute = 0.0
        self.ready = [0.0] * a.n
        self.off_end = [-1.0] * a.n  # -1: no host copy
        self.copying = [False] * a.n  # an offload reads the resident device copy (until it is freed)
        self.host = self.host_peak = self.n_off = self.n_rel = 0
        self.times: list[tuple[str, float, float]] = []

        # fused kernels: which computes write, what register values hold, in-place donors
        fused = allocations(schedule, g, self.owner) if cm.fused_memory else None
        self.allocates = fused.writes if fused is not None else None
        self.holding = fused.holds if fused is not None else {}
        self.again = fused.recomputed if fused is not None else frozenset()
        self.dying = dying(schedule, g._index) if cm.fused_memory else None
        self.into_copy = marked(g, "scatters_into_copy").tolist()
        self.donor_ok = donor_ok(g, self.owner, primal)
        self.reordered = reordered(g)
        self.strides = [(n.meta or {}).get("strides") for n in g.nodes]
        # a view inductor copies out of a channels-last storage reads it in another order: never in place
        self.copied_view = marked(g, "copied_view").tolist()

        # CPU kernel groups
        self.grouped = fused is not None and kernel_groups and \
            ((g.meta or {}).get("device") or {}).get("type") == "cpu"
        self.library = library_calls(g).tolist()
        self.in_group = False
        self.pending = 0  # bytes of storages dead in the open group
        self.dead: set[int] = set()  # those storages

    def err(self, msg: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(msg)

    def take(self, o: int) -> None:
        """One more resident value references storage ``o``: allocated with the first."""
        self.refs[o] += 1
        if self.refs[o] == 1:
            self.mem += self.sizes[o]

    def release(self, o: int) -> None:
        """One value referencing storage ``o`` is gone: dropped with the last."""
        self.refs[o] -= 1
        if self.refs[o] == 0:
            self.drop(o)

    def drop(self, o: int) -> None:
        """Storage ``o`` is dead: freed now, or when the open kernel group ends."""
        if self.in_group:
            self.pending += self.sizes[o]
            self.dead.add(o)
        else:
            self.mem -= self.sizes[o]

    def flush(self) -> None:
        """The open kernel group ends: what died in it is freed."""
        self.mem -= self.pending
        self.pending = 0
        self.dead.clear()
        self.in_group = False

    def reach(self, nbytes: int, k: int) -> None:
        """``nbytes`` are resident at statement ``k``: the peak, if above it."""
        if nbytes > self.peak:
            self.peak, self.peak_at = nbytes, k
