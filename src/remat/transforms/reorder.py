"""Re-ordering a schedule's computes for a lower peak (MAGIS's scheduler, after Serenity).

:func:`reorder` is a Schedule -> Schedule pass. It changes only the order of the ``compute``
statements, then puts each ``free`` where the new order lets it go, and keeps the result only
when the simulator (:func:`remat.plans.simulator.simulate`) finds it valid with a lower peak.

The search (seeds/004 Section 6.1, MAGIS, ASPLOS'24; its dynamic programme is Serenity's, Ahn et
al., MLSys'20):

* The schedule is cut into *segments* the pass never moves a compute across: the forward and
  the backward (the cut is the backward's first compute, :func:`remat.plans.phases.split_schedule`;
  that compute and every tangent stay where they are), and the runs
  between ``offload``/``reload`` statements (copies stay where they are).
* In a segment, the compute statements are *instances* (a node computed twice is two). An
  instance reads the latest earlier instance of each input; it stays after those instances, a
  later instance of the same node stays after every reader of the earlier one, and random ops
  and ``must_save`` nodes keep their relative order. These are the edges of the segment's DAG.
* The narrow waist of an instance is ``nw(v) = |V| - |anc(v)| - |des(v)| - 1``, the number of
  instances independent of it. The segment's order is cut after each instance with
  ``nw(v) <= 1`` (MAGIS's GraphPartition: at ``nw(v) = 0`` everything before is an ancestor
  and everything after a descendant, so the parts are independent problems). Consecutive
  parts are then merged while they hold at most ``block`` instances in all, so that the one
  instance independent of a waist with ``nw(v) = 1`` can still move across it.
* Each part of at most ``block`` instances is scheduled by Serenity's bitmask dynamic programme:
  a state is the set of instances scheduled, a transition adds a ready one, the value is the
  least peak reaching that set (the memory after a set does not depend on its order). A level
  holding more than :data:`MAX_STATES` sets keeps the best ones by (peak, memory): beyond that
  the search is a beam, not exact. A larger part is first scheduled greedily (the ready
  instance leaving the least memory, ties to the original position) if that lowers its peak;
  then windows of ``block`` consecutive instances around its peak are scheduled again by the
  programme, while one lowers the peak. A part's order is replaced only when the model's
  peak falls; parts are independent (the memory after a part does not depend on its order).
* The search's memory model is its own and simple: a compute allocates its node's storage
  (:func:`remat.cost.model.storage`: a view nothing) plus its workspace while it runs, and a
  value is freed once its last reader in its segment has run.

Frees are then derived again: each value freed in a segment is freed right after its last
reader there in the new order (a value read by nothing there: at the segment's start, or
right after its compute). Values the schedule never frees stay unfreed, a free stays in its
segment, and a free the schedule put at a segment's end, after the last compute and later
than the value's last reader there (an output held to the forward's end), stays at the end.

Acceptance: the simulator under ``cost_model`` (default: the graph's) is the only judge. The
new schedule is returned only if it is valid and its peak is below the original's; otherwise,
each changed segment is tried alone, kept when the schedule stays valid and its peak does not
rise; if the peak did not fall, the original schedule is returned unchanged (the same object).
The search's model ignores a fusing compiler's rules (values in registers, in-place writes,
CPU kernel groups), so the simulator may refuse what the search liked.

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.schedule import schedule_from_saved_set
>>> s = schedule_from_saved_set(cos_cos_graph(), ["add_2"])
>>> reorder(s) is s  # a chain: every order is the same order
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..cost.model import CostModel, default_cost_model, storage
from ..graph.graph import Graph
from ..plans.schedule import COPIES, Schedule, Statement, never_recomputed
from ..plans.simulator import simulate

MAX_STATES = 256
"""Sets one level of the dynamic programme keeps (the best by peak, then memory)."""

_NO_NODE = -1


@dataclass
class _Segment:
    """A run of compute and free statements the pass reorders (statement indices ``lo:hi``)."""

    lo: int
    hi: int
    computes: list[int]  # statement indices, original order
    frees: list[int]  # statement indices, original order


def reorder(schedule: Schedule, cost_model: CostModel | None = None, *, block: int = 20,
            time_limit: float | None = None) -> Schedule:
    """Re-order ``schedule``'s computes for a lower simulated peak (see the module docstring).

    ``block``: the largest part the dynamic programme schedules exactly; ``time_limit``:
    seconds for the search, after which the parts not reached keep their order. Returns a new
    Schedule whose ``meta`` adds ``{"reordered": True, "peak_before": ..., "peak_after": ...}``
    (the simulator's peaks under ``cost_model``), or ``schedule`` itself when re-ordering did
    not lower the peak or the schedule is not valid.
    """
    g: Graph = schedule.graph
    cm = cost_model or default_cost_model(g)
    deadline = None if time_limit is None else time.perf_counter() + float(time_limit)
    before = simulate(schedule, cm, timeline=False)
    if not before.valid:
        return schedule
    segments, orders = search(schedule, cm, block=block, deadline=deadline)
    changed = [k for k, seg in enumerate(segments) if orders[k] != list(range(len(seg.computes)))]
    if not changed:
        return schedule
    new = apply_orders(schedule, segments, orders, changed)
    sim = simulate(Schedule(g, new), cm, timeline=False)
    best, peak = schedule.statements, before.peak_bytes
    if sim.valid and sim.peak_bytes < peak:
        best, peak = new, sim.peak_bytes
    elif len(changed) > 1:
        taken: list[int] = []
        for k in changed:  # one segment at a time, kept while the peak does not rise
            if deadline is not None and time.perf_counter() > deadline:
                break
            trial = apply_orders(schedule, segments, orders, taken + [k])
            sim = simulate(Schedule(g, trial), cm, timeline=False)
            if sim.valid and sim.peak_bytes <= peak:
                best, peak = trial, sim.peak_bytes
                taken.append(k)
    if peak >= before.peak_bytes:
        return schedule
    meta = {**schedule.meta, "reordered": True, "peak_before": int(before.peak_bytes),
            "peak_after": int(peak)}
    return Schedule(g, list(best), meta)


def segments_of(schedule: Schedule) -> list[_Segment]:
    """The runs of statements the pass reorders inside: cut at copy statements, at the
    backward's start (its first compute) and at every tangent (they stay put)."""
    g = schedule.graph
    stmts = schedule.statements
    role = {n.name: n.role for n in g.nodes}
    cut = next((k for k, s in enumerate(stmts)
                if s.op == "compute" and role.get(s.node) in ("tangent", "backward")), len(stmts))
    # a tangent never moves: nor those computed right after the cut, nor one after a free
    # between them (an unused tangent freed at once)
    fixed = [s.op in COPIES or s.op == "compute" and role.get(s.node) == "tangent" for s in stmts]
    if cut < len(stmts):
        fixed[cut] = True
    out: list[_Segment] = []
    lo = 0
    for k in range(len(stmts) + 1):
        if k == len(stmts) or fixed[k]:
            if k > lo:
                comp = [j for j in range(lo, k) if stmts[j].op == "compute"]
                frees = [j for j in range(lo, k) if stmts[j].op == "free"]
                out.append(_Segment(lo, k, comp, frees))
            lo = k + 1
    return out


def _values(schedule: Schedule):
    """Which value each statement reads, makes and frees: a value is one compute (or reload)
    of a node, or a node resident from the start. Returns ``(reads, made, freed, node_of,
    prev)``: per compute statement the values it reads and the value it makes, per free
    statement the value it frees, per value its node, and per compute statement the value of
    its node before it (None if none)."""
    g = schedule.graph
    index = g._index
    ins = g.input_indices
    current: dict[int, int] = {}
    node_of: list[int] = []
    reads: dict[int, list[int]] = {}
    made: dict[int, int] = {}
    freed: dict[int, int] = {}
    prev: dict[int, int | None] = {}

    def value(i: int) -> int:
        v = current.get(i)
        if v is None:
            v = current[i] = len(node_of)
            node_of.append(i)
        return v

    for k, st in enumerate(schedule.statements):
        i = index.get(st.node, _NO_NODE)
        if i == _NO_NODE:
            continue
        if st.op == "compute":
            reads[k] = [value(j) for j in ins[i]]
            prev[k] = current.get(i)
            v = current[i] = len(node_of)
            node_of.append(i)
            made[k] = v
        elif st.op == "reload":
            current[i] = len(node_of)
            node_of.append(i)
        elif st.op == "free":
            freed[k] = value(i)
    return reads, made, freed, node_of, prev


def search(schedule: Schedule, cost_model: CostModel | None = None, *, block: int = 20,
           deadline: float | None = None) -> tuple[list[_Segment], list[list[int]]]:
    """The segments and, for each, the new order of its computes (positions in
    ``segment.computes``), by the search's own memory model; the simulator is not run."""
    g = schedule.graph
    cm = cost_model or default_cost_model(g)
    owner, sizes = storage(g)
    work = cm.workspace(g)
    once = never_recomputed(g).tolist()
    reads, made, freed, node_of, prev = _values(schedule)
    size_v = [sizes[i] if owner[i] == i else 0 for i in node_of]
    segments = segments_of(schedule)
    orders = []
    for seg in segments:
        if deadline is not None and time.perf_counter() > deadline:
            orders.append(list(range(len(seg.computes))))
            continue
        orders.append(_order_segment(seg, reads, made, freed, node_of, prev, size_v, work, once,
                                     max(1, int(block)), deadline))
    return segments, orders


def _releases(seg: _Segment, reads, made, freed):
    """Per value freed in the segment: the positions of its readers and maker there (``R``),
    and whether its free stays at the segment's end."""
    members: dict[int, list[int]] = {}
    for p, k in enumerate(seg.computes):
        for v in reads[k]:
            members.setdefault(v, []).append(p)
        members.setdefault(made[k], []).append(p)
    last = seg.computes[-1] if seg.computes else -1
    out = {}
    for f in seg.frees:
        v = freed.get(f)
        if v is None:
            continue
        r = sorted(set(members.get(v, ())))
        trailing = f > last and (not r or seg.computes[r[-1]] != last)
        out[f] = (v, r, trailing)
    return out


def _order_segment(seg, reads, made, freed, node_of, prev, size_v, work, once, block,
                   deadline) -> list[int]:
    m = len(seg.computes)
    ident = list(range(m))
    if m <= 1:
        return ident
    comp = seg.computes
    rel = _releases(seg, reads, made, freed)
    # the DAG: data edges, a node's next instance after the readers of its last one, and
    # random / must_save instances in their order
    maker = {made[k]: p for p, k in enumerate(comp)}
    preds: list[set[int]] = [set() for _ in range(m)]
    readers_of: dict[int, list[int]] = {}
    chain_prev = -1
    for p, k in enumerate(comp):
        for v in reads[k]:
            if v in maker:
                preds[p].add(maker[v])
            readers_of.setdefault(v, []).append(p)
        i = node_of[made[k]]
        old = prev[k]
        if old is not None:  # the node's earlier value: made and read before this instance
            if old in maker:
                preds[p].add(maker[old])
            preds[p].update(readers_of.get(old, ()))
        if once[i]:
            if chain_prev >= 0:
                preds[p].add(chain_prev)
            chain_prev = p
        preds[p].discard(p)
    pred_mask = [0] * m
    for p in range(m):
        mk = 0
        for q in preds[p]:
            mk |= 1 << q
        pred_mask[p] = mk
    # narrow waists: instances independent of v, by ancestor and descendant bitsets
    anc = [0] * m
    for p in range(m):
        a = 0
        for q in preds[p]:
            a |= anc[q] | (1 << q)
        anc[p] = a
    succs: list[list[int]] = [[] for _ in range(m)]
    for p in range(m):
        for q in preds[p]:
            succs[q].append(p)
    des = [0] * m
    for p in range(m - 1, -1, -1):
        d = 0
        for q in succs[p]:
            d |= des[q] | (1 << q)
        des[p] = d
    cuts = [p for p in range(m) if m - anc[p].bit_count() - des[p].bit_count() - 1 <= 1]
    # release sets: each value freed in the segment (not held to its end) goes when all of R
    # have run
    rmask: dict[int, int] = {}
    for f, (v, r, trailing) in rel.items():
        if trailing or not r:
            continue
        mk = 0
        for q in r:
            mk |= 1 << q
        rmask[v] = mk
    touched: list[list[int]] = []
    for p, k in enumerate(comp):
        t = [v for v in dict.fromkeys([*reads[k], made[k]]) if v in rmask]
        touched.append(t)
    csize = [size_v[made[k]] for k in comp]
    cwork = [work[node_of[made[k]]] for k in comp]
    model = _Model(pred_mask, touched, rmask, csize, cwork, size_v)

    order: list[int] = []
    lo = 0
    bounds = []
    for c in cuts:
        bounds.append((lo, c + 1))
        lo = c + 1
    if lo < m:
        bounds.append((lo, m))
    # consecutive parts of at most ``block`` instances in all are merged: the one instance
    # independent of a waist with nw = 1 may then move across it
    merged: list[tuple[int, int]] = []
    for s, e in bounds:
        if merged and e - merged[-1][0] <= block:
            merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    bounds = merged
    for s, e in bounds:
        part = list(range(s, e))
        if e - s <= 1 or (deadline is not None and time.perf_counter() > deadline):
            order += part
            continue
        prefix = (1 << s) - 1  # every part before this one has run
        if e - s <= block:
            cand = model.dp(part, prefix, deadline)
            if cand is not None and model.peak(cand, prefix) < model.peak(part, prefix):
                part = cand
        else:
            greedy = model.greedy(part, prefix)
            if model.peak(greedy, prefix) < model.peak(part, prefix):
                part = greedy
            part = model.windows(part, prefix, block, deadline)
        order += part
    return order


class _Model:
    """The search's memory model over one segment's instances (positions ``0..m-1`` in the
    original order). A *part* is a list of positions scheduled after the set ``prefix``
    (a bitmask of positions) has run; every predecessor of the part is in it or in ``prefix``."""

    def __init__(self, pred_mask, touched, rmask, csize, cwork, size_v):
        self.pred_mask = pred_mask
        self.touched = touched
        self.rmask = rmask
        self.csize = csize
        self.cwork = cwork
        self.size_v = size_v

    def _local(self, part: list[int], prefix: int):
        """Per instance of ``part`` (local index ``j``): its predecessors in the part (a mask
        over local indices) and the values it may release in the part, each as (release mask
        over local indices, bytes): those whose readers and maker outside the part ran in
        ``prefix``."""
        local = {p: j for j, p in enumerate(part)}
        wmask = 0
        for p in part:
            wmask |= 1 << p
        outside = ~(prefix | wmask)

        def to_local(mk: int) -> int:
            out = 0
            while mk:
                low = mk & -mk
                out |= 1 << local[low.bit_length() - 1]
                mk ^= low
            return out

        preds = [to_local(self.pred_mask[p] & wmask) for p in part]
        rel = []
        for p in part:
            r = []
            for v in self.touched[p]:
                mk = self.rmask[v]
                if mk & outside == 0:
                    r.append((to_local(mk & wmask), self.size_v[v]))
            rel.append(r)
        return preds, rel

    def peak(self, part: list[int], prefix: int) -> int:
        """Peak of running ``part`` in its order, above the memory after ``prefix``."""
        return max(self.profile(part, prefix), default=0)

    def dp(self, part: list[int], prefix: int, deadline: float | None) -> list[int] | None:
        """Serenity's dynamic programme over the sets of scheduled instances of ``part``
        (a beam of :data:`MAX_STATES` sets per level when there are more); None past the
        deadline."""
        n = len(part)
        preds, rel = self._local(part, prefix)
        items = [(1 << q, q, preds[q], self.csize[p], self.csize[p] + self.cwork[p], rel[q])
                 for q, p in enumerate(part)]
        level: dict[int, tuple[int, int]] = {0: (0, 0)}
        back: list[dict[int, tuple[int, int]]] = []
        for _ in range(n):
            if deadline is not None and time.perf_counter() > deadline:
                return None
            nxt: dict[int, tuple[int, int]] = {}
            parent: dict[int, tuple[int, int]] = {}
            get = nxt.get
            for S, (pk, mem) in level.items():
                for bit, q, pm, cs, top, rl in items:
                    if S & bit or pm & ~S:
                        continue
                    T = S | bit
                    p2 = mem + top
                    if p2 < pk:
                        p2 = pk
                    old = get(T)
                    if old is not None and old[0] <= p2:
                        continue
                    m2 = mem + cs
                    for mk, b in rl:
                        if mk & ~T == 0:
                            m2 -= b
                    nxt[T] = (p2, m2)
                    parent[T] = (S, q)
            if len(nxt) > MAX_STATES:
                keep = sorted(nxt, key=nxt.__getitem__)[:MAX_STATES]
                nxt = {T: nxt[T] for T in keep}
            back.append(parent)
            level = nxt
        T = (1 << n) - 1
        if T not in level:
            return None
        out = []
        for parent in reversed(back):
            S, q = parent[T]
            out.append(part[q])
            T = S
        out.reverse()
        return out

    def greedy(self, part: list[int], prefix: int) -> list[int]:
        """The ready instance leaving the least memory after it, ties to the original order."""
        n = len(part)
        preds, rel = self._local(part, prefix)
        remaining = [p.bit_count() for p in preds]
        succs: list[list[int]] = [[] for _ in range(n)]
        for q in range(n):
            mk = preds[q]
            while mk:
                low = mk & -mk
                succs[low.bit_length() - 1].append(q)
                mk ^= low
        ready = {q for q in range(n) if remaining[q] == 0}
        done = 0
        out = []
        while ready:
            best = None
            for q in ready:
                T = done | (1 << q)
                after = self.csize[part[q]] - sum(b for mk, b in rel[q] if mk & ~T == 0)
                key = (after, q)
                if best is None or key < best:
                    best = key
            q = best[1]
            ready.discard(q)
            done |= 1 << q
            out.append(part[q])
            for u in succs[q]:
                remaining[u] -= 1
                if remaining[u] == 0:
                    ready.add(u)
        return out

    def profile(self, order: list[int], prefix: int) -> list[int]:
        """Per instance of ``order``: memory while it runs, above the memory after ``prefix``."""
        wmask = 0
        for p in order:
            wmask |= 1 << p
        outside = ~(prefix | wmask)
        remaining: dict[int, int] = {}
        for p in order:
            for v in self.touched[p]:
                if v not in remaining:
                    mk = self.rmask[v]
                    remaining[v] = (mk & wmask).bit_count() if mk & outside == 0 else -1
        mem = 0
        out = []
        for p in order:
            mem += self.csize[p]
            out.append(mem + self.cwork[p])
            for v in self.touched[p]:
                remaining[v] -= 1
                if remaining[v] == 0:
                    mem -= self.size_v[v]
        return out

    def windows(self, order: list[int], prefix: int, block: int,
                deadline: float | None) -> list[int]:
        """Windows of ``block`` consecutive instances of ``order`` around its peak, each
        re-scheduled by :meth:`dp` after what precedes it: a window whose own peak falls
        replaces its instances, and the search moves to the new peak; it ends when no window
        around the first instance at the peak lowers it. No window's peak rises, so neither
        does the part's."""
        order = list(order)
        n = len(order)
        tried: set[tuple[int, tuple[int, ...]]] = set()
        while True:
            if deadline is not None and time.perf_counter() > deadline:
                return order
            prof = self.profile(order, prefix)
            top = max(prof)
            t = prof.index(top)
            starts = sorted({min(max(0, t - block + 1 + (block - 1) * i // 4), max(0, n - block))
                             for i in range(5)})
            progress = False
            for w in starts:
                win = order[w:w + block]
                key = (w, tuple(win))
                if len(win) < 2 or key in tried:
                    continue
                tried.add(key)
                done = prefix
                for p in order[:w]:
                    done |= 1 << p
                cand = self.dp(win, done, deadline)
                if cand is not None and self.peak(cand, done) < self.peak(win, done):
                    order[w:w + block] = cand
                    progress = True
                    break
            if not progress:
                return order


def apply_orders(schedule: Schedule, segments: list[_Segment], orders: list[list[int]],
           which: list[int]) -> list[Statement]:
    """The statements with segments ``which`` in their new order, frees derived again."""
    stmts = list(schedule.statements)
    reads, made, freed, node_of, prev = _values(schedule)
    out: list[Statement] = []
    at = 0
    for k, seg in enumerate(segments):
        if k not in which:
            continue
        out += stmts[at:seg.lo]
        at = seg.hi
        out += _emit_segment(stmts, seg, orders[k], reads, made, freed)
    out += stmts[at:]
    return out


def _emit_segment(stmts, seg, order, reads, made, freed) -> list[Statement]:
    rel = _releases(seg, reads, made, freed)
    newpos = {p: j for j, p in enumerate(order)}
    start: list[int] = []
    end: list[int] = []
    after: dict[int, list[int]] = {}
    for f in seg.frees:
        if f not in rel:
            start.append(f)  # names no node: the simulator refused the schedule already
            continue
        v, r, trailing = rel[f]
        if trailing:
            end.append(f)
        elif not r:
            start.append(f)
        else:
            after.setdefault(max(newpos[p] for p in r), []).append(f)
    out = [stmts[f] for f in start]
    for j, p in enumerate(order):
        out.append(stmts[seg.computes[p]])
        out += [stmts[f] for f in after.get(j, ())]
    out += [stmts[f] for f in end]
    return out
