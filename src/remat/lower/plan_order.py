"""Keeping inductor's kernels in the plan's order, for every plan remat makes.

A plan's peak is a property of its order: which values are alive together. Lowering puts the
forward and backward modules in the schedule's order, and inductor's scheduler starts from it
(its nodes before fusion simulate to the plan's peak), but fusion moves work: a fused kernel runs
where its earliest part was, then is pushed down to after its latest input. Fusing two kernels
far apart in the order (a recomputed RMS norm of one layer with the norm backward of the next,
which read the same residual; the copies of one recomputation in a staged plan) runs a
computation early, with its output alive from there on, or late, with its inputs alive until
then. Kept to the plan's order, the same plans peak 13-25% lower at 0.6 on Qwen2, Llama and T5
at the same step time (``python benchmarks/plan_order.py``, BENCHMARKS.md). In a diagnostic run
(hooks on inductor's scheduler, not committed) a Qwen2 plan's kernels simulated to the plan's
peak before fusion and 12% above it after.

:func:`in_plan_order` vetoes, while inductor compiles a graph, the fusions that could raise the
peak of that starting order, through inductor's own hook for fusion heuristics
(``V.choices.can_fuse``; every other decision stays inductor's):

- kernels at most :data:`NEAR` apart always may fuse (a producer and its consumer: the fused
  memory model counts on those);
- farther apart, they may fuse only if the memory inductor estimates for the starting order,
  at its highest between them, plus the bytes the two kernels read and write (all that the
  fusion can keep alive longer) stays within that order's peak. Far from the peak, fusion is
  free; across it, it is not.
- Where inductor's memory estimate is not available, kernels more than :data:`NEAR` apart do
  not fuse.

The handler wraps whatever choices handler is installed, so a user's own stays in force;
without the hook (an older inductor) nothing changes.

Work also moves before the scheduler: inductor's post-grad pattern ``add(x, mm(a, b)) ->
addmm(x, a, b)`` computes the product where the sum was. With tied embeddings (T5) the LM
head's weight gradient is added to the embedding's at the end of the backward, so the product
moved there with its inputs (the logits' gradient) alive all through the backward: a plan of
T5 for 0.6 measured 0.80. :class:`SplitLateAddmm`, run after inductor's post-grad passes,
computes such a product again where its inputs were ready and adds it where the sum is; it
also lowers plans without a budget (T5's from 1.06 to 0.97 of PyTorch's no-recompute peak,
GPT-2's from 0.68 to 0.65), at the same step time.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

NEAR = 3
"""Kernels (inductor's scheduler nodes, numbered in their order before fusion) at most this far
apart always may fuse: a producer and its consumer, which the fused memory model assumes fused.
Chosen on the RMS-norm stack of ``tests/test_plan_order.py`` and Qwen2 in diagnostic runs (not
committed): with no fusion at all, values the model keeps in registers were written (12% above
the prediction); with a plain window of 8 and no memory check, moves came back."""


def distance(node1: Any, node2: Any) -> int:
    """How far apart two scheduler nodes (or fused groups) are in the order before fusion."""
    return max(abs(node1.min_order - node2.max_order), abs(node2.min_order - node1.max_order))


class _Memory:
    """Inductor's estimate of the memory alive at each node of a scheduler's order before
    fusion, and the bytes of its buffers and inputs."""

    def __init__(self, scheduler: Any) -> None:
        from torch._inductor import memory
        from torch._inductor.utils import get_dtype_size
        from torch._inductor.virtualized import V
        from torch.utils._ordered_set import OrderedSet

        nodes = list(scheduler.nodes)
        if [n.min_order for n in nodes] != list(range(len(nodes))):
            raise ValueError("scheduler nodes are not in their starting order")
        inputs = OrderedSet(V.graph.graph_inputs.keys())
        outputs = OrderedSet(V.graph.get_output_names())
        _, freeable = memory.prepare_planning_info(nodes, scheduler.name_to_buf,
                                                   scheduler.name_to_fused_node, inputs, outputs)
        self.peak, at = memory.estimate_peak_memory(nodes, freeable, outputs)
        self.at = list(at)
        self.bytes = {name: size for name, (_, size) in
                      memory.compute_size_for_scheduler_buffer(scheduler.name_to_buf).items()}
        for name, value in V.graph.graph_inputs.items():
            try:
                numel = V.graph.sizevars.size_hint(value.get_numel(), fallback=0)
                self.bytes.setdefault(name, int(numel) * get_dtype_size(value.get_dtype()))
            except Exception:  # noqa: BLE001 - a symbolic integer input has no bytes
                continue

    def touched(self, *groups: Any) -> int:
        """Bytes the scheduler nodes of ``groups`` read or write."""
        names = {dep.name for group in groups for node in group.get_nodes()
                 for dep in node.read_writes.reads_and_writes()}
        return sum(self.bytes.get(name, 0) for name in names)

    def fits(self, node1: Any, node2: Any) -> bool:
        lo = min(node1.min_order, node2.min_order)
        hi = max(node1.max_order, node2.max_order)
        return max(self.at[lo:hi + 1], default=0) + self.touched(node1, node2) <= self.peak


class PlanOrderChoices:
    """Inductor's choices handler ``base`` with the fusions that could raise the peak of the
    starting order vetoed; everything else is ``base``'s. ``vetoed`` counts the fusions refused."""

    def __init__(self, base: Any, near: int = NEAR) -> None:
        self.base = base
        self.near = near
        self.vetoed = 0
        self._memory: dict[int, tuple[Any, _Memory | None]] = {}  # id -> (scheduler, its estimate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def memory(self, scheduler: Any) -> _Memory | None:
        """The estimate for ``scheduler``, made at its first far fusion (before any fusion
        has been decided; the scheduler is held, so its id is not reused)."""
        key = id(scheduler)
        if key not in self._memory:
            try:
                estimate = _Memory(scheduler)
            except Exception:  # noqa: BLE001 - without an estimate, only near kernels fuse
                estimate = None
            self._memory[key] = (scheduler, estimate)
        return self._memory[key][1]

    def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        if distance(node1, node2) > self.near:
            memory = self.memory(scheduler)
            if memory is None or not memory.fits(node1, node2):
                self.vetoed += 1
                return False
        return self.base.can_fuse(scheduler, node1, node2, shared_data_score)


@contextlib.contextmanager
def in_plan_order(near: int | None = None) -> Iterator[PlanOrderChoices | None]:
    """While inductor compiles inside this block, only fusions that keep the starting order's
    peak happen (:class:`PlanOrderChoices`, with ``near`` default :data:`NEAR`); yields the
    handler, or None where inductor has no choices hook."""
    try:
        from torch._inductor.virtualized import V
        base = V.choices
        set_handler = V.set_choices_handler
    except (ImportError, AttributeError):
        yield None
        return
    handler = PlanOrderChoices(base, NEAR if near is None else near)
    with set_handler(handler):
        yield handler


LATE = 16
"""An ``addmm`` whose bias is ready more than this many graph nodes after its matrices is
split back into ``mm`` (where the matrices are ready) and ``add`` (where the bias is)."""


class SplitLateAddmm(CustomGraphPass):
    """Inductor's post-grad custom pass: undo ``addmm`` fusions that move a product far from
    its inputs (see the module docstring); ``chained`` is the pass that was configured before,
    run first."""

    def __init__(self, chained: Any = None, late: int = LATE) -> None:
        self.chained = chained
        self.late = late

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.chained is not None:
            for fn in (self.chained if isinstance(self.chained, (list, tuple)) else (self.chained,)):
                fn(graph)
        split_late_addmm(graph, self.late)

    def uuid(self) -> Any:
        chained = self.chained
        inner = chained.uuid() if hasattr(chained, "uuid") else repr(chained)
        return f"remat-split-late-addmm-{self.late}-{inner}"


def split_late_addmm(graph: torch.fx.Graph, late: int = LATE) -> int:
    """Rewrite ``addmm(x, a, b)`` as ``add(x, mm(a, b))`` with the ``mm`` right after the later
    of ``a`` and ``b`` when ``x`` comes more than ``late`` nodes after them (and ``beta`` and
    ``alpha`` are 1). Returns how many were split."""
    aten = torch.ops.aten
    nodes = list(graph.nodes)
    at = {n: k for k, n in enumerate(nodes)}
    inputs = [n for n in nodes if n.op == "placeholder"]
    count = 0
    for n in nodes:
        if n.op != "call_function" or n.target is not aten.addmm.default or len(n.args) != 3 \
                or any(n.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or set(n.kwargs) - {"beta", "alpha"}:
            continue
        x, a, b = n.args
        if not all(isinstance(v, torch.fx.Node) for v in (x, a, b)):
            continue
        ready = a if at[a] >= at[b] else b
        if at[x] - at[ready] <= late:
            continue
        if ready.op == "placeholder":
            ready = inputs[-1]
        with graph.inserting_after(ready):
            mm = graph.call_function(aten.mm.default, (a, b))
        val = n.meta.get("val")
        if val is not None:
            mm.meta["val"] = val.new_empty(val.shape)
        with graph.inserting_before(n):
            add = graph.call_function(aten.add.Tensor, (x, mm))
        add.meta = dict(n.meta)
        n.replace_all_uses_with(add)
        graph.erase_node(n)
        count += 1
    return count
