"""``remat capture``: write the joint graph of a zoo model's training step to JSON."""

from __future__ import annotations

from rich.console import Console

from .. import zoo
from ..api import plan
from ..graph.io import save_graph


def run(args) -> int:
    case = zoo.build(args.model, args.size)
    graph = plan(case.model, *case.inputs).graph
    graph.name = args.model
    save_graph(graph, args.out)
    Console(stderr=True).print(f"wrote {len(graph)} nodes of {args.model!r} ({args.size}) to {args.out}")
    return 0
