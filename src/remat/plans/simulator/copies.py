"""``offload v`` and ``reload v``: copies to and from host memory on the copy stream.

An offload copies a resident value to the host; its device memory is released by the next
``free v``, once the copy is done. A reload copies it back into a fresh buffer, which takes
device memory from the reload's statement to the value's next free, and is ready when the copy
is done (not before the offload is)."""

from __future__ import annotations

from ..schedule import Statement
from .state import Replay
from .streams import copy


def offload(r: Replay, k: int, st: Statement, i: int) -> None:
    if r.grouped:
        r.flush()  # a copy is a call of its own
    if r.primal[i]:
        r.err(f"statement {k}: {st}: inputs and parameters stay on the device")
    elif not r.resident[i]:
        r.err(f"statement {k}: {st}: value is not resident")
    elif r.owner[i] != i:
        r.err(f"statement {k}: {st}: a view of {r.g.nodes[r.owner[i]].name!r}: offload that instead")
    elif r.off_end[i] >= 0:
        r.err(f"statement {k}: {st}: value already has a host copy")
    else:
        start, r.off_end[i], r.t_copy, r.t_comp = copy(r.link, r.sizes[i], max(r.t_comp, r.ready[i]),
                                                       r.t_copy, r.t_comp)
        r.busy_copy += r.off_end[i] - start
        r.copying[i] = True
        r.n_off += 1
        r.host += r.sizes[i]
        r.host_peak = max(r.host_peak, r.host)
        if r.timeline:
            r.times.append(("copy", start, r.off_end[i]))


def reload(r: Replay, k: int, st: Statement, i: int) -> None:
    if r.grouped:
        r.flush()  # a copy is a call of its own
    if r.off_end[i] < 0:
        r.err(f"statement {k}: {st}: value was not offloaded")
    elif r.resident[i]:
        r.err(f"statement {k}: {st}: value is already resident")
    else:
        start, r.ready[i], r.t_copy, r.t_comp = copy(r.link, r.sizes[i], max(r.t_comp, r.off_end[i]),
                                                     r.t_copy, r.t_comp)
        r.busy_copy += r.ready[i] - start
        r.copying[i] = False  # a new device copy
        r.n_rel += 1
        r.resident[i], r.counted[i], r.held[i] = True, True, ()
        r.phase[i], r.written[i] = r.backward, True
        r.take(r.owner[i])
        r.reach(r.mem, k)
        if r.timeline:
            r.times.append(("copy", start, r.ready[i]))
