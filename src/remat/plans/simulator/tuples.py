"""Storages that live longer than the values naming them: a multi-output op's items, allocated
when the op runs and not when their getitems do, and a loss's gradient (:func:`root_tangents`).

A tuple (``meta["container"]``: a convolution backward, ``var_mean``, a batch norm) holds no
storage of its own; its items do (:func:`remat.cost.model.storage`). The op allocates them all
while it runs, whenever the schedule computes the getitems that name them:

- the eager compiler's interpreter holds the tuple until its last getitem, and the tuple holds
  every item, so each item's storage is held from the op's compute to the tuple's free (an
  item a reader consumed early stays in the tuple);
- inductor extracts every item right after the extern kernel (``buf1 = buf0[0]``, then
  ``del buf0``), so an item is held from the op's compute until its getitem's value is freed.

Before this the simulator counted an item from its getitem's compute: MAGIS's re-ordering
moved ResNet-18's last weight gradient (``getitem_27``, 147 KB, of the first
``convolution_backward``) to the end of the backward, and a plan the simulator put at 325,708
bytes above the step's start measured 398,196 (``tests/test_budgets_zoo.py``'s byte budget
exceeded; ``benchmarks/peak_fidelity.py``).

The op's workspace (:meth:`remat.cost.model.CostModel.workspace`) counts its outputs as
transient bytes while it runs; the simulator counts the items it holds instead, and keeps as
transient only the outputs no getitem names (:func:`tuple_workspace`).
"""

from __future__ import annotations

from ...cost.model import CostModel, storage
from ...graph.graph import Graph
from .fusion import tuple_items


def items_of(g: Graph) -> list[tuple[int, ...]]:
    """For each node, the items (getitems in a storage of their own) of the tuple it is; ``()``
    for every other node."""
    def items(g: Graph) -> list[tuple[int, ...]]:
        out: list[list[int]] = [[] for _ in range(len(g))]
        ins = g.input_indices
        for j, is_item in enumerate(tuple_items(g)):
            if is_item:
                out[ins[j][0]].append(j)
        return [tuple(x) for x in out]
    return g._derived("simulator_tuple_items", items)


def tuple_workspace(g: Graph, cm: CostModel) -> list[int]:
    """:meth:`CostModel.workspace` less the items each tuple holds from its compute on (what
    stays transient: a convolution's scratch, outputs no getitem names)."""
    def work(g: Graph) -> list[int]:
        w = list(cm.workspace(g))
        sizes = storage(g)[1]
        for c, its in enumerate(items_of(g)):
            if its:
                held = min(sum(sizes[j] for j in its), int(g.nodes[c].bytes))
                w[c] = max(0, w[c] - held)
        return w
    return g._derived(("simulator_tuple_workspace", cm.device, cm.fused_memory), work)


def root_tangents(g: Graph) -> list[bool]:
    """Tangents of a scalar (a loss): ``loss.backward()`` makes that gradient itself and
    ``torch.autograd.backward`` holds it (``grad_tensors_``) until the backward returns, so
    its storage stays allocated to the step's end whatever the schedule frees. A step of T5
    or GPT-2 whose peak came after the loss gradient's free measured 4 bytes over its
    prediction."""
    def roots(g: Graph) -> list[bool]:
        return [n.role == "tangent" and n.shape is not None and len(n.shape) == 0 for n in g.nodes]
    return g._derived("simulator_root_tangents", roots)
