"""Plan selective checkpointing for eager blocks: per block a frontier, per step a choice.

Torch-free: this module reads the op calls :mod:`remat.eager.capture` recorded (plain
attributes) and builds a remat :class:`~remat.graph.Graph` of the block's forward and
backward, costed with :class:`~remat.cost.model.CostModel` on a
:class:`~remat.cost.model.DeviceProfile` (every op its own kernel: eager runs no fusion).

The memory model is SAC's (``torch.utils.checkpoint`` with
``create_selective_checkpoint_contexts``, non-reentrant):

- a checkpointed block holds, from its forward to its backward, its inputs (that need grad)
  and the outputs of the ops marked ``MUST_SAVE``; its backward re-runs every other op of the
  block up to the last one that autograd saves a value for (checkpointing's early stop),
  views and random ops included (the replay restores the RNG state, so a random op
  is always recomputed, never saved: a saved one would not draw its numbers again and the
  masks of the random ops after it would shift);
- while a block's backward runs it holds what eager holds for it (the values autograd
  saves) and the gradients it makes;
- a block left unwrapped holds what autograd saves (measured at capture), recomputing nothing.

Saving op ``i`` costs its output's bytes and spares its recompute time, independently of the
other ops (SAC replays the whole block either way), so a block's choices are a 0/1
knapsack: :func:`block_frontier` orders the candidates by seconds spared per byte and keeps
the Pareto points of the prefixes, plus "unwrapped". :func:`choose` picks one point per
block for the whole step: the least predicted recompute time whose predicted peak fits the
budget (the better of a greedy descent by bytes freed per second added, followed by a pass that
moves blocks back up while the peak still fits, and a dynamic program over the blocks with the
bytes held so far, rounded up, as its state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.model import CostModel, DeviceProfile, PROFILES
from ..graph.graph import Graph, Node


@dataclass(frozen=True)
class Point:
    """One way to run a block: ``saved`` op indices (into the capture's op list) marked
    ``MUST_SAVE``; every other op recomputed. ``unwrapped``: run without checkpointing."""

    saved: frozenset
    held: int  # bytes held from the block's forward to its backward
    live: int  # bytes held while its backward runs
    recompute: float  # predicted seconds of recomputation in its backward (and of copies, offloading)
    unwrapped: bool = False
    label: str = ""
    offloaded: frozenset = frozenset()  # op indices saved (MUST_SAVE) but kept in host memory
    gradients: int = 0  # of ``live``: the estimated gradients its backward makes (the uncertain part)

    @property
    def kept(self) -> frozenset:
        """Every op index SAC saves: on the device (``saved``) or in host memory (``offloaded``)."""
        return self.saved | self.offloaded


@dataclass
class BlockPlan:
    """What remat knows of one (block class, input signature): its graph, costs and frontier."""

    key: tuple
    cls: str
    capture: object  # remat.eager.capture.BlockCapture
    graph: Graph | None = None
    costs: list = field(default_factory=list)  # seconds per op call (forward)
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    frontier: list = field(default_factory=list)  # Points, held descending (unwrapped first)
    full: Point | None = None  # full checkpointing (save nothing)
    least_saved: Point | None = None  # save-everything-needed, checkpointed (eager's memory)

    @property
    def supported(self) -> bool:
        return bool(getattr(self.capture, "supported", False))


def block_graph(cap, name: str = "block") -> Graph:
    """The block's forward (one node per op call SAC sees) and a backward that reads, for each
    op that autograd saves for, its saved value: a remat Graph, for costs and inspection."""
    nodes: list[Node] = []
    n_inputs = 1 + max([src[1] for op in cap.ops for src in op.inputs if src[0] == "input"] or [-1])
    for k in range(n_inputs):
        nodes.append(Node(f"in{k}", "placeholder", (), role="input", bytes=0, category="input"))
    nodes.append(Node("const", "placeholder", (), role="param", bytes=0, category="input"))

    def ref(src) -> str:
        return {"input": lambda: f"in{src[1]}", "op": lambda: f"f{src[1]}"}.get(src[0], lambda: "const")()

    for i, op in enumerate(cap.ops):
        ins = tuple(dict.fromkeys(ref(s) for s in op.inputs))
        meta = {"call": [op.name, op.index], "fresh_bytes": op.bytes}
        if op.category == "view" and op.inputs:
            meta["alias_of"] = ref(op.inputs[0])
        nodes.append(Node(f"f{i}", op.name.removeprefix("aten."), ins, role="forward",
                          bytes=int(op.out_bytes), flops=float(op.flops), category=op.category,
                          shape=op.out_shapes[0] if op.out_shapes else None, dtype=op.dtype,
                          must_save=op.category == "random", meta=meta))
    nodes.append(Node("tangent", "placeholder", (), role="tangent", bytes=int(cap.output_bytes),
                      category="input"))
    prev = "tangent"
    for i in range(len(cap.ops) - 1, -1, -1):
        op = cap.ops[i]
        if not (op.needed or op.category == "compute"):
            continue
        ins = (prev, f"f{i}") if op.needed else (prev,)
        base = op.name.removeprefix("aten.").split(".")[0]  # "convolution_backward": the cost model's name
        nodes.append(Node(f"b{i}", f"{base}_backward", ins, role="backward",
                          bytes=int(op.out_bytes), flops=2.0 * float(op.flops),
                          category=op.category if op.category != "random" else "pointwise"))
        prev = f"b{i}"
    return Graph(nodes, name=name)


def replayed(cap) -> int:
    """How many op calls a recomputation of the block runs: non-reentrant checkpointing stops
    replaying once autograd has saved every value it saved in the forward, so the ops after
    the last one that saves something never run again."""
    r = getattr(cap, "replayed", -1)
    return len(cap.ops) if r is None or r < 0 else min(int(r), len(cap.ops))


def _candidates(cap) -> list[int]:
    """Op calls SAC may save: fresh outputs (not views, not in-place), not random, not
    written into later (SAC's cache checks the version counter), and replayed (saving an op
    the replay never reaches spares nothing)."""
    n = replayed(cap)
    return [i for i, op in enumerate(cap.ops[:n])
            if op.fresh and op.bytes > 0 and op.category not in ("view", "random")
            and not op.mutates and not op.mutated_later]


def block_plan(key: tuple, cls: str, cap, profile: DeviceProfile | None = None,
               sac_overhead: float = 0.0, offload=None) -> BlockPlan:
    """Cost a captured block and compute its frontier (unsupported blocks get none).
    ``sac_overhead``: seconds SAC's dispatch modes add per op call of a block (its policy and
    cache run in Python for every op, in the forward and in the replay); a block that saves
    nothing runs under plain checkpointing and pays none. ``offload``: a function
    ``(candidates, overlap_seconds) -> {index: copy seconds}`` choosing, among ``(index, bytes,
    recompute seconds)`` of the values the block could save, those to keep in host memory rather
    than recompute (:func:`remat.eager.offload.choose_offloads` over the measured link);
    ``overlap_seconds`` is the block's forward and backward compute, which copies on an
    asynchronous link run beside."""
    bp = BlockPlan(key, cls, cap)
    if not bp.supported:
        return bp
    profile = profile or PROFILES["cpu"]
    g = block_graph(cap, name=cls)
    model = CostModel(profile)
    all_costs = model.op_costs(g)
    costs = [all_costs[g.index(f"f{i}")] for i in range(len(cap.ops))]
    bp.graph, bp.costs = g, costs
    bp.forward_seconds = sum(costs)
    bp.backward_seconds = sum(all_costs[j] for j, n in enumerate(g.nodes) if n.role == "backward")
    copies = {}
    if offload is not None:
        cand = [(i, cap.ops[i].bytes, costs[i]) for i in _candidates(cap)]
        copies = dict(offload(cand, bp.forward_seconds + bp.backward_seconds) or {})
    # a backward op's scratch, by the cost model's own rule (a convolution's backward: oneDNN
    # reorders grad_output and the input; a CNN block's checkpointed steps measured 1.84 MiB
    # above the prediction without it, benchmarks/eager_checkpoint.py's CNN rows)
    work = model.workspace(g)
    scratch = max((work[j] for j, n in enumerate(g.nodes) if n.role == "backward"), default=0)
    bp.frontier, bp.full, bp.least_saved = block_frontier(cap, costs, sac_overhead, copies, scratch)
    return bp


def _gradients(cap, scratch: int = 0) -> int:
    """Bytes a block's backward holds at once beyond its saved values: about the two largest
    values of the block (an op's output gradient and its input gradient), and ``scratch``, the
    largest transient of its backward ops (:meth:`remat.cost.model.CostModel.workspace`)."""
    sizes = sorted((op.bytes for op in cap.ops if op.fresh), reverse=True)
    return int(sum(sizes[:2]) + scratch)


def _live(cap, saved, grads: int) -> int:
    """Bytes a block holds while its backward runs: what autograd saves for it (recomputed or
    saved) and the gradients it makes (``grads``). Saved values autograd does not keep are
    returned to the replay one by one and dropped as it moves on, so they add nothing lasting."""
    return cap.eager_bytes + grads


def block_frontier(cap, costs: list[float], sac_overhead: float = 0.0,
                   copies: dict | None = None, scratch: int = 0) -> tuple[list[Point], Point, Point]:
    """The block's Pareto points (held bytes vs recompute seconds), unwrapped first, then by
    held bytes descending; and the full-checkpointing and save-what-autograd-saves points.
    A point that saves something runs under SAC and pays ``sac_overhead`` per op call.
    ``copies``: ``{op index: seconds}`` of the values kept in host memory in every checkpointed
    point (offloading): they hold no device memory until the backward, cost their copies, and
    are not recomputed."""
    sac = sac_overhead * len(cap.ops)
    copies = dict(copies or {})
    off = frozenset(copies)
    total = sum(costs[:replayed(cap)]) - sum(costs[i] for i in off) + sum(copies.values())
    cand = [i for i in _candidates(cap) if i not in off]
    order = sorted(cand, key=lambda i: (-(costs[i] / max(cap.ops[i].bytes, 1)), i))
    points = []
    saved: list[int] = []
    held, spared = cap.input_bytes, 0.0
    grads = _gradients(cap, scratch)
    points.append(Point(frozenset(), held, _live(cap, off, grads), total + (sac if off else 0.0),
                        label="full", offloaded=off, gradients=grads))
    for i in order:
        saved.append(i)
        held += cap.ops[i].bytes
        spared += costs[i]
        s = frozenset(saved)
        points.append(Point(s, held, _live(cap, s | off, grads), max(total - spared, 0.0) + sac, offloaded=off,
                            gradients=grads))
    full = points[0]
    needed = frozenset(i for i in cand if cap.ops[i].needed)
    least_saved = Point(needed, cap.input_bytes + sum(cap.ops[i].bytes for i in needed), _live(cap, needed, grads),
                        total - sum(costs[i] for i in needed) + sac, label="autograd's", gradients=grads)
    eager = Point(frozenset(), cap.eager_bytes, cap.eager_bytes + grads, 0.0, unwrapped=True,
                  label="unwrapped", gradients=grads)
    # Pareto filter: less held must cost more time; unwrapped (0 s) dominates what holds more
    front = [eager]
    kept: list[Point] = []
    for p in sorted(points, key=lambda p: (p.recompute, p.held)):
        if p.held >= eager.held:
            continue
        if kept and p.held >= kept[-1].held:
            continue
        kept.append(p)
    front += kept  # recompute ascending = held descending
    return front, full, least_saved


# -- the step ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outside:
    """What the step holds outside the blocks (measured in a step's forward, see
    :class:`remat.eager.policy.Planner`): ``before`` what autograd saves before the first block
    (embeddings), ``after`` what it saves after the blocks plus the gradients its backward
    makes at the backward's start (twice the largest value saved there: a loss over logits
    holds its log-probabilities, their gradient and the logits' gradient at once), ``kept``
    the model's outputs, which the caller holds until the step ends."""

    before: int = 0
    after: int = 0
    kept: int = 0

    @property
    def total(self) -> int:
        return self.before + self.after + self.kept


def _outside(outside) -> Outside:
    return outside if isinstance(outside, Outside) else Outside(after=int(outside or 0))


def step_peak(points: list[Point], outside: "Outside | int" = 0) -> int:
    """Predicted peak bytes above resident of a step whose blocks (in forward order) run at
    ``points``: at the backward's start, everything the forward left (the blocks' held bytes
    and all of ``outside``); during block ``j``'s backward, what was saved before the blocks,
    the outputs, the held bytes of the blocks before ``j`` and what ``j``'s backward holds
    (:attr:`Point.live`: its saved values and the gradients it makes)."""
    o = _outside(outside)
    run, peak = 0, 0
    for p in points:
        peak = max(peak, o.before + o.kept + run + p.live)
        run += p.held
    return int(max(peak, o.total + run))


@dataclass
class Choice:
    points: list  # one Point per block
    peak: int
    recompute: float
    feasible: bool
    target: int | None


def choose(frontiers: list[list[Point]], target: int | None, outside: "Outside | int" = 0) -> Choice:
    """One point per block (``frontiers`` in forward order) with the least total recompute
    whose :func:`step_peak` is at most ``target`` bytes; ``target=None``: the least memory.
    When no choice fits, the least-memory one, marked infeasible."""
    if not frontiers:
        return Choice([], _outside(outside).total, 0.0, True, target)
    least = [min(f, key=lambda p: (p.held, p.live, p.recompute)) for f in frontiers]
    floor = step_peak(least, outside)
    if target is None or floor > target:
        return Choice(least, floor, sum(p.recompute for p in least), target is None or floor <= target, target)
    pos = [0] * len(frontiers)
    cur = [f[0] for f in frontiers]
    peak = step_peak(cur, outside)
    while peak > target:
        best, best_k = None, -1
        for k, f in enumerate(frontiers):
            if pos[k] + 1 >= len(f):
                continue
            a, b = f[pos[k]], f[pos[k] + 1]
            freed = a.held - b.held + 0.5 * (a.live - b.live)
            cost = b.recompute - a.recompute
            score = freed / cost if cost > 0 else float("inf")
            if best is None or score > best:
                best, best_k = score, k
        if best_k < 0:
            break
        pos[best_k] += 1
        cur[best_k] = frontiers[best_k][pos[best_k]]
        peak = step_peak(cur, outside)
    if peak > target:  # the greedy ran out of moves before the floor: take the floor
        cur = list(least)
    else:
        # move blocks back towards less recomputation while the peak still fits
        improved = True
        while improved:
            improved = False
            for k, f in enumerate(frontiers):
                for j in range(pos[k]):
                    trial = cur[:k] + [f[j]] + cur[k + 1:]
                    if f[j].recompute < cur[k].recompute and step_peak(trial, outside) <= target:
                        cur, pos[k], improved = trial, j, True
                        break
    dp = _choose_dp(frontiers, target, _outside(outside))
    if dp is not None and step_peak(dp, outside) <= target and \
            sum(p.recompute for p in dp) < sum(p.recompute for p in cur):
        cur = dp
    return Choice(cur, step_peak(cur, outside), sum(p.recompute for p in cur), True, target)


def _choose_dp(frontiers: list[list[Point]], target: int, o: Outside, buckets: int = 2048) -> list[Point] | None:
    """The least-recompute choice by dynamic programming over the blocks in forward order, the
    held bytes before each block rounded up to ``target / buckets`` (so a choice it returns fits;
    one within a bucket of the target may be missed, which :func:`choose`'s greedy covers). The
    state is the bytes held so far; block ``j``'s point must leave room for its backward
    (``o.before + o.kept + held before j + live``) and the last state for ``o.total``."""
    unit = max(target / buckets, 1.0)
    inf = float("inf")
    cost = np.full(buckets + 1, inf)
    cost[0] = 0.0
    back = []
    for f in frontiers:
        new = np.full(buckets + 1, inf)
        pick = np.full(buckets + 1, -1, dtype=np.int64)
        for idx, p in enumerate(f):
            h = int(np.ceil(p.held / unit))
            room = (target - o.before - o.kept - p.live) / unit
            if room < 0 or h > buckets:
                continue
            top = min(int(np.floor(room)), buckets - h)
            if top < 0:
                continue
            cand = cost[:top + 1] + p.recompute
            seg = new[h:h + top + 1]
            better = cand < seg
            if better.any():
                seg[better] = cand[better]
                pick[h:h + top + 1][better] = idx
        back.append(pick)
        cost = new
    last = int(np.floor((target - o.total) / unit))
    if last < 0:
        return None
    last = min(last, buckets)
    end = int(np.argmin(cost[:last + 1]))
    if not np.isfinite(cost[end]):
        return None
    out: list[Point] = []
    b = end
    for f, pick in zip(reversed(frontiers), reversed(back)):
        idx = int(pick[b])
        if idx < 0:
            return None
        p = f[idx]
        out.append(p)
        b -= int(np.ceil(p.held / unit))
    return out[::-1]


def decisions(bp: BlockPlan, point: Point, offload: bool = False) -> dict:
    """``{(op name, call index): "save" | "recompute" | "offload"}`` for every op call of the
    block. Checkpointed: the plan's saved values are ``"save"`` and the values the plan
    keeps in host memory (``point.offloaded``, chosen against their recomputation over the
    measured link) ``"offload"``, the rest ``"recompute"``. Unwrapped (``point.unwrapped``): what
    autograd saves is ``"save"`` (kept on the device), the rest ``"recompute"`` (nothing is
    recomputed then: the label only says the value is not kept by the plan)."""
    ops = bp.capture.ops
    if point.unwrapped:
        kept = {i for i, op in enumerate(ops) if op.needed}
        return {(op.name, op.index): ("save" if i in kept else "recompute") for i, op in enumerate(ops)}
    out = {}
    for i, op in enumerate(ops):
        if i in point.offloaded:
            out[(op.name, op.index)] = "offload" if offload else "save"
        else:
            out[(op.name, op.index)] = "save" if i in point.saved else "recompute"
    return out
