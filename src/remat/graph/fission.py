"""A fission f = (S, D, n) (seeds/004 Section 4.2): run the sub-graph S as n parts, one after
another, each on a 1/n slice of one dimension D, so that S's intermediates are 1/n the size.

This module holds the record and the names every layer gives the nodes a fission makes, so
that the torch-free transform (:mod:`remat.transforms.fission`) and the lowering to fx
(:mod:`remat.lower.fission`) build the same graph:

- part ``k`` of region node ``v``: ``part_name(v, k)``; its output is ``v``'s with dimension
  ``axis[v]`` divided by n (``axis[v] >= 0``), or as large as ``v`` (a reduce axis, ``< 0``:
  each part computes a partial sum);
- slice ``k`` of an external input ``u`` the region splits: ``slice_name(u, index, k)``, the
  view ``u[..., k*L/n:(k+1)*L/n, ...]`` along dimension ``sliced[u]`` (``index``: the fission's
  position in its plan, so two fissions that slice one input do not clash);
- every other external input is shared by the parts (weights);
- a region output (a node of S read outside S, or an output of the step) keeps its name: its
  node becomes the merge, ``cat(parts, dim)`` when ``outputs[v] >= 0``, or, for a reduce axis
  (``outputs[v] == -1``), the sum of the parts, built as ``sum_name(v, 1) = p0 + p1``,
  ``sum_name(v, 2) = sum_name(v, 1) + p2``, ..., the last of these named ``v`` itself; a mean
  over the split dimension (``outputs[v] == -2``, :data:`MEAN`) is the sum of its parts' sums
  divided by the whole count: each part is a ``sum`` (same dims), every add is a
  ``sum_name``, and ``v`` is ``sum_name(v, n - 1) / count``;
- the region's other nodes are gone (only their parts remain).

>>> f = Fission(nodes=("a", "b"), axis={"a": 0, "b": 0}, n=2, length=8, sliced={"x": 0},
...             outputs={"b": 0})
>>> part_name("b", 1), slice_name("x", 0, 1), Fission.from_dict(f.to_dict()) == f
('b__part1', 'x__slice0_1', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SUM = -1
"""``outputs[v]`` for an output merged by adding the parts (its axis is a sum-like reduce axis)."""

MEAN = -2
"""``outputs[v]`` for a mean over the split dimension: its parts are sums, its merge their sum
divided by the number of elements the whole mean averages."""

MERGED = (SUM, MEAN)
"""The merges of a reduce axis (a part is as large as the whole)."""


def part_op(op: str) -> str:
    """The op a part of a mean runs (a sum over the same dims; other ops run as they are)."""
    return {"mean.dim": "sum.dim_IntList", "mean.default": "sum.default"}.get(op, op)


def part_name(node: str, k: int) -> str:
    return f"{node}__part{k}"


def slice_name(node: str, index: int, k: int) -> str:
    return f"{node}__slice{index}_{k}"


def sum_name(node: str, k: int) -> str:
    return f"{node}__sum{k}"


@dataclass(frozen=True)
class Fission:
    """One fission region. ``nodes``: S in topological order; ``axis``: each node's dimension
    in D (``>= 0``: an output dimension, ``< 0``: a reduce axis); ``n``: the number of parts
    (1: disabled, the region runs whole); ``length``: the dimension's length (n divides it);
    ``sliced``: external inputs split along the given dimension; ``outputs``: region outputs,
    concatenated along the given dimension or summed (:data:`SUM`); ``index``: the fission's
    position in its plan (names of slices)."""

    nodes: tuple[str, ...]
    axis: Mapping[str, int]
    n: int
    length: int
    sliced: Mapping[str, int]
    outputs: Mapping[str, int]
    index: int = 0
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        for name in ("axis", "sliced", "outputs"):
            object.__setattr__(self, name, dict(getattr(self, name)))

    def __hash__(self) -> int:
        return hash((self.nodes, self.n, self.index))

    @property
    def enabled(self) -> bool:
        return self.n > 1

    def with_n(self, n: int) -> "Fission":
        return Fission(self.nodes, self.axis, n, self.length, self.sliced, self.outputs,
                       self.index, self.label)

    def with_index(self, index: int) -> "Fission":
        return Fission(self.nodes, self.axis, self.n, self.length, self.sliced, self.outputs,
                       index, self.label)

    def part_length(self) -> int:
        return self.length // self.n

    def to_dict(self) -> dict[str, Any]:
        d = {"nodes": list(self.nodes), "axis": dict(self.axis), "n": self.n,
             "length": self.length, "sliced": dict(self.sliced), "outputs": dict(self.outputs),
             "index": self.index}
        if self.label:
            d["label"] = self.label
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Fission":
        return cls(nodes=tuple(d["nodes"]), axis={k: int(v) for k, v in d["axis"].items()},
                   n=int(d["n"]), length=int(d["length"]),
                   sliced={k: int(v) for k, v in d["sliced"].items()},
                   outputs={k: int(v) for k, v in d["outputs"].items()},
                   index=int(d.get("index", 0)), label=d.get("label", ""))
