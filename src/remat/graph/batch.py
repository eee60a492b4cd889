"""A Checkmate graph at another batch size (no torch): every per-example value scales.

See :mod:`remat.bench.max_batch` for the largest batch a solver fits and the assumptions.
"""

from __future__ import annotations

import re
from typing import Any

from .graph import Graph


_NAME_PATTERNS = (
    # graph metadata name: "VGG19 (MLSys)_256_(224, 224, 3)_train"
    re.compile(r"_(\d+)_\((\d+),\s*(\d+),\s*(\d+)\)"),
    # file stem: "VGG19_256_224_224_3_train_nx", "fcn_8_vgg_32_416_608_3_train_nx"
    re.compile(r"_(\d+)_(\d+)_(\d+)_(\d+)(?=(?:_train)?(?:_nx)?(?:\.json)?$)"),
)


def base_batch_of(name: str) -> int | None:
    """The batch size a Checkmate graph was exported at, from its name (``None`` if unknown)."""
    for pat in _NAME_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def _renamed(name: str, batch: int) -> str:
    for pat in _NAME_PATTERNS:
        m = pat.search(name)
        if m:
            return name[:m.start(1)] + str(batch) + name[m.end(1):]
    return f"{name}@batch{batch}"


def scale_batch(g: Graph, batch: int, base_batch: int | None = None, *,
                scale_cost: bool = True) -> Graph:
    """``g`` (a Checkmate graph at ``base_batch``) at batch size ``batch``.

    Every non-parameter value's bytes (the ``data`` input, activations, gradients, the loss)
    are multiplied by ``batch / base_batch`` and rounded to whole bytes; ``cost`` and
    ``flops`` likewise unless ``scale_cost=False`` (see the module docstring). Names, roles,
    edges and flags are kept; the graph's name gets the new batch (so scaling a scaled graph
    again works). ``base_batch`` defaults to the batch in the graph's name
    (``MODEL_BATCH_H_W_C``); a ``ValueError`` says so when there is none.
    """
    if base_batch is None:
        base_batch = base_batch_of(g.name)
        if base_batch is None:
            raise ValueError(f"graph {g.name!r}: no batch size in its name (MODEL_BATCH_H_W_C); "
                             "pass base_batch")
    batch, base_batch = int(batch), int(base_batch)
    if batch < 1 or base_batch < 1:
        raise ValueError(f"batch sizes must be positive, got batch={batch}, base_batch={base_batch}")

    def scaled_bytes(b: int) -> int:
        return (b * batch + base_batch // 2) // base_batch  # exact when b is a multiple of base

    nodes = []
    for n in g.nodes:
        if n.role == "param":
            nodes.append(n)
            continue
        changes: dict[str, Any] = {"bytes": scaled_bytes(n.bytes)}
        if scale_cost:
            f = batch / base_batch
            if n.cost is not None:
                changes["cost"] = float(n.cost) * f
            if n.flops:
                changes["flops"] = float(n.flops) * f
        nodes.append(n.replace(**changes))
    return Graph(nodes, name=_renamed(g.name, batch))
