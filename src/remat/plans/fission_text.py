"""A fission region in the user's terms: which modules it runs, along which dimension, in how
many parts ("lm_head + loss in 16 token parts"), for :meth:`remat.plans.plan.Plan.summary`.

The modules come from the nodes' ``meta["module"]`` (capture records the module path that
ran each op), read from the region's parts in the split graph (``part_name(v, 0)``) or from
the nodes themselves in the graph before the split. Ops that ran in the model itself after
its last module, where a region merges a scalar, are its loss. The model's own path, the
prefix every recorded path shares, is left out. The dimension is named
"batch" when its length is the first dimension of a step input, "token" when it is the
product of the first two (batch x sequence, merged by a view), else by its length.

>>> from remat.graph.graph import Graph, Node
>>> from remat.graph.fission import Fission
>>> g = Graph([Node("ids", "placeholder", (), role="input", shape=(4, 256), category="input"),
...            Node("mm", "mm", ("ids",), shape=(1024, 8), meta={"module": "m.lm_head"}),
...            Node("loss", "sum", ("mm",), shape=(), meta={"module": "m"})])
>>> f = Fission(("mm", "loss"), {"mm": 0, "loss": -1}, 16, 1024, {"ids": 0}, {"loss": -1})
>>> describe_fission(g, f)
'lm_head + loss in 16 token parts'
"""

from __future__ import annotations

from ..graph.fission import MERGED, Fission, part_name
from ..graph.graph import Graph

MODULES_SHOWN = 3
"""The most module names a description lists (more: the first and the last)."""


def describe_fission(g: Graph, f: Fission) -> str:
    modules = _modules(g, f)
    return f"{modules} in {f.n} {_dimension(g, f)}parts"


def _module(g: Graph, v: str) -> str | None:
    for name in (v, part_name(v, 0)):
        if name in g:
            return g[name].meta.get("module")
    return None


def _modules(g: Graph, f: Fission) -> str:
    root = _common_path([m for n in g.nodes if (m := n.meta.get("module"))])
    names: list[str] = []
    rooted = False  # ops the model itself ran, outside its modules
    for v in f.nodes:
        path = _module(g, v)
        node = g[v] if v in g else g[part_name(v, 0)] if part_name(v, 0) in g else None
        if node is not None and not node.is_forward:
            continue  # the backward runs where its forward ran
        if not path or path == root:
            rooted = True
            continue
        short = path[len(root) + 1:] if root and path.startswith(root + ".") else path
        if short not in names:
            names.append(short)
    if len(names) > MODULES_SHOWN:
        names = [names[0], "...", names[-1]]
    if rooted and any(d in MERGED and u in g and not g[u].shape for u, d in f.outputs.items()):
        names.append("loss")  # a scalar merged from the parts
    return " + ".join(names) or f"{len(f.nodes)} ops"


def _common_path(paths: list[str]) -> str:
    """The module path every one of ``paths`` starts with (the whole model's)."""
    if not paths:
        return ""
    parts = [p.split(".") for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    return ".".join(common)


def _dimension(g: Graph, f: Fission) -> str:
    shapes = [n.shape for n in g.nodes if n.role == "input" and n.shape]
    if any(s[0] == f.length for s in shapes):
        return "batch "
    if any(len(s) >= 2 and s[0] * s[1] == f.length for s in shapes):
        return "token "
    return f"(of {f.length}) "
