"""Keeping inductor's kernels in the plan's order, for every plan remat makes.

A plan's peak is a property of its order: which values are alive together. Lowering puts the
forward and backward modules in the schedule's order, and inductor's scheduler starts from it,
but five of inductor's decisions move memory across the plan's peak. :func:`in_plan_order`,
installed by the backend while inductor compiles a plan of remat's, undoes each; PyTorch's
partitioners and the fallback compile as inductor would.

- **Fusion of kernels far apart.** A fused kernel runs where its earliest part was, or is pushed
  down after its latest input: fusing a recomputed RMS norm of one layer with the norm backward
  of the next (both read the residual), or the copies of a recomputed embedding from several
  layers (they share the table), runs work early, with its output alive from there on, or late,
  with its inputs alive until then. :class:`PlanOrderChoices` lets only kernels at most
  :data:`NEAR` apart fuse, through inductor's own hook for fusion heuristics
  (``V.choices.can_fuse``; every other decision stays inductor's).
- **``add(x, mm(a, b)) -> addmm(x, a, b)``,** a post-grad pattern, computes the product where
  the sum is. With tied embeddings (T5) the LM head's weight gradient is added to the
  embedding's at the end of the backward, so the product moved there with its inputs (the
  logits' gradient) alive all through the backward: a plan of T5 for 0.6 measured 0.80.
  :func:`split_late_addmm`, run after inductor's post-grad passes, computes such a product again
  where its inputs were ready and adds it where the sum is.
- **Buffer reuse.** Inductor's wrapper keeps a dead buffer for the next allocation of the same
  size, however far away; a T5 plan for 0.6 held two dead feed-forward buffers (1 MiB) of one
  layer through the next layer's attention backward, where its peak is. Inductor checks such
  reuse against its own estimate of the peak, which missed it. ``allow_buffer_reuse`` is off:
  a dead buffer goes back to the allocator (CUDA's caching allocator, or malloc on a CPU),
  which reuses it without holding it. Kernels that write into an input they read last
  (``inplace_buffers``) still do: the simulator counts on that.
- **Inlining into a far reader.** Inductor computes a pointwise value inside the kernel that
  reads it: T5's sum of the LM head's and the decoder embedding's weight gradients, read by the
  encoder embedding's a hundred kernels later, kept both alive until then. :func:`realize_far`
  has inductor write a pointwise value whose first reader is more than
  :data:`~remat.plans.simulator.FAR` nodes away where the plan computes it, as the simulator
  counts it.

- **Reordering for its own estimate of the peak** (``reorder_for_peak_memory``): inductor tries
  other topological orders of its kernels and keeps the one its estimate ranks lowest. The
  estimate is not the plan's: on a VGG-style CNN (``benchmarks/user_trial.py --model vgg``, two threads) it
  computed each max-pool's int64 indices and their copy (4x the pooled activation) one layer
  early, ahead of the next convolution's backward, and the step without a budget measured
  6.3% above its prediction. Off: the order is the one the simulator judged.

On T5, Llama, Qwen2 and GPT-2 (``python benchmarks/plan_order.py``, BENCHMARKS.md) the first
four together brought every plan within its prediction, at the same step time. Before, the
fusion veto let far kernels fuse where inductor's estimate of the starting order had room: fusions
compounded, and T5 at 0.6 measured 1.17x its prediction (0.63 of PyTorch's no-recompute peak
for a budget of 0.6).

Without the choices hook (an older inductor) fusion is left alone.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from ..plans.simulator import FAR

NEAR = 3
"""Kernels (inductor's scheduler nodes, numbered in their order before fusion) at most this far
apart may fuse: a producer and its consumer, which the fused memory model assumes fused. Chosen
on the RMS-norm stack of ``tests/test_plan_order.py`` and Qwen2 in diagnostic runs (not
committed): with no fusion at all, values the model keeps in registers were written (12% above
the prediction); with a window of 8, moves came back. On T5, Llama, Qwen2 and GPT-2 the step
time with only near fusions is within 2% of that with inductor's own (diagnostic runs of the
four, ``benchmarks/plan_order.py`` for the ordered plans against inductor's)."""


def distance(node1: Any, node2: Any) -> int:
    """How far apart two scheduler nodes (or fused groups) are in the order before fusion."""
    return max(abs(node1.min_order - node2.max_order), abs(node2.min_order - node1.max_order))


class PlanOrderChoices:
    """Inductor's choices handler ``base`` with fusions of kernels more than ``near`` apart
    vetoed; everything else is ``base``'s. ``vetoed`` counts the fusions refused."""

    def __init__(self, base: Any, near: int = NEAR) -> None:
        self.base = base
        self.near = near
        self.vetoed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def can_fuse(self, scheduler: Any, node1: Any, node2: Any, shared_data_score: int) -> bool:
        if distance(node1, node2) > self.near:
            self.vetoed += 1
            return False
        return self.base.can_fuse(scheduler, node1, node2, shared_data_score)


@contextlib.contextmanager
def in_plan_order(near: int | None = None) -> Iterator[PlanOrderChoices | None]:
    """While inductor compiles inside this block, it keeps to the order it starts from: only
    near kernels fuse (:class:`PlanOrderChoices`, ``near`` default :data:`NEAR`), late
    ``addmm`` fusions are split and values read far away are written where they are
    (:class:`PlanOrderPass`, after any post-grad pass configured), dead buffers are not
    held for reuse and kernels are not reordered for inductor's estimate of the peak. Yields
    the handler, or None where inductor has no choices hook."""
    split = PlanOrderPass(inductor_config.post_grad_custom_post_pass)
    with inductor_config.patch(post_grad_custom_post_pass=split, allow_buffer_reuse=False,
                               reorder_for_peak_memory=False):
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


LATE = FAR
"""An ``addmm`` whose bias is ready more than this many graph nodes after its matrices is
split back into ``mm`` (where the matrices are ready) and ``add`` (where the bias is): the
same distance at which a value is written rather than computed inside its reader."""


class PlanOrderPass(CustomGraphPass):
    """Inductor's post-grad custom pass for a graph in a plan's order (see the module
    docstring): :func:`split_late_addmm`, then :func:`realize_far`; ``chained`` is the pass
    that was configured before, run first."""

    def __init__(self, chained: Any = None, late: int = LATE, far: int = FAR) -> None:
        self.chained = chained
        self.late = late
        self.far = far

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.chained is not None:
            for fn in (self.chained if isinstance(self.chained, (list, tuple)) else (self.chained,)):
                fn(graph)
        split_late_addmm(graph, self.late)
        realize_far(graph, self.far)

    def uuid(self) -> Any:
        chained = self.chained
        inner = chained.uuid() if hasattr(chained, "uuid") else repr(chained)
        return f"remat-plan-order-{self.late}-{self.far}-{inner}"


def _first_reader(node: torch.fx.Node, at: dict) -> int | None:
    """The position of the first node that reads ``node``, through views."""
    first = None
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if user.op == "call_function" and getattr(user.target, "is_view", False):
            stack.extend(user.users)
            continue
        first = at[user] if first is None else min(first, at[user])
    return first


def realize_far(graph: torch.fx.Graph, far: int = FAR) -> int:
    """Mark each pointwise node whose first reader comes more than ``far`` nodes later to be
    written where it is (``inductor_realize_to_strides``): inductor would compute it inside
    that reader, keeping its inputs alive until then, where the plan freed them. The
    simulator counts such a value written (:data:`remat.plans.simulator.FAR`). Returns how
    many were marked."""
    nodes = list(graph.nodes)
    at = {n: k for k, n in enumerate(nodes)}
    count = 0
    for n in nodes:
        if n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor) \
                or torch.Tag.pointwise not in getattr(n.target, "tags", ()):
            continue
        first = _first_reader(n, at)
        if first is not None and first - at[n] > far:
            n.meta["inductor_realize_to_strides"] = True
            count += 1
    return count


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
