"""The ways of running a training step that ``remat fit`` compares, each a plan of its graph (no
torch).

Every method gives a :class:`~remat.plans.Plan` of the step's graph judged by the simulator (its
peak and predicted time under the target GPU's cost model):

- ``none``: no checkpointing: the backward reads what the forward kept, nothing recomputed
  (PyTorch's ``default_partition``, eager autograd's saved set);
- ``torch``: plain ``torch.compile`` (PyTorch's min cut, ``activation_memory_budget`` 1.0: the
  graph's recorded reference, ``meta["reference_saved"]``);
- ``full``: full activation checkpointing, every block under ``torch.utils.checkpoint``, and
  ``torch.compile``: a block keeps only its inputs and recomputes the rest in the backward;
  outside the blocks (embeddings, head, loss) PyTorch's min cut saves what it saves without
  them (the graph's reference; without one, what no checkpointing keeps);
- ``torch-knob``: PyTorch's ``activation_memory_budget`` at :data:`KNOB` (its saved set,
  recorded at capture as ``meta["knob_saved"]``; only where it was);
- ``remat-0.5``: remat at half of plain ``torch.compile``'s activation memory (a fraction is a
  target: where remat cannot reach it, nothing is planned and the method does not fit);
- ``remat-min``: remat's least memory within its time bound (``budget="min"``), neither
  splitting nor offloading; ``remat-min-split`` lets it split sub-graphs (fission: a chunked
  loss, split attention or MLP) and ``remat-min-offload`` offload saved values to host memory
  over the GPU's link as well.

Checkmate's graphs compare their paper's strategies instead (:data:`CHECKMATE_METHODS`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from ..cost.model import CostModel
from ..errors import InfeasibleBudgetError, OptionError
from ..graph.graph import Graph
from ..plans.plan import Plan
from ..solvers import DEFAULT_TIME_LIMIT, solve

KNOB = 0.5
"""The ``activation_memory_budget`` the ``torch-knob`` method sets."""

METHODS = {
    "none": "no checkpointing (PyTorch's default_partition: eager autograd's saved set)",
    "torch": "plain torch.compile (PyTorch's min cut)",
    "full": "full checkpointing (every block under torch.utils.checkpoint), torch.compile",
    "torch-knob": f"PyTorch's activation_memory_budget={KNOB}",
    "remat-0.5": "remat, budget 0.5 of plain torch.compile's activation memory",
    "remat-min": "remat, budget 'min' (no fission, no offloading)",
    "remat-min-split": "remat, budget 'min' with fission (a chunked loss, split blocks)",
    "remat-min-offload": "remat, budget 'min' with fission and offloading to host memory",
}
"""The methods for a captured step, in the order of the table."""

DEFAULT_METHODS = ("none", "torch", "full", "torch-knob", "remat-0.5", "remat-min", "remat-min-split",
                   "remat-min-offload")

CHECKMATE_METHODS = {
    "checkpoint-all": "keep every activation (no recomputation)",
    "chen-sqrtn": "Chen et al.'s sqrt(n) checkpoints",
    "chen-greedy": "Chen et al.'s greedy segments",
    "griewank": "Griewank & Walther's binomial checkpointing",
    "checkmate-lp": "Checkmate's LP relaxation with two-phase rounding",
    "checkmate": "Checkmate's optimal MILP (slow: tens of seconds per probe)",
}
"""Checkmate's strategies (its paper's Figure 6), as remat's solvers of the same names."""

DEFAULT_CHECKMATE_METHODS = ("checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank", "checkmate-lp")


def check_methods(names, table: dict) -> tuple[str, ...]:
    """``names`` (a list, or one comma-separated string) checked against ``table``."""
    if isinstance(names, str):
        names = [s.strip() for s in names.split(",") if s.strip()]
    names = tuple(names)
    bad = [m for m in names if m not in table]
    if bad or not names:
        raise OptionError(f"unknown method {', '.join(map(repr, bad)) or '(none given)'}; use one or more of "
                          f"{', '.join(table)}")
    return names


def block_of(module: str | None, blocks: tuple[str, ...]) -> str | None:
    """The block (a qualified module name of ``blocks``) that ``module`` is in, or None. The
    capture's paths may carry a prefix (the name the traced function knew the model by:
    ``model.lm.transformer.h.0.attn`` for the block ``lm.transformer.h.0``).

    >>> block_of("model.lm.h.1.attn", ("lm.h.0", "lm.h.1")), block_of("model.lm.h.10", ("lm.h.1",))
    ('lm.h.1', None)
    """
    if not module:
        return None
    path = f".{module}."
    for b in blocks:
        if f".{b}." in path:
            return b
    return None


def full_checkpoint_saved(g: Graph, blocks: tuple[str, ...]) -> list[str]:
    """What full checkpointing saves (see the module docstring): of what plain
    ``torch.compile`` saves (``meta["reference_saved"]``; without it, what the forward keeps
    without checkpointing), the values outside every block; each block's inputs (forward
    values made outside it that a node in it reads); and inside a block only what may not be
    recomputed (random ops, values marked must-save). Outside the blocks PyTorch's partitioner
    still runs: a step under ``torch.compile`` keeps its min cut there (a Llama's loss on a
    32k vocabulary holds more than its four blocks do, and no checkpointing would keep it all)."""
    if not blocks:
        raise OptionError("full checkpointing needs the model's blocks (its transformer layers); "
                          "none were found: name them (a zoo entry's blocks, or the factory's 'blocks')")
    where = {n.name: block_of(n.meta.get("module"), blocks) for n in g.nodes}
    if not any(where.values()):
        raise OptionError(f"no node of graph {g.name!r} is in the blocks {list(blocks)[:3]}...: the capture "
                          "recorded no module paths for them")
    kept = g.meta.get("reference_saved")
    if kept is None:
        kept = solve(g, "checkpoint-all", time_limit=None).saved_names
    saved = [v for v in kept if where.get(v) is None or g[v].is_primal]
    saved += [n.name for n in g.nodes if n.is_primal]  # the recomputation reads them; unread ones drop out
    for n in g.nodes:
        if not n.is_forward or n.is_primal:
            continue
        b = where[n.name]
        if b is None:
            continue
        if n.must_save or n.category == "random":
            saved.append(n.name)
        for u in n.inputs:
            src = g[u]
            if src.is_forward and not src.is_primal and where[u] != b:
                saved.append(u)
    return list(dict.fromkeys(saved))


def with_offload(g: Graph, allowed: bool) -> Graph:
    """``g`` whose plans may (or may not) offload to host memory (``meta["offload"]``)."""
    out = Graph(g.nodes, name=g.name, meta=copy.deepcopy(g.meta))
    out.meta["offload"] = {"allowed": bool(allowed), "reason": "remat fit" if allowed else "remat fit: no offloading"}
    return out


def plan_step(method: str, g: Graph, cost_model: CostModel, *, blocks: tuple[str, ...] = (),
              time_limit: float | None = DEFAULT_TIME_LIMIT) -> Plan:
    """The plan ``method`` (:data:`METHODS`) makes of the captured step ``g``, judged under
    ``cost_model``; a plan that is not ``feasible`` where the method has none (a fraction remat
    cannot reach, a knob that was not captured)."""
    if method not in METHODS:
        check_methods([method], METHODS)
    if method in ("none", "torch", "full", "torch-knob"):
        if method == "none":
            saved = solve(g, "checkpoint-all", time_limit=None).saved_names
        elif method == "torch":
            saved = g.meta.get("reference_saved")
        elif method == "full":
            saved = full_checkpoint_saved(g, blocks)
        else:
            saved = g.meta.get("knob_saved")
        if saved is None:
            return Plan.without_schedule(g, solver=method, status="skipped",
                                         message=f"the capture recorded no saved set for {method!r}")
        return Plan.from_saved_set(g, [s for s in saved if s in g], solver=method).judge(None, cost_model)
    offload = method == "remat-min-offload"
    fission = method in ("remat-min-split", "remat-min-offload")
    budget = 0.5 if method == "remat-0.5" else "min"
    graph = with_offload(g, offload)
    try:
        return solve(graph, "auto", budget=budget, cost_model=cost_model, time_limit=time_limit, fission=fission)
    except InfeasibleBudgetError as e:
        return Plan.without_schedule(graph, solver=method, status="infeasible",
                                     message=f"out of reach: {budget} is below the least memory remat "
                                             f"finds (remat.compile runs min's plan there). {e}")


def checkmate_solver(method: str, time_limit: float | None) -> Callable[[Graph, float], Plan]:
    """``solve(graph, budget_bytes) -> Plan`` for one of Checkmate's strategies
    (:data:`CHECKMATE_METHODS`), with ``time_limit`` seconds per solve for the MILP and LP."""
    from ..solvers import info

    check_methods([method], CHECKMATE_METHODS)
    fn = info(method).fn
    if method in ("checkmate", "checkmate-lp"):
        return lambda g, budget: fn(g, budget, time_limit=time_limit)
    return fn
