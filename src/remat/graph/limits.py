"""The bounds every graph is held to where it enters remat (no torch).

A graph reaches the planner from a file (:func:`remat.graph.io.load_graph`), from capture, or
built in Python; each way ends in the :class:`~remat.graph.Graph` constructor, which checks
every node against these bounds, and :func:`remat.solve` refuses a graph with nothing to plan
(:func:`check_plannable`). A file is also held to a size and a nesting depth before it is
parsed (:mod:`remat.graph.io`). Each bound is far above any real training step and far below
where the solvers' arithmetic (int64 byte counts, float times) would overflow, so a value
past one is a broken file, not a big model; the error names the node, the value and the bound.

>>> from remat.graph import Graph, Node
>>> Graph([Node("x", "placeholder", role="input", bytes=2**60, category="input")])
Traceback (most recent call last):
...
remat.errors.GraphError: node 'x' has bytes=1152921504606846976: more than 1 PiB (2**50 bytes) in one tensor, more than any device holds; is the file corrupt?
"""

from __future__ import annotations

import os

from ..errors import GraphError

MAX_NODE_BYTES = 1 << 50
"""Bytes of one node's output (1 PiB)."""

MAX_TOTAL_BYTES = 1 << 56
"""Bytes of all the nodes of one graph together (64 PiB): the sums the simulator and the
min cut's capacities take stay far inside int64."""

MAX_WORK = 1e30
"""FLOPs, or profiled cost, of one op: 10^30 is 10^12 seconds of an exaflop machine."""

MAX_DIM = 1 << 50
"""Elements along one dimension of a shape."""

MAX_RANK = 64
"""Dimensions of one shape."""

MAX_DEPTH = 32
"""Nesting of a node's or a graph's ``meta`` (objects and lists within one another)."""

MAX_FILE_BYTES = 2 << 30
"""Bytes of a graph file, and of a gzipped one once decompressed (2 GiB; the largest
Checkmate graph shipped is 0.3 MB): ``$REMAT_MAX_GRAPH_BYTES`` sets another."""

MAX_FILE_ENV = "REMAT_MAX_GRAPH_BYTES"


def max_file_bytes() -> int:
    """:data:`MAX_FILE_BYTES`, or ``$REMAT_MAX_GRAPH_BYTES`` where that is a positive integer."""
    raw = os.environ.get(MAX_FILE_ENV, "").strip().replace("_", "")
    if not raw:
        return MAX_FILE_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise GraphError(f"${MAX_FILE_ENV}={raw!r} is not a positive number of bytes; unset it for "
                         f"the default ({MAX_FILE_BYTES} bytes)")
    return int(raw)


def depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar: 0), counted without recursion
    and only up to ``limit + 1``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def check_meta(where: str, meta: object) -> None:
    """``meta`` nests at most :data:`MAX_DEPTH` deep (deeper breaks hashing it for the plan
    cache and writing it back)."""
    if depth(meta) > MAX_DEPTH:
        raise GraphError(f"{where}: 'meta' nests more than {MAX_DEPTH} levels deep; keep it to plain "
                         "facts (names, numbers, short lists)")


def check_shape(where: str, shape: object) -> None:
    """A shape is a list of at most :data:`MAX_RANK` whole numbers in ``[0, MAX_DIM]``."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK:
        raise GraphError(f"{where}: 'shape' must be a list of at most {MAX_RANK} sizes, got {_short(shape)}")
    for s in shape:
        if type(s) is not int or not 0 <= s <= MAX_DIM:
            raise GraphError(f"{where}: 'shape' holds {_short(s)}; sizes are whole numbers from 0 to "
                             f"2**50")


def check_plannable(graph) -> None:
    """A graph :func:`remat.solve` can plan: one with a node (an empty graph has nothing to
    save or recompute: it would 'plan' with a peak of 0)."""
    if len(graph) == 0:
        raise GraphError(f"graph {graph.name!r} has no nodes: there is nothing to plan (a training "
                         "graph has inputs, forward nodes and the backward's)")


def _short(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["MAX_DEPTH", "MAX_DIM", "MAX_FILE_BYTES", "MAX_NODE_BYTES", "MAX_RANK", "MAX_TOTAL_BYTES",
           "MAX_WORK", "check_meta", "check_plannable", "check_shape", "depth", "max_file_bytes"]
