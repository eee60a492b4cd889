"""What ``model.remat_summary()`` (or ``remat.policy(...).summary()``) shows.

Per block class and input signature: how many blocks run it and at which plan, which op
calls are saved and which are recomputed (op names with counts), the bytes each block holds
from its forward to its backward; then the step's predicted peak above resident memory and
the blocks' predicted time (forward + backward + recomputation, the cost model's roofline
times, not measured) against no checkpointing and full checkpointing. Everything is a
prediction; before the first training call nothing is planned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..plans.budget import format_bytes
from .lm_head import HEAD
from .plan import step_peak


def _ops(names) -> str:
    c = Counter(n.removeprefix("aten.").rsplit(".", 1)[0] for n in names)
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class BlockRow:
    cls: str
    blocks: list  # block names
    plan: str  # "unwrapped", "selective", "full", "unsupported"
    saved: list  # op names saved
    recomputed: list  # op names recomputed
    held: int
    eager: int
    full: int
    recompute_seconds: float
    offloaded: list = None  # op names kept in host memory


class Summary:
    """The plan of a model's blocks; ``str()`` is a table. Attributes: ``rows`` (one
    :class:`BlockRow` per block class, signature and plan), ``peak`` / ``peak_eager`` /
    ``peak_full`` (predicted bytes above resident), ``time_ratio`` / ``time_ratio_full``
    (predicted blocks' step time against no checkpointing), ``budget``, ``feasible``."""

    def __init__(self, planner) -> None:
        self.planner = planner
        self.rows: list[BlockRow] = []
        self.planned = bool(planner.plans)
        keys = planner._keys()
        groups: dict = {}
        base = rec = rec_full = 0.0
        chosen, fulls, eagers = [], [], []
        unsupported = []
        for (name, m), key in zip(planner.blocks, keys):
            bp = planner.plans.get(key) if key is not None else None
            if bp is None:
                continue
            if not bp.supported:
                unsupported.append((name, bp))
                groups.setdefault((key, "unsupported"), (bp, None, []))[2].append(name)
                continue
            p = planner.choice.get(name) or bp.frontier[0]
            kind = "unwrapped" if p.unwrapped else ("full" if not p.saved else "selective")
            groups.setdefault((key, p), (bp, p, []))[2].append(name)
            base += bp.forward_seconds + bp.backward_seconds
            rec += p.recompute
            rec_full += bp.full.recompute
            chosen.append(p)
            fulls.append(bp.full)
            eagers.append(bp.frontier[0])
        for (key, p), (bp, point, names) in groups.items():
            if point is None:
                self.rows.append(BlockRow(bp.cls, names, "unsupported: " + bp.capture.reason, [], [], 0, 0, 0, 0.0))
                continue
            ops = bp.capture.ops
            kind = "unwrapped" if point.unwrapped else ("full" if not point.kept else "selective")
            saved = [ops[i].name for i in sorted(point.saved)] if not point.unwrapped else []
            offloaded = [ops[i].name for i in sorted(point.offloaded)] if not point.unwrapped else []
            recomputed = [] if point.unwrapped else [o.name for i, o in enumerate(ops)
                                                     if i not in point.kept and o.category != "view"]
            self.rows.append(BlockRow(bp.cls, names, kind, saved, recomputed, point.held, bp.frontier[0].held,
                                      bp.full.held, point.recompute, offloaded))
        self.head = None  # (the head's chosen point, its unchunked point) when the head is planned
        front = getattr(planner, "head_front", None)
        if front:
            p = planner.choice.get(HEAD) or front[0]
            self.head = (p, front[0])
            chosen.append(p)
            fulls.append(front[0])
            eagers.append(front[0])
        out = planner.outside
        self.peak = step_peak(chosen, out) if chosen else 0
        self.peak_eager = step_peak(eagers, out) if eagers else 0
        self.peak_full = step_peak(fulls, out) if fulls else 0
        self.time_ratio = (base + rec) / base if base else 1.0
        self.time_ratio_full = (base + rec_full) / base if base else 1.0
        self.budget = planner.budget
        self.feasible = planner.last.feasible if planner.last is not None else True
        self.outside = out
        self.unsupported = unsupported

    def __str__(self) -> str:
        p = self.planner
        head = f"remat.checkpoint on {type(p.model).__name__}: budget {_budget_text(p.budget)}"
        if not self.planned:
            return head + "\n  not planned yet: plans are made at the first training call"
        lines = [head]
        for r in self.rows:
            span = ", ".join(r.blocks) if len(r.blocks) <= 3 else f"{r.blocks[0]} .. {r.blocks[-1]}"
            lines.append(f"  {r.cls} x{len(r.blocks)} ({span}): {r.plan}")
            if r.plan.startswith("unsupported"):
                continue
            lines.append(f"    holds {format_bytes(r.held)} per block (no checkpointing {format_bytes(r.eager)}, "
                         f"full checkpointing {format_bytes(r.full)}); recomputes {r.recompute_seconds * 1e3:.3f} ms")
            if r.plan != "unwrapped":
                lines.append(f"    saved: {_ops(r.saved) or '(nothing)'}")
                lines.append(f"    recomputed: {_ops(r.recomputed) or '(nothing)'}")
                if r.offloaded:
                    lines.append(f"    offloaded: {_ops(r.offloaded)}")
        if self.head is not None:
            hp, own = self.head
            how = "the model's own" if hp.unwrapped else f"split along the tokens, {hp.label.split()[-1]} a chunk"
            lines.append(f"  head and loss ({type(p.head.model).__name__}): {how}")
            lines.append(f"    holds {format_bytes(hp.held)} from its forward to its backward (its own "
                         f"{format_bytes(own.held)}), {format_bytes(hp.live)} while it runs (its own "
                         f"{format_bytes(own.live)})")
        elif getattr(p, "head_why", None):
            lines.append(f"  head and loss: the model's own ({p.head_why})")
        e = self.peak_eager or 1
        lines.append(f"  predicted peak above resident: {format_bytes(self.peak)} = {self.peak / e:.3f} of no "
                     f"checkpointing ({format_bytes(self.peak_eager)}); full checkpointing "
                     f"{format_bytes(self.peak_full)} = {self.peak_full / e:.3f}"
                     + ("" if self.feasible else "  [budget out of reach: at the least]"))
        lines.append(f"  predicted blocks' step time: {self.time_ratio:.3f}x no checkpointing; full checkpointing "
                     f"{self.time_ratio_full:.3f}x (roofline costs, outside-block work not counted)")
        o = self.outside
        lines.append(f"  outside the blocks: {format_bytes(o.before)} saved before them, {format_bytes(o.after)} after "
                     f"(with the loss's gradients), outputs {format_bytes(o.kept)}"
                     + ("" if p.outside_measured else " (not measured yet)"))
        return "\n".join(lines)

    __repr__ = __str__


def _budget_text(budget) -> str:
    if budget is None:
        return "None (no budget: the step without checkpointing)"
    if isinstance(budget, str):
        return f"{budget!r} (full checkpointing's peak)"
    return budget.text
