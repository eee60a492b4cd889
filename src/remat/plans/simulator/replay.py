"""The replay: walk a schedule's statements in order, each handled by the rules of its kind
(:mod:`.compute`, :mod:`.free`, :mod:`.copies`), then gather the result."""

from __future__ import annotations

import numpy as np

from ..schedule import Schedule, required_nodes
from .compute import compute
from .copies import offload, reload
from .free import free
from .result import SimResult
from .state import Replay
from .streams import wait_seconds

HANDLERS = {"compute": compute, "free": free, "offload": offload, "reload": reload}
"""The rules of each statement kind."""


def replay(schedule: Schedule, r: Replay) -> SimResult:
    """Walk ``schedule`` statement by statement, updating ``r``."""
    index = r.g._index
    timeline = r.timeline
    times, tl, copy_ends = r.times, r.tl, r.copy_ends
    for k, st in enumerate(schedule.statements):
        i = index.get(st.node)
        if i is None:
            r.err(f"statement {k}: {st} names no node of the graph")
            tl.append(r.mem)
            continue
        handler = HANDLERS.get(st.op)
        if handler is None:
            r.err(f"statement {k}: unknown op {st.op!r}")
        else:
            handler(r, k, st, i)
        if timeline and len(times) <= k:
            times.append(("", r.t_comp, r.t_comp))
        r.mem -= copy_ends.pop(k, 0)
        if timeline:
            tl.append(r.mem)
    r.flush()
    return result(r)


def result(r: Replay) -> SimResult:
    """The :class:`SimResult` of a finished replay: every required node must have been computed."""
    g = r.g
    missing_req = np.flatnonzero(required_nodes(g) & ~np.array(r.computed, dtype=bool)).tolist()
    for i in missing_req[:5]:
        r.err(f"required node {g.nodes[i].name!r} is never computed")
    n_unique = sum(r.computed)
    wait = wait_seconds(r)
    return SimResult(
        valid=not r.errors, errors=r.errors, peak_bytes=int(r.peak), peak_statement=r.peak_at,
        timeline=r.tl, constant_bytes=r.constant, end_bytes=int(r.mem),
        compute_cost=r.compute_cost, traffic_bytes=int(r.traffic_total),
        predicted_seconds=r.cm.seconds(r.compute_cost, r.traffic_total, r.arith_total, r.kernels, g) + wait,
        computes=r.n_computes, recomputes=r.n_computes - n_unique, offloads=r.n_off, reloads=r.n_rel,
        copy_seconds=r.busy_copy, wait_seconds=wait, host_peak_bytes=r.host_peak, times=r.times,
    )
