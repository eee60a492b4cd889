"""``remat capture``: write the joint graph of a zoo model's training step to JSON.

``--abstract meta`` (or ``fake``) builds the model on the meta device (or under
``FakeTensorMode``) and captures it without allocating it, as :func:`remat.plan` does for a
model this machine cannot hold; ``--device`` / ``--profile`` record the device the graph is
planned for (``remat plan`` then prices it with that device's profile).
"""

from __future__ import annotations

import contextlib

import torch
from rich.console import Console

from .. import zoo
from ..api import plan
from ..graph.io import save_graph


def run(args) -> int:
    dtype = getattr(torch, getattr(args, "dtype", "float32") or "float32")
    abstract = getattr(args, "abstract", None)
    device = "meta" if abstract == "meta" else "cpu"
    if abstract == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        building = FakeTensorMode(allow_non_fake_inputs=True)
    else:
        building = torch.device("meta") if abstract == "meta" else contextlib.nullcontext()
    with building:  # the builder allocates nothing either
        case = zoo.build(args.model, args.size, batch=getattr(args, "batch", None), device=device, dtype=dtype)
    graph = plan(case.model, *case.inputs, device=getattr(args, "device", None),
                 profile=getattr(args, "profile", None)).graph
    graph.name = args.model
    save_graph(graph, args.out)
    where = graph.meta.get("device", {})
    target = f" for {where.get('name', where.get('type'))}" if where.get("target") else ""
    how = f", captured on {abstract} tensors" if abstract else ""
    Console(stderr=True).print(f"wrote {len(graph)} nodes of {args.model!r} ({args.size}{how}){target} to {args.out}")
    return 0
