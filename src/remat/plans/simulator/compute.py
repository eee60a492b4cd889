"""``compute v``: check that it may run, allocate its value (or keep it in registers, or write
it into an input's storage), count its traffic, FLOPs and kernels, and advance the compute
stream."""

from __future__ import annotations

from ..schedule import Statement
from .inplace import donor
from .state import Replay
from .streams import compute_seconds


def compute(r: Replay, k: int, st: Statement, i: int) -> None:
    if r.grouped and (r.library[i] or (not r.backward and not r.forward[i])):
        if r.into_copy[i] and not r.resident[i]:  # a scatter ATen runs in place into a copy
            r.reach(r.mem + r.sizes[r.owner[i]], k)  # the kernel before it wrote
        r.flush()  # a library call, or the backward's graph starts
    if r.primal[i]:
        r.err(f"statement {k}: {st}: inputs and parameters are resident, never computed")
    elif r.resident[i]:
        r.err(f"statement {k}: {st}: value already resident (free it before recomputing)")
    elif r.computed[i] and r.once[i]:
        r.err(f"statement {k}: {st}: {r.g.nodes[i].name!r} may be computed only once "
              "(a random op would draw fresh randomness; or it is flagged must_save)")
    else:
        missing = [j for j in r.ins[i] if not r.resident[j]]
        if missing:
            why = " (offloaded: reload it first)" if r.off_end[missing[0]] >= 0 else ""
            r.err(f"statement {k}: {st}: input {r.g.nodes[missing[0]].name!r} is not resident{why}")
        run(r, k, i)


def run(r: Replay, k: int, i: int) -> None:
    """Compute ``i`` at statement ``k`` (whether or not its inputs were resident)."""
    start = max([r.t_comp] + [r.ready[j] for j in r.ins[i]])
    before = (r.arith_total, r.traffic_total, r.kernels)
    r.resident[i] = True
    r.computed[i] = True
    r.copying[i] = False
    allocate(r, k, i)
    hold_items(r, i)
    r.n_computes += 1
    r.compute_cost += r.op_cost[i]
    r.backward = r.backward or not r.forward[i]
    r.phase[i] = r.backward
    count_traffic(r, i)
    r.arith_total += r.arith[i]
    r.kernels += r.mat[i]
    dt = compute_seconds(r, i, before)
    r.t_comp = start + dt
    r.busy_compute += dt
    r.ready[i] = r.t_comp
    if r.timeline:
        r.times.append(("compute", start, r.t_comp))
    if r.grouped and not r.library[i] and r.counted[i]:
        r.in_group = True  # a kernel: until the next flush, frees wait
    r.reach(r.mem + r.work[i], k)


def allocate(r: Replay, k: int, i: int) -> None:
    """The memory ``i``'s compute takes: its storage (unless an input's storage takes it in
    place), or, kept in registers, the storages its expression reads."""
    o = r.owner[i]
    r.counted[i] = counted = r.allocates is None or r.allocates[k]
    r.held[i] = ()
    if not counted and k in r.holding:
        held = r.held[i] = []
        for h in r.holding[k]:
            if r.refs[h] > 0:
                held.append(h)
            elif h in r.dead:  # died in the open kernel group, not yet freed: kept
                r.dead.discard(h)
                r.pending -= r.sizes[h]
                held.append(h)
        for h in held:
            r.refs[h] += 1
    if counted:
        # never into what a later reader reads again to compute it inside itself
        taken = donor(r, i, k) if r.dying is not None and o == i and r.fusible[i] and \
            not r.copied_view[i] and k not in r.again else None
        r.refs[o] += 1
        if taken is not None:  # i writes into the donor's storage: nothing new
            direct, via, h = taken
            for d in direct:
                r.counted[d] = False
            for d in via:
                r.held[d] = [x for x in r.held[d] if x != h]
            r.refs[h] -= len(direct) + len(via)
        elif r.refs[o] == 1:
            r.mem += r.sizes[o]


def hold_items(r: Replay, i: int) -> None:
    """A tuple's op allocates all its items when it runs (:mod:`.tuples`): the tuple holds
    their storages until it is freed (the eager compiler) or, under a fusing compiler
    (inductor extracts them at once), until each item's getitem runs and takes it over."""
    if r.items[i]:
        held = [r.owner[j] for j in r.items[i]]
        for o in held:
            r.take(o)
        r.tuple_held[i] = held
    elif r.cm.fused_memory and r.counted[i] and len(r.ins[i]) == 1:
        c = r.ins[i][0]
        o = r.owner[i]
        if o in r.tuple_held[c]:  # the getitem takes its item over from the tuple
            r.tuple_held[c] = [h for h in r.tuple_held[c] if h != o]
            r.release(o)


def count_traffic(r: Replay, i: int) -> None:
    """The bytes ``i``'s kernel moves: its output when materialized, a saved value the first
    time the backward reads it, every input of a non-fusible kernel, and the inputs fused
    kernels read from memory once per phase."""
    raw, mat, primal, phase, written, read_by_fused = r.raw, r.mat, r.primal, r.phase, r.written, r.read_by_fused
    backward = r.backward
    written[i] = mat[i]
    read_by_fused[i] = 0
    traffic = raw[i] if mat[i] else 0
    fusible = r.fusible[i]
    for j in r.ins[i]:
        crosses = not primal[j] and phase[j] != backward
        if crosses and not written[j]:  # a value saved for the backward
            written[j] = True
            traffic += raw[j]
        if not fusible:
            traffic += raw[j]  # every non-fusible kernel reads its inputs
        elif (mat[j] or crosses) and read_by_fused[j] != 1 + backward:
            read_by_fused[j] = 1 + backward  # fused readers share one read per phase
            traffic += raw[j]
    r.traffic_total += traffic
