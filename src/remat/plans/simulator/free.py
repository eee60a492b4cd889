"""``free v``: release a value; its storage goes when nothing resident lives in it (on a CPU,
when the open kernel group ends). An offloaded value's free waits for its copy (the lowering's
``ao.wait_tensor`` stands there)."""

from __future__ import annotations

from ..schedule import Statement
from .state import Replay


def free(r: Replay, k: int, st: Statement, i: int) -> None:
    if r.primal[i] or r.keep[i]:
        r.err(f"statement {k}: {st}: {r.g.nodes[i].role} values and outputs are kept to the end")
    elif not r.resident[i]:
        r.err(f"statement {k}: {st}: value is not resident")
    else:
        r.resident[i] = False
        if r.copying[i] and r.off_end[i] > r.t_comp:  # the lowering waits for the copy here
            if r.timeline:
                r.times.append(("wait", r.t_comp, r.off_end[i]))
            r.t_comp = r.off_end[i]
        for h in r.held[i]:
            r.release(h)
        r.held[i] = ()
        if r.counted[i] and not r.root[i]:  # a loss's gradient stays to the end (.tuples)
            r.release(r.owner[i])
        for h in r.tuple_held[i]:  # a tuple: the items it still holds (.tuples)
            r.release(h)
        r.tuple_held[i] = ()
