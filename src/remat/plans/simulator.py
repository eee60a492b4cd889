"""The simulator: the one judge of every plan's memory and time.

:func:`simulate` replays a :class:`~remat.plans.schedule.Schedule` on its Graph. It checks that
every value a statement reads is resident, that nothing is computed while still resident
or freed twice, that inputs, parameters and kept values (outputs, gradients) are never
freed and that every required node is computed. It returns the peak memory, the memory
timeline (bytes resident after each statement, as seeds/001's U), and the predicted time
under the cost model (:mod:`remat.cost.model`).

Under a fusing compiler (``CostModel.fused_memory``) a value fused kernels keep in registers
takes no memory but keeps what it reads alive (:func:`_allocations`), and a kernel that reads
an input for the last time writes its output into that input's storage when both have the
same size (inductor's ``inplace_buffers``): the two are not allocated together. A forward
value the backward computes does so too, into a saved value (AOTAutograd donates the saved
tensors to the backward); nothing is written into what ATen scattered into, nor into what a
later reader reads again to compute the value inside itself (below). For a graph
captured on a CPU, a free between kernels waits for the next extern kernel (a matmul, a
convolution): inductor's C++ backend emits consecutive kernels as one function and frees what
died after it. Graph inputs inductor copies to channels-last for its convolutions
(``meta["layout_copy"]``) are resident from the step's start to their input's last reader.

Memory counts the inputs and parameters (resident throughout, Checkmate's constant
overhead) plus every computed value until it is freed; a view shares its base's storage,
which stays allocated while either is resident (:func:`remat.cost.model.storage`); a value is counted from the moment
its op starts, while its inputs are still resident, so the peak includes each op's inputs
and output together.

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.schedule import schedule_from_saved_set
>>> g = cos_cos_graph()
>>> r = simulate(schedule_from_saved_set(g, ["add_2"]))
>>> r.valid, r.peak_bytes // 4096  # 4 inputs, add_2 saved, cos_1, the tangent, cos and sin
(True, 9)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.model import (CostModel, constant_bytes, default_cost_model, library_calls, library_read, marked,
                          materialized, memory_materialized, profile_for_graph, storage)
from ..errors import PlanError
from ..graph.graph import Graph
from ..cost.transfer import Link, link_for_graph
from .schedule import COPIES, Schedule, dropped_outputs, kept_to_end, never_recomputed, required_nodes


@dataclass
class SimResult:
    valid: bool
    errors: list[str]
    peak_bytes: int
    peak_statement: int  # index of the statement at which the peak is first reached (-1: at start)
    timeline: list[int]  # bytes resident after each statement
    constant_bytes: int  # inputs and parameters, resident throughout
    end_bytes: int  # resident when the schedule ends (kept values and leaks)
    compute_cost: float  # additive per-op cost (Checkmate): sum over compute statements
    traffic_bytes: int  # fusion-aware memory traffic of the computed values
    predicted_seconds: float  # the cost model's time for the whole schedule
    computes: int
    recomputes: int  # compute statements beyond the first of each node
    meta: dict = field(default_factory=dict)
    # swapping (offload/reload statements) on two streams, in the graph's time unit
    offloads: int = 0
    reloads: int = 0
    copy_seconds: float = 0.0  # the copy stream's busy time (on a CPU, copies on the one stream)
    wait_seconds: float = 0.0  # added to the step by copies: compute waiting, or copies after it
    host_peak_bytes: int = 0  # host memory the offloaded values take at most
    times: list = field(default_factory=list)  # (stream, start, end) per statement, with timeline

    def within(self, budget: float) -> bool:
        return self.valid and self.peak_bytes <= budget

    def check(self) -> "SimResult":
        """Raise :class:`PlanError` naming the first problem when the schedule is invalid."""
        if not self.valid:
            more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            raise PlanError(f"invalid schedule: {self.errors[0]}{more}")
        return self


_MAX_ERRORS = 20


FAR = 16
"""A fusible value whose first reader comes more than this many computes later is written to
memory: inductor would compute it inside that reader, with its inputs alive until then, so
:mod:`remat.lower.plan_order` has inductor write it where the schedule computes it."""

HEAVY_OPS = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
"""Ops that make inductor write a value several kernels read on a CPU rather than compute it
again in each (``StorageBox.should_realize_on_reuse``)."""

REALIZE_READS = 4
"""A value several kernels read is written when computing it reads more buffers than this
(inductor's ``realize_reads_threshold``)."""


@dataclass
class _Fused:
    """Which computes write their value (``writes``), and the storages a value inductor
    computes inside each of its readers keeps alive while it is resident (``holds``: compute
    statement -> owners), and the computes whose value a later reader computes again inside
    itself (``recomputed``: they never write in place into what they read)."""

    writes: list[bool]
    holds: dict[int, list[int]]
    recomputed: frozenset[int] = frozenset()


def _allocations(schedule: Schedule, g: Graph, owner: list[int]) -> _Fused:
    """Under a fusing compiler (``CostModel.fused_memory``), which computes allocate memory.

    A value is written to memory when its storage is materialized
    (:func:`remat.cost.model.memory_materialized`: a kernel writes it), when the schedule
    carries it from one phase into the other (a saved value), or when its first reader comes
    more than :data:`FAR` computes later. Otherwise a fusible value lives in registers:
    inductor computes it inside each kernel that reads it, so it takes no memory but keeps the
    storages its expression reads alive while it is resident (``holds``); a kernel that reads
    such a storage last through it may write into it (:func:`simulate`).

    An item of a tuple in a storage of its own (a convolution backward's input gradient, a
    var_mean's mean) is a buffer its op wrote: counted in registers, a MobileNetV2-like CNN's
    budgeted plans were predicted 14-30% below their measured peaks.

    A value several kernels read (counted for the copy the schedule computes: a recomputation's
    readers are in the backward only) is written where inductor would write it rather than
    compute it in each: on a CPU when its expression holds a :data:`HEAVY_OPS` op, on any device
    when it reads more than :data:`REALIZE_READS` buffers. The rule holds for every value, not
    only recomputations: a CNN's residual gradient that computes a recomputed ReLU inside
    itself reads seven buffers, and inductor writes it (it was predicted 1 MB above its
    measured peak when the rule was for recomputations only). A value computed from no tensor
    (zeros, a fill) is never written unless it is an output: inductor computes it inside each reader, or fills a fresh
    buffer there for a reader that needs one (that reader's output, which is counted). A
    forward-role value the backward computes first (the one-hot of a cross-entropy's labels)
    is fused like any backward value.

    A value written only because a library call reads it is written when inductor lowers
    that call; a sum over a few elements (``meta["unrolled"]``, in registers) lowered before
    the call computes the value's expression inside itself, so it holds what the value reads,
    and the value never takes their storage (``recomputed``). T5's relative position bias sums
    its softmax gradient over a batch of 4 after the two matmuls that read that gradient:
    the attention's probabilities and the gradient's input stayed alive across them, and its
    least-memory plan measured 0.7% above its prediction. Only these sums: a first form of the
    rule for every fusible reader (not kept) over-predicted T5 8% without a budget. On a CPU
    such a hold keeps a storage that died in the open kernel group (:func:`simulate`).

    With these rules, in-place writes and the CPU's kernel groups (:func:`simulate`),
    compiled in the plan's order (:mod:`remat.lower.plan_order`), remat's plans of GPT-2, T5,
    Llama, Qwen2 and a CNN without a budget, at 0.6 and at ``min`` are predicted within 1 KB
    of their measured peaks on a CPU, ResNet-18's within 0.3% (``benchmarks/predictions.py``,
    BENCHMARKS.md). Before the holds and the recomputation rule, every recomputation was
    counted written: budgeted plans were predicted up to 1.25x their measured peak, and GPT-2
    refused 0.6."""
    a = g._arrays
    ins = g.input_indices
    index = g._index
    # the storages written whatever the schedule (memory_materialized: those a library call
    # reads, and the others), and those written only because a library call reads them
    # (inductor writes such a value when it lowers the call)
    lib = library_read(g)
    lib_s, other_s = [False] * a.n, [False] * a.n
    for i, (x, y) in enumerate(zip(lib.tolist(), (memory_materialized(g) & ~lib).tolist())):
        lib_s[owner[i]] |= x
        other_s[owner[i]] |= y
    smat = [x or y for x, y in zip(lib_s, other_s)]
    for_call = [x and not y for x, y in zip(lib_s, other_s)]
    forward = a.forward.tolist()
    primal = a.primal.tolist()
    realized = [False] * len(schedule.statements)  # written at its own lowering
    calls = library_calls(g).tolist()
    unrolled = marked(g, "unrolled").tolist()
    called = [False] * a.n  # a library call has read the value's current copy
    recomputed: set[int] = set()  # computes a later reader computes again inside itself
    on_cpu = profile_for_graph(g).name == "cpu"
    heavy_op = [on_cpu and n.op.split(".")[0] in HEAVY_OPS for n in g.nodes]
    # a value computed from no tensor (zeros, a fill, an arange): inductor computes it inside
    # each reader, or fills a fresh buffer there for a reader that needs one (that reader's
    # output, which the schedule counts)
    tangent = [n.role == "tangent" for n in g.nodes]  # handed to the backward: real tensors
    const = [not primal[i] and not ins[i] and not tangent[i] for i in range(a.n)]
    kept = (a.is_output | a.backward_output).tolist()
    item = _tuple_items(g)
    view = a.view.tolist()
    readers = _readers(schedule, g)
    writes = [False] * len(schedule.statements)
    forced = [False] * len(schedule.statements)  # written as a saved value or for a far reader
    holds: dict[int, list[int]] = {}
    occurrence = [-1] * a.n  # the statement that computed each resident value
    ordinal = [0] * a.n  # how many computes came before it
    read = [False] * a.n  # the resident value has been read
    phase = [False] * a.n
    heavy = [False] * a.n  # a heavy op in the expression a reader computes
    reads: list[frozenset] = [frozenset()] * a.n  # the storages that expression reads
    backward = False
    computes = 0
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None:
            continue
        if st.op == "offload" and occurrence[i] >= 0:  # the copy reads it from memory
            writes[occurrence[i]] = forced[occurrence[i]] = True
            continue
        if st.op == "reload":  # a fresh buffer the copy writes
            writes[k] = forced[k] = True
            occurrence[i], ordinal[i], read[i], phase[i] = k, computes, False, backward
            reads[i], heavy[i] = frozenset({owner[i]}), False
            continue
        if st.op != "compute":
            continue
        backward = backward or not forward[i]
        for j in ins[i]:
            if primal[j] or occurrence[j] < 0:
                continue
            if phase[j] != backward:
                writes[occurrence[j]] = forced[occurrence[j]] = True  # carried across the phases: saved
            if view[i]:
                continue  # not a reader: the far rule looks through views, as plan_order does
            # how far the first reader is, from the op that computed the view's base
            r = owner[j] if owner[j] != j and occurrence[owner[j]] >= 0 else j
            if not read[r] and not const[r] and computes - ordinal[r] > FAR:
                writes[occurrence[j]] = forced[occurrence[j]] = True  # its first reader is far
            read[r] = True
        inline = [j for j in ins[i] if not primal[j] and occurrence[j] >= 0 and not writes[occurrence[j]]]
        if unrolled[i]:  # lowered before the call that writes an input: its expression inlined
            lazy = [j for j in ins[i] if occurrence[j] >= 0 and for_call[owner[j]] and owner[j] == j
                    and not called[j] and phase[j] == backward and not forced[occurrence[j]]
                    and not realized[occurrence[j]]]
            inline += lazy
            recomputed.update(occurrence[j] for j in lazy)
        if calls[i]:
            for j in ins[i]:
                called[owner[j]] = True
        heavy[i] = heavy_op[i] or any(heavy[j] for j in inline)
        reads[i] = frozenset().union(*(reads[j] for j in inline)) | \
            {owner[j] for j in ins[i] if j not in inline and not const[j]}
        occurrence[i], ordinal[i], read[i], phase[i] = k, computes, False, backward
        called[i] = False
        computes += 1
        if const[i]:
            writes[k] = kept[i]
            continue
        realized[k] = tangent[i] or item[i] or (readers[k] > 1 and (heavy[i] or len(reads[i]) > REALIZE_READS))
        writes[k] = smat[owner[i]] or realized[k]
        if not writes[k]:
            holds[k] = sorted(reads[i])
    # a value found written later (saved, or read far away) holds nothing
    return _Fused(writes, {k: h for k, h in holds.items() if not writes[k]}, frozenset(recomputed))


def _readers(schedule: Schedule, g: Graph) -> list[int]:
    """For each compute statement, how many compute statements read that value before it is
    computed again (the readers of that copy: a recomputation's are in the backward only)."""
    index = g._index
    ins = g.input_indices
    count = [0] * len(schedule.statements)
    current: dict[int, int] = {}  # node -> its latest compute statement
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None or st.op not in ("compute", "reload"):
            continue
        if st.op == "compute":
            for j in set(ins[i]):
                if j in current:
                    count[current[j]] += 1
        current[i] = k
    return count


def _layout_copies(schedule: Schedule, g: Graph) -> dict[int, int]:
    """``{statement: bytes}``: the channels-last copies of graph inputs inductor makes for
    convolutions (``meta["layout_copy"]``, :func:`remat.capture.workspace.layout_copies`),
    made when the step starts and freed after the last statement that reads their input."""
    size = {i: int(n.meta["layout_copy"]) for i, n in enumerate(g.nodes) if n.meta and n.meta.get("layout_copy")}
    if not size:
        return {}
    index = g._index
    ins = g.input_indices
    last: dict[int, int] = {}
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is not None and st.op == "compute":
            for j in ins[i]:
                if j in size:
                    last[j] = k
    ends: dict[int, int] = {}
    for j, k in last.items():
        ends[k] = ends.get(k, 0) + size[j]
    return ends


REORDERING_VIEWS = ("permute", "transpose", "t", "as_strided", "expand", "unfold", "diagonal")
"""Views that read their storage in another order than it was written."""


def _tuple_items(g: Graph) -> list[bool]:
    """Items of a tuple in a storage of their own: buffers their op writes (a convolution
    backward's input gradient; a var_mean's mean and variance are two)."""
    def items(g: Graph) -> list[bool]:
        ins, owner = g.input_indices, storage(g)[0]
        container = [bool(n.meta and n.meta.get("container")) for n in g.nodes]
        return [len(ins[i]) == 1 and container[ins[i][0]] and owner[i] == i for i in range(len(g))]
    return g._derived("tuple_items", items)


def _reordered(g: Graph) -> list[bool]:
    """Views reached from their storage through a reordering view (a transpose): a kernel
    reading one computes other indices than it writes, so inductor never writes its output
    into that storage (``can_inplace`` asks for the same index). A GPT-NeoX backward copies
    its concatenated q/k/v gradient transposed into a new buffer."""
    return g._derived("reordered", _reordering)


def _reordering(g: Graph) -> list[bool]:
    out = [False] * len(g)
    for i, n in enumerate(g.nodes):
        base = n.meta.get("alias_of") if n.meta else None
        if base is not None and base in g:
            out[i] = n.op.split(".")[0] in REORDERING_VIEWS or out[g.index(base)]
    return out


def _dying(schedule: Schedule, index: dict[str, int]) -> list[list[int]]:
    """For each statement, the values the frees right after it (before the next compute)
    release: those a compute there reads last."""
    out: list[list[int]] = [[] for _ in schedule.statements]
    last = -1
    for k, st in enumerate(schedule.statements):
        if st.op == "compute":
            last = k
        elif st.op == "free" and last >= 0 and st.node in index:
            out[last].append(index[st.node])
    return out


def simulate(schedule: Schedule, cost_model: CostModel | None = None, *,
             timeline: bool = True, kernel_groups: bool = True, link: Link | None = None) -> SimResult:
    """Replay ``schedule`` on its graph; see the module docstring for the rules.
    ``kernel_groups=False`` frees values where the schedule says even in a CPU kernel group
    (see below): for a partition inductor compiles in its own order. ``link``: the host link
    offloads and reloads use (:func:`remat.cost.transfer.link_for_graph` by default).

    **Two streams** (seeds/004 Section 6.2, MAGIS's simulator), timed as the lowering runs
    them (:mod:`remat.lower.offload`): computes run one after another on the compute stream,
    each taking its share of the fused prediction (the traffic, FLOPs and kernel launches it
    adds to :meth:`CostModel.seconds`: a view, or a kernel fused into its reader, takes no
    time; on graphs with profiled costs, its cost) and starting once the reloads it reads are
    done; an ``offload`` or ``reload`` runs on the copy stream (on a CPU, on the one stream)
    for ``link.seconds(bytes)``, starting when both streams have reached it in program order
    (PyTorch's copy stream waits for the compute stream), and a reload not before its value's
    offload is done. At an offloaded value's ``free`` compute waits until its copy is done
    (the lowering's ``ao.wait_tensor`` stands there), then its device memory is released; a
    reloaded value takes device memory from the reload's statement (where its buffer is
    allocated) to its next free. The predicted time is the single-stream prediction plus
    ``wait_seconds``: the time compute waited for copies, and copies that ran past compute's
    end."""
    g: Graph = schedule.graph
    cm = cost_model or default_cost_model(g)
    copies = any(st.op in COPIES for st in schedule.statements)
    link = link or (link_for_graph(g, cm) if copies else Link(float("inf")))
    a = g._arrays
    ins = g.input_indices
    owner, sizes = storage(g)
    primal = a.primal.tolist()
    keep = (kept_to_end(g) & ~dropped_outputs(g)).tolist()
    once = never_recomputed(g).tolist()
    resident = list(primal)
    # a storage is held while any value living in it is resident (a view keeps its base)
    refs = [0] * a.n
    for i, p in enumerate(primal):
        if p:
            refs[owner[i]] += 1
    computed = [False] * a.n
    errors: list[str] = []
    constant = constant_bytes(g)
    copy_ends = _layout_copies(schedule, g)
    mem = constant + sum(copy_ends.values())
    peak, peak_at = mem, -1
    tl: list[int] = []
    op_cost = cm.op_costs(g)
    work = cm.workspace(g)  # transient bytes while an op runs
    fusible = a.fusible.tolist()
    raw = a.bytes.tolist()  # traffic moves a view's own bytes; memory counts storages
    forward = a.forward.tolist()
    flops = [n.flops for n in g.nodes]
    mat = materialized(g).tolist()
    compute_cost = 0.0
    traffic_total = 0
    flops_total = 0.0
    kernels = 0
    backward = False  # the phase: the backward starts with the first non-forward compute
    phase = [False] * a.n  # the phase each resident value was computed in
    written = [False] * a.n  # the resident value has been written to memory
    read_by_fused = [0] * a.n  # 1 + phase in which fused kernels have read the value
    n_computes = 0
    index = g._index
    # the two streams: clocks, when each resident value is ready, when its host copy is done
    t_comp = t_copy = busy_copy = busy_compute = 0.0
    profiled = cm.uses_profiled_costs(g)
    # CostModel.seconds, per statement: its FLOPs, traffic and kernels
    peak_flops, bandwidth, launch = cm.device.peak_flops, cm.device.bandwidth, cm.device.launch_seconds
    ready = [0.0] * a.n
    off_end = [-1.0] * a.n  # -1: no host copy
    copying = [False] * a.n  # an offload reads the resident device copy (until it is freed)
    host = host_peak = n_off = n_rel = 0
    times: list[tuple[str, float, float]] = []

    def err(msg: str) -> None:
        if len(errors) < _MAX_ERRORS:
            errors.append(msg)

    def _donor(i: int, k: int) -> tuple[list[int], list[int], int] | None:
        """A storage of ``i``'s size that only inputs of ``i`` dying at statement ``k``
        reference: inputs living in it, or register inputs holding it (inductor computes those
        inside ``i``'s kernel). That kernel reads the storage last and writes into it
        (``inplace_buffers``). Returns (the inputs living in it, the register inputs holding
        it, the storage), or None."""
        direct: dict[int, list[int]] = {}
        via: dict[int, list[int]] = {}
        for r in dying[k]:
            if r not in ins[i] or not resident[r] or reordered[r] or not same_order(r, i) or copying[r]:
                continue
            if counted[r]:
                direct.setdefault(owner[r], []).append(r)
            else:
                for h in held[r]:
                    via.setdefault(h, []).append(r)
        for h in dict.fromkeys([*direct, *via]):
            d, v = direct.get(h, []), via.get(h, [])
            if refs[h] == len(d) + len(v) and sizes[h] == sizes[i] and donor_ok[h]:
                return d, v, h
        return None

    fused = _allocations(schedule, g, owner) if cm.fused_memory else None
    allocates = fused.writes if fused is not None else None
    holding = fused.holds if fused is not None else {}
    again = fused.recomputed if fused is not None else frozenset()
    held: list = [()] * a.n  # storages a value computed inside its readers keeps alive
    counted = [True] * a.n  # the resident value holds a reference to its storage
    # a fused kernel writes its output into an input of the same size it reads last
    # (inductor's inplace_buffers): the output takes that storage over
    dying = _dying(schedule, index) if cm.fused_memory else None
    # never into an input or a tangent, nor into what ATen scattered into (inductor's buffer
    # of a mutating call has a mutation layout, which inductor never reuses: a VGG backward's
    # ReLU gradient took a buffer of its own beside the max-pool gradient it read last, and
    # its plan for the least memory measured 39% above a prediction that wrote it in place),
    # nor into a step output the backward reads (the caller may hold it: an OPT's logits
    # gradient took a buffer beside the logits its caller had dropped)
    into_copy = marked(g, "scatters_into_copy").tolist()
    output = {owner[i] for i in np.flatnonzero(a.is_output).tolist()}  # storages outputs live in
    donor_ok = [not primal[i] and n.role != "tangent" and not into_copy[i] and i not in output
                for i, n in enumerate(g.nodes)]
    reordered = _reordered(g)
    # a kernel writes in place only into what it reads in the order it writes (the same index):
    # never into a value laid out otherwise (``meta["strides"]``, a non-contiguous value), such
    # as an attention backward's gradient of V, whose sum with the cache's gradient GPT-NeoX's
    # least-memory plan wrote into a buffer of its own
    strides = [(n.meta or {}).get("strides") for n in g.nodes]

    def same_order(r: int, i: int) -> bool:
        return strides[r] is None or strides[r] == strides[i]

    # on a CPU, inductor's C++ backend emits consecutive kernels as one function, allocating
    # their outputs before it and freeing what died after it: a storage that dies between
    # kernels stays allocated until the next library call (an extern kernel: a matmul, a
    # convolution) or the phase's end, though a kernel may still write into it in place.
    # GPT-NeoX's plan for 0.8 measured 1.6% above its prediction: a recomputed layer norm's
    # output was allocated beside the logits and their gradient, which the schedule had freed
    grouped = fused is not None and kernel_groups and ((g.meta or {}).get("device") or {}).get("type") == "cpu"
    library = library_calls(g).tolist()
    # a view inductor copies out of a channels-last storage reads it in another order: never in place
    copied_view = marked(g, "copied_view").tolist()
    in_group = False
    pending = 0  # bytes of storages dead in the open group
    dead: set[int] = set()  # those storages

    def drop(o: int) -> None:
        nonlocal mem, pending
        if in_group:
            pending += sizes[o]
            dead.add(o)
        else:
            mem -= sizes[o]

    def flush() -> None:
        nonlocal mem, pending, in_group
        mem -= pending
        pending = 0
        dead.clear()
        in_group = False

    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None:
            err(f"statement {k}: {st} names no node of the graph")
            tl.append(mem)
            continue
        if grouped and st.op in COPIES:
            flush()  # a copy is a call of its own
        if grouped and st.op == "compute" and (library[i] or (not backward and not forward[i])):
            if into_copy[i] and not resident[i] and mem + sizes[owner[i]] > peak:
                # a scatter ATen runs in place into a copy the kernel before it wrote
                peak, peak_at = mem + sizes[owner[i]], k
            flush()  # a library call, or the backward's graph starts
        if st.op == "compute":
            if primal[i]:
                err(f"statement {k}: {st}: inputs and parameters are resident, never computed")
            elif resident[i]:
                err(f"statement {k}: {st}: value already resident (free it before recomputing)")
            elif computed[i] and once[i]:
                err(f"statement {k}: {st}: {g.nodes[i].name!r} may be computed only once "
                    "(a random op would draw fresh randomness; or it is flagged must_save)")
            else:
                missing = [j for j in ins[i] if not resident[j]]
                if missing:
                    why = " (offloaded: reload it first)" if off_end[missing[0]] >= 0 else ""
                    err(f"statement {k}: {st}: input {g.nodes[missing[0]].name!r} is not resident{why}")
                start = max([t_comp] + [ready[j] for j in ins[i]])
                before = (flops_total, traffic_total, kernels)
                resident[i] = True
                computed[i] = True
                copying[i] = False
                o = owner[i]
                counted[i] = allocates is None or allocates[k]
                held[i] = ()
                if not counted[i] and k in holding:
                    held[i] = []
                    for h in holding[k]:
                        if refs[h] > 0:
                            held[i].append(h)
                        elif h in dead:  # died in the open kernel group, not yet freed: kept
                            dead.discard(h)
                            pending -= sizes[h]
                            held[i].append(h)
                    for h in held[i]:
                        refs[h] += 1
                if counted[i]:
                    # never into what a later reader reads again to compute it inside itself
                    taken = _donor(i, k) if dying is not None and o == i and fusible[i] and \
                        not copied_view[i] and k not in again else None
                    refs[o] += 1
                    if taken is not None:  # i writes into the donor's storage: nothing new
                        direct, via, h = taken
                        for r in direct:
                            counted[r] = False
                        for r in via:
                            held[r] = [x for x in held[r] if x != h]
                        refs[h] -= len(direct) + len(via)
                    elif refs[o] == 1:
                        mem += sizes[o]
                n_computes += 1
                compute_cost += op_cost[i]
                backward = backward or not forward[i]
                phase[i] = backward
                written[i] = mat[i]
                read_by_fused[i] = 0
                traffic_total += raw[i] if mat[i] else 0
                for j in ins[i]:
                    crosses = not primal[j] and phase[j] != backward
                    if crosses and not written[j]:  # a value saved for the backward
                        written[j] = True
                        traffic_total += raw[j]
                    if not fusible[i]:
                        traffic_total += raw[j]  # every non-fusible kernel reads its inputs
                    elif (mat[j] or crosses) and read_by_fused[j] != 1 + backward:
                        read_by_fused[j] = 1 + backward  # fused readers share one read per phase
                        traffic_total += raw[j]
                flops_total += flops[i]
                kernels += mat[i]
                # the compute stream's clock: this statement's share of the fused prediction
                # (:meth:`CostModel.seconds` of what it added), or its profiled cost, so a
                # view or a kernel fused into its reader hides no copy
                dt = op_cost[i] if profiled else ((flops_total - before[0]) / peak_flops
                                                  + (traffic_total - before[1]) / bandwidth
                                                  + (kernels - before[2]) * launch)
                t_comp = start + dt
                busy_compute += dt
                ready[i] = t_comp
                if timeline:
                    times.append(("compute", start, t_comp))
                if grouped and not library[i] and counted[i]:
                    in_group = True  # a kernel: until the next flush, frees wait
                if mem + work[i] > peak:
                    peak, peak_at = mem + work[i], k
        elif st.op == "free":
            if primal[i] or keep[i]:
                err(f"statement {k}: {st}: {g.nodes[i].role} values and outputs are kept to the end")
            elif not resident[i]:
                err(f"statement {k}: {st}: value is not resident")
            else:
                resident[i] = False
                o = owner[i]
                if copying[i] and off_end[i] > t_comp:  # the lowering waits for the copy here
                    if timeline:
                        times.append(("wait", t_comp, off_end[i]))
                    t_comp = off_end[i]
                for h in held[i]:
                    refs[h] -= 1
                    if refs[h] == 0:
                        drop(h)
                held[i] = ()
                if counted[i]:
                    refs[o] -= 1
                    if refs[o] == 0:
                        drop(o)
        elif st.op == "offload":
            if primal[i]:
                err(f"statement {k}: {st}: inputs and parameters stay on the device")
            elif not resident[i]:
                err(f"statement {k}: {st}: value is not resident")
            elif owner[i] != i:
                err(f"statement {k}: {st}: a view of {g.nodes[owner[i]].name!r}: offload that instead")
            elif off_end[i] >= 0:
                err(f"statement {k}: {st}: value already has a host copy")
            else:
                start, off_end[i], t_copy, t_comp = _copy(link, sizes[i], max(t_comp, ready[i]), t_copy, t_comp)
                busy_copy += off_end[i] - start
                copying[i] = True
                n_off += 1
                host += sizes[i]
                host_peak = max(host_peak, host)
                if timeline:
                    times.append(("copy", start, off_end[i]))
        elif st.op == "reload":
            if off_end[i] < 0:
                err(f"statement {k}: {st}: value was not offloaded")
            elif resident[i]:
                err(f"statement {k}: {st}: value is already resident")
            else:
                start, ready[i], t_copy, t_comp = _copy(link, sizes[i], max(t_comp, off_end[i]), t_copy, t_comp)
                busy_copy += ready[i] - start
                copying[i] = False  # a new device copy
                n_rel += 1
                resident[i], counted[i], held[i] = True, True, ()
                phase[i], written[i] = backward, True
                refs[owner[i]] += 1
                if refs[owner[i]] == 1:
                    mem += sizes[owner[i]]
                if mem > peak:
                    peak, peak_at = mem, k
                if timeline:
                    times.append(("copy", start, ready[i]))
        else:
            err(f"statement {k}: unknown op {st.op!r}")
        if timeline and len(times) <= k:
            times.append(("", t_comp, t_comp))
        mem -= copy_ends.pop(k, 0)
        if timeline:
            tl.append(mem)
    flush()
    missing_req = np.flatnonzero(required_nodes(g) & ~np.array(computed, dtype=bool)).tolist()
    for i in missing_req[:5]:
        err(f"required node {g.nodes[i].name!r} is never computed")
    n_unique = sum(computed)
    wait = max(t_comp, t_copy) - busy_compute if copies else 0.0
    return SimResult(
        valid=not errors, errors=errors, peak_bytes=int(peak), peak_statement=peak_at,
        timeline=tl, constant_bytes=constant, end_bytes=int(mem),
        compute_cost=compute_cost, traffic_bytes=int(traffic_total),
        predicted_seconds=cm.seconds(compute_cost, traffic_total, flops_total, kernels, g) + wait,
        computes=n_computes, recomputes=n_computes - n_unique, offloads=n_off, reloads=n_rel,
        copy_seconds=busy_copy, wait_seconds=wait, host_peak_bytes=host_peak, times=times,
    )


def _copy(link: Link, nbytes: int, earliest: float, t_copy: float, t_comp: float):
    """One copy that may start at ``earliest``: (its start, its end, the copy clock, the
    compute clock) after it. An asynchronous link's copy waits for the copy stream; a
    synchronous one runs on the compute stream."""
    if link.asynchronous:
        start = max(earliest, t_copy)
        return start, start + link.seconds(nbytes), start + link.seconds(nbytes), t_comp
    start = max(earliest, t_comp)
    return start, start + link.seconds(nbytes), t_copy, start + link.seconds(nbytes)
