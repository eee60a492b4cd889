"""In-place writes under a fusing compiler: a kernel that reads an input for the last time
writes its output into that input's storage when both have the same size (inductor's
``inplace_buffers``): the two are not allocated together.

A forward value the backward computes does so too, into a saved value (AOTAutograd donates the
saved tensors to the backward). Never into an input or a tangent, nor into what ATen scattered
into (inductor's buffer of a mutating call has a mutation layout, which inductor never reuses:
a VGG backward's ReLU gradient took a buffer of its own beside the max-pool gradient it read
last, and its plan for the least memory measured 39% above a prediction that wrote it in
place), nor into a step output the backward reads (the caller may hold it: an OPT's logits
gradient took a buffer beside the logits its caller had dropped), nor into what a later reader
reads again to compute the value inside itself (:func:`.fusion.allocations`).
"""

from __future__ import annotations

import numpy as np

from ...cost.model import marked
from ...graph.graph import Graph
from ..schedule import Schedule

REORDERING_VIEWS = ("permute", "transpose", "t", "as_strided", "expand", "unfold", "diagonal")
"""Views that read their storage in another order than it was written."""


def donor_ok(g: Graph, owner: list[int], primal: list[bool]) -> list[bool]:
    """The storages a kernel may write into: not an input's or a tangent's, not what ATen
    scattered into, not a step output's."""
    into_copy = marked(g, "scatters_into_copy").tolist()
    output = {owner[i] for i in np.flatnonzero(g._arrays.is_output).tolist()}  # storages outputs live in
    return [not primal[i] and n.role != "tangent" and not into_copy[i] and i not in output
            for i, n in enumerate(g.nodes)]


def reordered(g: Graph) -> list[bool]:
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


def dying(schedule: Schedule, index: dict[str, int]) -> list[list[int]]:
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


def donor(r, i: int, k: int) -> tuple[list[int], list[int], int] | None:
    """A storage of ``i``'s size that only inputs of ``i`` dying at statement ``k``
    reference: inputs living in it, or register inputs holding it (inductor computes those
    inside ``i``'s kernel). That kernel reads the storage last and writes into it
    (``inplace_buffers``). Returns (the inputs living in it, the register inputs holding
    it, the storage), or None. ``r``: the :class:`~.state.Replay`.

    A kernel writes in place only into what it reads in the order it writes (the same index):
    never into a value laid out otherwise (``meta["strides"]``, a non-contiguous value), such
    as an attention backward's gradient of V, whose sum with the cache's gradient GPT-NeoX's
    least-memory plan wrote into a buffer of its own."""
    ins_i = r.ins[i]
    direct: dict[int, list[int]] = {}
    via: dict[int, list[int]] = {}
    strides = r.strides
    for d in r.dying[k]:
        if d not in ins_i or not r.resident[d] or r.reordered[d] or r.copying[d] \
                or not (strides[d] is None or strides[d] == strides[i]):
            continue
        if r.counted[d]:
            direct.setdefault(r.owner[d], []).append(d)
        else:
            for h in r.held[d]:
                via.setdefault(h, []).append(d)
    for h in dict.fromkeys([*direct, *via]):
        dd, v = direct.get(h, []), via.get(h, [])
        if r.refs[h] == len(dd) + len(v) and r.sizes[h] == r.sizes[i] and r.donor_ok[h]:
            return dd, v, h
    return None
