"""PyTorch's own partitions run in inductor's order, not in the schedule's.

remat compiles its own plans in their order (:mod:`remat.lower.plan_order`); a partition by
PyTorch's partitioners (``torch-mincut``, which plain ``torch.compile`` runs, ``no-recompute``)
compiles as inductor would. One of inductor's decisions moves memory across the peak: its
post-grad pattern ``add(x, mm(a, b)) -> addmm(x, a, b)`` computes the product where the sum is.
With tied embeddings (GPT-2, T5) the LM head's weight gradient is added to the embedding's at
the end of the backward, so the logits' gradient stays alive all through the backward: GPT-2
quick's partition measured 6,863,368 bytes above the step's start against a prediction of
6,601,224 (T5 quick 4.5% under). :func:`in_inductor_order` moves such a product to its sum and
the frees of its inputs after it, and the simulator judges that order for these partitions
under a fusing compiler.
"""

from __future__ import annotations

from ...graph.graph import Graph
from ..schedule import Schedule, Statement

TORCH_PARTITIONS = frozenset({"torch-mincut", "no-recompute", "torch-offload"})
"""The solvers whose partitions inductor compiles in its own order."""


def late_products(g: Graph) -> dict[str, str]:
    """``mm -> add``: backward products whose one reader is a sum (``add.Tensor``), which
    inductor's ``addmm`` pattern computes at the sum."""
    def pairs(g: Graph) -> dict[str, str]:
        a = g._arrays
        ptr, idx = a.user_ptr.tolist(), a.user_idx.tolist()
        kept = (a.is_output | a.backward_output).tolist()
        out = {}
        for i, n in enumerate(g.nodes):
            if n.op != "mm.default" or n.role != "backward" or kept[i]:
                continue
            readers = set(idx[ptr[i]:ptr[i + 1]])
            if len(readers) != 1:
                continue
            (r,) = readers
            if g.nodes[r].op == "add.Tensor" and g.nodes[r].role == "backward" and len(g.nodes[r].inputs) == 2:
                out[n.name] = g.nodes[r].name
        return out
    return g._derived("simulator_late_products", pairs)


def in_inductor_order(schedule: Schedule) -> Schedule:
    """``schedule`` with each late product (:func:`late_products`) computed right before its
    sum, and its inputs freed after it where the schedule freed them earlier. Products
    computed more than once, or whose inputs are computed again in between, stay where they
    are."""
    g = schedule.graph
    pairs = late_products(g)
    if not pairs:
        return schedule
    st = list(schedule.statements)
    for mm, add in pairs.items():
        at = [k for k, s in enumerate(st) if s.node == mm and s.op == "compute"]
        to = [k for k, s in enumerate(st) if s.node == add and s.op == "compute"]
        if len(at) != 1 or len(to) != 1 or to[0] < at[0]:
            continue
        k0, k1 = at[0], to[0]
        ins = list(dict.fromkeys(g[mm].inputs))
        moved_frees = []
        ok = True
        for j in ins:
            if g[j].is_primal:
                continue
            between = [k for k in range(k0 + 1, k1) if st[k].node == j]
            if any(st[k].op != "free" for k in between) or len(between) > 1:
                ok = False  # computed again, offloaded or reloaded in between
                break
            moved_frees += between
        if not ok:
            continue
        drop = set(moved_frees) | {k0}
        body = [s for k, s in enumerate(st) if k not in drop and k <= k1]
        pos = len(body) - 1  # the sum's compute
        frees = [Statement("free", st[k].node) for k in sorted(moved_frees)]
        st = body[:pos] + [Statement("compute", mm)] + [body[pos]] + frees + st[k1 + 1:]
    return Schedule(g, st, dict(schedule.meta))
