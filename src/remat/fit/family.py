"""A training step's graph at any batch or sequence, from captures at three small sizes (no torch).

A step captured at sizes ``s1 < s2 < s3`` (the same model, the batch or the sequence changed)
gives three graphs with the same nodes; each node's numbers are then functions of the size:

- a **shape** dimension is linear in it (``batch``, ``sequence``, ``3 * hidden``, ...): fitted
  through the first two captures and checked on the third;
- **bytes** follow the shape where the node has one (``bytes(s) = bytes(s1) * numel(s) /
  numel(s1)``), else a polynomial of degree at most 2 through the three captures (an
  attention's scores are quadratic in the sequence);
- **FLOPs** and a captured ``workspace`` likewise a polynomial of degree at most 2.

:meth:`GraphFamily.at` builds the graph at any size from these, so that a search over sizes
plans graphs it never captured, as :func:`remat.graph.batch.scale_batch` does for Checkmate's
graphs (every byte linear in the batch). A node whose structure differs between captures (a
different op, inputs or role) is an error: the step is not the same program at each size
(capture at larger sizes, where size-1 specializations are gone).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..errors import GraphError
from ..graph.graph import Graph


def _lagrange(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """The polynomial of degree ``len(xs) - 1`` through ``(xs, ys)`` at ``x``."""
    total = 0.0
    for i, (xi, yi) in enumerate(zip(xs, ys)):
        w = 1.0
        for j, xj in enumerate(xs):
            if j != i:
                w *= (x - xj) / (xi - xj)
        total += w * yi
    return total


def _dims(shapes: tuple[tuple[int, ...], ...], xs: tuple[int, ...]) -> tuple[tuple[float, float], ...] | None:
    """Each dimension as ``(intercept, slope)`` in the size, fitted through the first two
    shapes and checked on the others; None where a dimension is not linear."""
    if len({len(s) for s in shapes}) != 1:
        return None
    out = []
    for d in range(len(shapes[0])):
        v = [s[d] for s in shapes]
        slope = (v[1] - v[0]) / (xs[1] - xs[0])
        a = v[0] - slope * xs[0]
        if any(abs(a + slope * x - vi) > 1e-9 for x, vi in zip(xs, v)):
            return None
        out.append((a, slope))
    return tuple(out)


@dataclass(frozen=True)
class _Fit:
    dims: tuple[tuple[float, float], ...] | None
    bytes: tuple[float, ...]
    flops: tuple[float, ...]
    workspace: tuple[float, ...] | None


class GraphFamily:
    """The graphs of one step at every size, from ``graphs`` captured at ``sizes`` (three,
    ascending; see the module docstring). ``what`` names the size (``"batch"`` or
    ``"sequence"``) in messages.

    >>> from remat.graph.graph import Graph, Node
    >>> def step(b):
    ...     return Graph([Node("x", "placeholder", role="input", bytes=8 * b, shape=(b, 2), dtype="float32"),
    ...                   Node("y", "mul", ("x",), bytes=8 * b, shape=(b, 2), dtype="float32",
    ...                        category="pointwise", flops=2 * b, is_output=True)])
    >>> fam = GraphFamily((2, 3, 4), [step(2), step(3), step(4)])
    >>> fam.at(100)["y"].bytes, fam.at(100)["y"].shape
    (800, (100, 2))
    """

    def __init__(self, sizes, graphs, what: str = "batch") -> None:
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) != 3 or len(graphs) != 3 or not sizes[0] < sizes[1] < sizes[2]:
            raise GraphError(f"a graph family needs three captures at ascending sizes, got sizes {sizes}")
        self.sizes, self.graphs, self.what = sizes, list(graphs), what
        base = self.graphs[0]
        self.base = base
        self._fits: dict[str, _Fit] = {}
        for g, s in zip(self.graphs[1:], sizes[1:]):
            if [n.name for n in g.nodes] != [n.name for n in base.nodes]:
                raise GraphError(f"the step captured at {what} {s} has other nodes than at {sizes[0]} "
                                 f"({len(g)} against {len(base)}): it is not the same program at each "
                                 f"size; capture at larger sizes")
        for i, n in enumerate(base.nodes):
            ns = [g.nodes[i] for g in self.graphs]
            for m in ns[1:]:
                if (m.op, m.inputs, m.role) != (n.op, n.inputs, n.role):
                    raise GraphError(f"node {n.name!r} differs between the captures at {what} "
                                     f"{sizes} ({n.op}{n.inputs} vs {m.op}{m.inputs}); capture at "
                                     "larger sizes")
            dims = _dims(tuple(m.shape for m in ns), sizes) if all(m.shape is not None for m in ns) else None
            ws = [m.meta.get("workspace") for m in ns]
            self._fits[n.name] = _Fit(dims, tuple(float(m.bytes) for m in ns),
                                      tuple(float(m.flops or 0.0) for m in ns),
                                      tuple(float(w) for w in ws) if all(w is not None for w in ws) else None)

    def __len__(self) -> int:
        return len(self.base)

    def at(self, size: int, base_size: int | None = None) -> Graph:
        """The step's graph at ``size`` (``base_size`` is ignored: the signature of a search's
        ``scale``, :func:`remat.fit.search.max_batch`)."""
        size = int(size)
        if size < 1:
            raise GraphError(f"{self.what} must be at least 1, got {size}")
        if size in self.sizes:
            return self.graphs[self.sizes.index(size)]
        xs = self.sizes
        nodes = []
        for n in self.base.nodes:
            f = self._fits[n.name]
            changes: dict = {}
            if f.dims is not None and n.shape is not None:
                shape = tuple(round(a + b * size) for a, b in f.dims)
                numel0 = 1
                for d in n.shape:
                    numel0 *= d
                numel = 1
                for d in shape:
                    numel *= d
                changes["shape"] = shape
                changes["bytes"] = round(n.bytes * numel / numel0) if numel0 else \
                    max(0, round(_lagrange(xs, f.bytes, size)))
            else:
                changes["bytes"] = max(0, round(_lagrange(xs, f.bytes, size)))
            if any(f.flops):
                changes["flops"] = max(0.0, _lagrange(xs, f.flops, size))
            if f.workspace is not None:
                changes["meta"] = {**n.meta, "workspace": max(0, round(_lagrange(xs, f.workspace, size)))}
            nodes.append(n.replace(**changes))
        g = Graph(nodes, name=f"{self.base.name}@{self.what}{size}")
        g.meta.update(copy.deepcopy(self.base.meta))
        return g
