"""What runs a graph remat cannot plan: PyTorch's own partitioner, with the user's bound kept.

When capture, planning or lowering fails on a graph (a ``torch.cond``, an op remat does not
know, a bug), :class:`~remat.lower.partitioner.RematPartitioner` hands the graph to PyTorch's
partitioner (``min_cut_rematerialization_partition``) instead, unless ``strict=True``. The
budget the user asked for is never dropped on the way:

- **bytes** are a guarantee. The graph is captured again with the ops remat cannot plan as
  opaque nodes (:func:`remat.capture.to_graph.graph_from_joint` with ``opaque=True``: their
  transient memory is their subgraphs' peak of live values, run op by op), and PyTorch's
  partition is judged there by the simulator, at PyTorch's ``activation_memory_budget`` as the
  user set it, then lower on :data:`KNOB_LADDER` until the predicted peak fits the graph's share
  of the budget less :data:`FALLBACK_HEADROOM`; a knob that would recompute a random op (PyTorch draws it
  afresh) is skipped. If none fits, or the graph cannot be judged at all, the step is refused
  with :class:`~remat.errors.InfeasibleBudgetError` naming the fallback's reason;
- **a fraction** (or ``"min"``) is a target: the graph runs as plain ``torch.compile`` runs it,
  all of its activation memory, and the warning says the budget is not applied to it.

Each fallback warns once per graph and reason (:class:`~remat.errors.RematFallbackWarning`),
for every model and budget, and where the graph could be judged, ``on_plan`` (and so
:func:`remat.plan_all`) gets its plan, whose summary names the fallback and its reason
(``plan.fallback``).
"""

from __future__ import annotations

import warnings
from typing import Any

from torch._functorch import config as functorch_config

from ..capture import joint as tc
from ..cost.model import constant_bytes, default_cost_model
from ..errors import InfeasibleBudgetError, RematFallbackWarning
from ..plans.budget import format_bytes
from ..plans.plan import Plan

FALLBACK_HEADROOM = 0.05
"""The share of a graph's byte budget a fallback keeps free (remat's own plans keep
:data:`~remat.plans.budget.TORCH_HEADROOM`, 1%): PyTorch's partition is judged, not planned,
its opaque ops' transients are estimated, and inductor orders it its own way
(``benchmarks/fallback_trial.py``: predicted 2.7% under its measured peak at one knob)."""

KNOB_LADDER = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
"""The values of PyTorch's ``activation_memory_budget`` a byte budget's fallback tries, from
the user's own setting down, until PyTorch's partition is predicted to fit."""


def fall_back(part, backup, joint_inputs, kwargs: dict[str, Any], reason: str):
    """The forward and backward modules PyTorch's partitioner makes of the joint graph
    ``backup`` for ``part`` (a :class:`~remat.lower.partitioner.RematPartitioner`) that could
    not plan it for ``reason``, keeping the budget as the module docstring says. PyTorch
    partitions it once at the user's ``activation_memory_budget`` (plain torch.compile's
    partition, and the reference a fraction is of, when that is 1.0); the graph is captured
    and judged only where a budget or ``on_plan`` needs it."""
    budget = part.options.budget
    user = float(functorch_config.activation_memory_budget)
    fw, bw = tc.torch_mincut(tc.copy_joint(backup), joint_inputs, **kwargs)
    graph = plan = None
    kept = ""
    if budget is not None or part.options.on_plan is not None:
        reference = tc.saved_from_backward(bw) if user == 1.0 else None
        graph = _judging_graph(part, backup, joint_inputs, kwargs, reference)
    share = part.step.share(graph, constant_bytes(graph)) if graph is not None else None
    if budget is not None and budget.kind == "bytes":
        fw, bw, plan, kept = _within_bytes(part, graph, share, (fw, bw), backup, joint_inputs, kwargs, reason)
    else:
        plan = _judged(graph, bw, None) if graph is not None else None
        if budget is not None:
            kept = (f" Budget {budget.text!r} is not applied to it: it holds what plain torch.compile holds "
                    "(a fraction is a target; with a byte budget remat checks PyTorch's partition against it).")
    if plan is not None:
        part.step.planned(graph, plan.saved_activation_bytes, plan.peak_bytes)
        part._report(plan.updated(fallback=reason))
    if part.step.fell_back(part.graph_name, reason):
        warnings.warn(f"remat could not plan graph {part.graph_name!r} ({reason}); PyTorch's own "
                      f"partitioner runs it.{kept} Pass strict=True to raise instead.",
                      RematFallbackWarning, stacklevel=3)
    return fw, bw


def _judging_graph(part, backup, joint_inputs, kwargs, reference: list[str] | None):
    """The Graph PyTorch's partition of ``backup`` is judged on (opaque nodes where remat
    cannot look), with plain torch.compile's saved set as its reference (``reference``, or
    PyTorch's partition at 1.0 made here); None where even that cannot be captured."""
    try:
        joint = tc.prepare_joint(tc.copy_joint(backup), kwargs["num_fwd_outputs"],
                                 kwargs.get("static_lifetime_input_indices"))
        if reference is None and part.needs_reference():
            # made once per graph: the partitioner's, where it had made it before failing
            reference = part.reference if part.reference is not None else \
                part._reference_saved(backup, joint_inputs, kwargs)
        return part._capture(joint, reference, opaque=True)
    except Exception:  # noqa: BLE001 - without a graph a byte budget is refused, nothing else
        return None


def _judged(graph, bw, limit: int | None) -> Plan:
    """PyTorch's partition (the saved set its backward ``bw`` reads) as a plan of ``graph``,
    judged by the simulator against ``limit`` bytes, in inductor's order where inductor runs
    it (``solver="torch-mincut"``)."""
    saved = [s for s in tc.saved_from_backward(bw) if s in graph]
    return Plan.from_saved_set(graph, saved, solver="torch-mincut").judge(limit, default_cost_model(graph))


def _within_bytes(part, graph, share, first, backup, joint_inputs, kwargs, reason):
    """PyTorch's partition at the largest ``activation_memory_budget`` (``first``: the one made
    at the user's own, then down :data:`KNOB_LADDER`) predicted to fit ``share`` bytes less
    :data:`FALLBACK_HEADROOM`, without recomputing a random op; :class:`InfeasibleBudgetError`
    where none does or ``graph`` is None. Returns ``(fw, bw, plan, what the warning says)``."""
    text = part.options.budget.text
    name = part.graph_name
    if graph is None:
        raise InfeasibleBudgetError(
            f"remat could not plan graph {name!r} ({reason}), nor judge PyTorch's partition of it, so it "
            f"cannot hold the byte budget {text!r}: PyTorch's partitioner would run the graph unchecked. "
            "Pass budget=None (PyTorch's partitioner runs the graph, remat plans the others) or a fraction "
            "(a target), or rewrite the region remat cannot plan")
    limit = int(max(0, share) * (1.0 - FALLBACK_HEADROOM))
    user = float(functorch_config.activation_memory_budget)
    random = {n.name for n in graph.nodes if n.category == "random"}
    tried = []
    for knob in [user] + [k for k in KNOB_LADDER if k < user]:
        if knob == user:
            fw, bw = first
        else:
            try:
                with functorch_config.patch(activation_memory_budget=knob):
                    fw, bw = tc.torch_mincut(tc.copy_joint(backup), joint_inputs, **kwargs)
            except Exception:  # noqa: BLE001 - a knob PyTorch cannot partition at: the next one
                continue
        plan = _judged(graph, bw, limit)
        if knob < user and random.intersection(plan.recomputed):
            continue  # PyTorch would draw the random op afresh (pytorch#190758)
        tried.append((plan.peak_bytes, knob))
        if plan.feasible:
            at = "" if knob == user else f" at activation_memory_budget={knob:g}"
            kept = (f" Its share of the budget {text!r} holds: PyTorch's partition{at} is predicted to peak "
                    f"at {format_bytes(plan.peak_bytes)}, within {format_bytes(limit)}.")
            return fw, bw, plan.updated(solver="torch-mincut" + (f" (activation_memory_budget={knob:g})"
                                                                  if knob != user else "")), kept
    least = min(tried, default=None)
    floor = "" if least is None else (
        f" At its least, PyTorch's partition (activation_memory_budget={least[1]:g}) is predicted to peak at "
        f"{format_bytes(least[0])}.")
    smallest = None if least is None else int(least[0] / (1.0 - FALLBACK_HEADROOM)) + 1
    raise InfeasibleBudgetError(
        f"remat could not plan graph {name!r} ({reason}), and PyTorch's partitioner, which would run it "
        f"instead, does not fit its share of the budget {text!r} ({format_bytes(limit)} after the "
        f"{FALLBACK_HEADROOM:.0%} a fallback keeps free).{floor} Raise the budget, pass a fraction (a target) or "
        "budget=None, or rewrite the region remat cannot plan", smallest_feasible=smallest)
