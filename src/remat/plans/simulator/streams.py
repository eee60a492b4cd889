"""The two streams' clocks (seeds/004 Section 6.2, MAGIS's simulator), timed as the lowering
runs them (:mod:`remat.lower.offload`).

Computes run one after another on the compute stream, each taking its share of the fused
prediction (:func:`compute_seconds`) and starting once the reloads it reads are done; an
``offload`` or ``reload`` runs on the copy stream (on a CPU, on the one stream) for
``link.seconds(bytes)`` (:func:`copy`).
"""

from __future__ import annotations

from ...cost.transfer import Link


def compute_seconds(r, i: int, before: tuple) -> float:
    """The compute stream's time for ``i``: this statement's share of the fused prediction
    (:meth:`CostModel.seconds` of the arithmetic, traffic and kernels it added to the totals,
    which were ``before``), or its op cost in the additive view (profiled costs, or a step run
    op by op), so a view or a kernel fused into its reader hides no copy. ``r``: the
    :class:`~.state.Replay`."""
    if r.profiled:
        return r.op_cost[i]
    return ((r.arith_total - before[0]) + (r.traffic_total - before[1]) / r.bandwidth
            + (r.kernels - before[2]) * r.launch)


def copy(link: Link, nbytes: int, earliest: float, t_copy: float, t_comp: float):
    """One copy that may start at ``earliest``: (its start, its end, the copy clock, the
    compute clock) after it. An asynchronous link's copy waits for the copy stream; a
    synchronous one runs on the compute stream."""
    if link.asynchronous:
        start = max(earliest, t_copy)
        return start, start + link.seconds(nbytes), start + link.seconds(nbytes), t_comp
    start = max(earliest, t_comp)
    return start, start + link.seconds(nbytes), t_copy, start + link.seconds(nbytes)


def wait_seconds(r) -> float:
    """What copies add to the step: compute waiting for them, or copies running past its end."""
    return max(r.t_comp, r.t_copy) - r.busy_compute if r.copies else 0.0
