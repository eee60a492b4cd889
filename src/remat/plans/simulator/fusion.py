"""Fused kernels (``CostModel.fused_memory``): which computes write their value to memory.

Under a fusing compiler a value fused kernels keep in registers takes no memory but keeps the
storages its expression reads alive while it is resident; :func:`allocations` decides, for a
whole schedule, which computes write (and what the others hold). The in-place rules that use
it are in :mod:`.inplace`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cost.model import (library_calls, library_read, marked, memory_materialized, profile_for_graph,
                          storage_arrays)
from ...graph.graph import Graph
from ..schedule import Schedule

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


def allocations(schedule: Schedule, g: Graph, owner: list[int]) -> _Fused:
    """Under a fusing compiler (``CostModel.fused_memory``), which computes allocate memory.

    A value is written to memory when its storage is materialized
    (:func:`remat.cost.model.memory_materialized`: a kernel writes it), when the schedule
    carries it from one phase into the other (a saved value), or when its first reader comes
    more than :data:`FAR` computes later. Otherwise a fusible value lives in registers:
    inductor computes it inside each kernel that reads it, so it takes no memory but keeps the
    storages its expression reads alive while it is resident (``holds``); a kernel that reads
    such a storage last through it may write into it (:mod:`.inplace`, :mod:`.memory`).

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
    such a hold keeps a storage that died in the open kernel group (:mod:`.inplace`, :mod:`.memory`).

    With these rules, in-place writes and the CPU's kernel groups (:mod:`.inplace`, :mod:`.memory`),
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
    item = tuple_items(g)
    view = a.view.tolist()
    readers_ = readers(schedule, g)
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
        realized[k] = tangent[i] or item[i] or (readers_[k] > 1 and (heavy[i] or len(reads[i]) > REALIZE_READS))
        writes[k] = smat[owner[i]] or realized[k]
        if not writes[k]:
            holds[k] = sorted(reads[i])
    # a value found written later (saved, or read far away) holds nothing
    return _Fused(writes, {k: h for k, h in holds.items() if not writes[k]}, frozenset(recomputed))


def readers(schedule: Schedule, g: Graph) -> list[int]:
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


def tuple_items(g: Graph) -> list[bool]:
    """Items of a tuple in a storage of their own: buffers their op writes (a convolution
    backward's input gradient; a var_mean's mean and variance are two)."""
    return g._derived("tuple_items", lambda g: tuple_item_array(g).tolist())


def tuple_item_array(g: Graph) -> np.ndarray:
    """:func:`tuple_items` as a bool array (read-only): a node with one input, a tuple
    (``meta["container"]``), in a storage of its own."""
    def items(g: Graph) -> np.ndarray:
        a = g._arrays
        owner = storage_arrays(g)[0]
        container = marked(g, "container")
        one = np.flatnonzero(np.diff(a.in_ptr) == 1)
        out = np.zeros(a.n, dtype=bool)
        out[one] = container[a.in_idx[a.in_ptr[one]]] & (owner[one] == one)
        return out
    return g._derived("tuple_item_array", items)
