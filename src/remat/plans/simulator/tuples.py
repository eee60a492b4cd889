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

import numpy as np

from ...cost.model import CostModel, storage_arrays
from ...graph.graph import _ROLE_CODE, Graph
from .fusion import tuple_item_array


def item_table(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """``(items, tuples)``: every item (a getitem in a storage of its own), ascending, and the
    tuple it is an item of, once per graph."""
    def table(g: Graph) -> tuple[np.ndarray, np.ndarray]:
        a = g._arrays
        items = np.flatnonzero(tuple_item_array(g))
        return items, a.in_idx[a.in_ptr[items]]
    return g._derived("simulator_item_table", table)


def items_of(g: Graph) -> list[tuple[int, ...]]:
    """For each node, the items (getitems in a storage of their own) of the tuple it is; ``()``
    for every other node."""
    def items(g: Graph) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = [()] * len(g)
        its: dict[int, list[int]] = {}
        for j, c in zip(*(x.tolist() for x in item_table(g))):
            its.setdefault(c, []).append(j)
        for c, js in its.items():
            out[c] = tuple(js)
        return out
    return g._derived("simulator_tuple_items", items)


def tuple_workspace(g: Graph, cm: CostModel) -> list[int]:
    """:meth:`CostModel.workspace` less the items each tuple holds from its compute on (what
    stays transient: a convolution's scratch, outputs no getitem names)."""
    def work(g: Graph) -> list[int]:
        w = list(cm.workspace(g))
        items, tuples = item_table(g)
        if len(items):
            sizes = storage_arrays(g)[1]
            nbytes = g._arrays.bytes
            held: dict[int, int] = {}
            for j, c in zip(items.tolist(), tuples.tolist()):
                held[c] = held.get(c, 0) + int(sizes[j])
            for c, h in held.items():
                w[c] = max(0, w[c] - min(h, int(nbytes[c])))
        return w
    return g._derived(("simulator_tuple_workspace", cm.device, cm.fused_memory), work)


def root_tangents(g: Graph) -> list[bool]:
    """Tangents of a scalar (a loss): ``loss.backward()`` makes that gradient itself and
    ``torch.autograd.backward`` holds it (``grad_tensors_``) until the backward returns, so
    its storage stays allocated to the step's end whatever the schedule frees. A step of T5
    or GPT-2 whose peak came after the loss gradient's free measured 4 bytes over its
    prediction."""
    return g._derived("simulator_root_tangents", lambda g: root_tangent_array(g).tolist())


def root_tangent_array(g: Graph) -> np.ndarray:
    """:func:`root_tangents` as a bool array (read-only)."""
    def roots(g: Graph) -> np.ndarray:
        out = np.zeros(len(g), dtype=bool)
        nodes = g.nodes
        tangents = np.flatnonzero(g._role_code == _ROLE_CODE["tangent"]).tolist()
        out[[i for i in tangents if nodes[i].shape is not None and len(nodes[i].shape) == 0]] = True
        return out
    return g._derived("simulator_root_tangent_array", roots)
