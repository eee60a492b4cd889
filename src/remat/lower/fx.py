"""Lowering a Schedule to the forward and backward fx graphs that PyTorch compiles.

Every plan lowers this one way. The schedule's forward and backward phases and the saved set
between them come from :func:`remat.plans.phases.split_schedule`; PyTorch's own extraction
(:func:`remat.capture.joint.partition_with_saved`) builds the two modules' inputs and outputs
from the saved set, and their bodies are then rebuilt in statement order: a node computed
again becomes a fresh copy, so every later reader uses the copy, and fx frees each value
after its last use, as the schedule frees it.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..capture import joint as tc
from ..errors import PlanError
from ..plans.phases import split_schedule
from ..plans.plan import Plan
from ..plans.schedule import Statement


def in_statement_order(gm: fx.GraphModule, joint: fx.GraphModule, stmts: list[Statement], *,
                       extra_inputs: list[str] = (), extra_outputs: list[str] = (),
                       num_fwd_outputs: int = 0) -> fx.GraphModule:
    """``gm`` running its body in ``stmts`` order. When every node the statements compute is
    in ``gm`` once and nothing is to be added, ``gm``'s own nodes are moved into that order
    (:func:`reorder`); otherwise the module is rebuilt (:func:`rebuild`)."""
    computes = [s.node for s in stmts if s.op == "compute"]
    own = {n.name: n for n in gm.graph.nodes}
    inputs = {n.name for n in gm.graph.find_nodes(op="placeholder")}
    body = [c for c in computes if c not in inputs]
    if not extra_inputs and not extra_outputs and len(set(body)) == len(body) and all(c in own for c in body):
        return reorder(gm, [own[c] for c in body])
    return rebuild(gm, joint, stmts, extra_inputs=extra_inputs, extra_outputs=extra_outputs,
                   num_fwd_outputs=num_fwd_outputs)


def reorder(gm: fx.GraphModule, order: list[fx.Node]) -> fx.GraphModule:
    """Move ``gm``'s nodes so that ``order`` runs first, each node right after the inputs it
    needs (placed first when they are not in ``order``); the other nodes follow as they were.
    Returns ``gm`` (recompiled only if something moved)."""
    graph = gm.graph
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    placed = set(placeholders)
    cursor = placeholders[-1] if placeholders else None
    sequence: list[fx.Node] = []
    for root in order:
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if n in placed:
                continue
            if expanded:
                placed.add(n)
                sequence.append(n)
                continue
            stack.append((n, True))
            stack.extend((i, False) for i in reversed(n.all_input_nodes) if i not in placed)
    current = [n for n in nodes if n in placed and n.op != "placeholder"]
    if current == sequence:
        return gm
    for n in sequence:
        if cursor is None:
            nodes[0].prepend(n)
        else:
            cursor.append(n)
        cursor = n
    graph.lint()
    gm.recompile()
    return gm


def rebuild(gm: fx.GraphModule, joint: fx.GraphModule, stmts: list[Statement], *,
            extra_inputs: list[str] = (), extra_outputs: list[str] = (),
            num_fwd_outputs: int = 0) -> fx.GraphModule:
    """``gm``'s placeholders and output, with its body recomputed in ``stmts`` order.

    A compute of a value that is current (a placeholder, or computed and not freed since)
    is skipped; any other compute copies the joint graph's node with its inputs' current
    versions. Nodes the output needs that no statement computes (symbolic sizes, RNG state
    plumbing added by the extraction) are copied from ``gm`` on demand.
    """
    joint_nodes = {n.name: n for n in joint.graph.nodes}
    own = {n.name: n for n in gm.graph.nodes}
    new = fx.Graph()
    env: dict[str, fx.Node] = {}
    current: set[str] = set()
    for p in gm.graph.find_nodes(op="placeholder"):
        if extra_inputs and tc.is_tangent_like(p):
            # saved values PyTorch's extraction dropped (its own backward would not read
            # them) go after the other saved values, before the tangents
            for name in extra_inputs:
                src = joint_nodes[name]
                ph = new.placeholder(name)
                ph.meta = dict(src.meta)
                env[name] = ph
                current.add(name)
            extra_inputs = ()
        env[p.name] = new.node_copy(p)
        current.add(p.name)

    def get(name: str) -> fx.Node:
        if name in env:
            return env[name]
        node = own.get(name) or joint_nodes[name]
        if node.op == "placeholder":
            raise PlanError(f"lowered module reads {name!r}, which it does not receive")
        copy = new.node_copy(node, lambda a: get(a.name))
        env[name] = copy
        current.add(name)
        return copy

    for s in stmts:
        if s.op == "free":
            current.discard(s.node)
            continue
        if s.node in current or s.node not in joint_nodes:
            continue
        jn = joint_nodes[s.node]
        if jn.op == "placeholder":
            continue
        env.pop(s.node, None)
        env[s.node] = new.node_copy(jn, lambda a: get(a.name))
        current.add(s.node)
    out = gm.graph.find_nodes(op="output")[0]
    out_copy = new.node_copy(out, lambda a: get(a.name))
    if extra_outputs:
        values = list(out_copy.args[0])
        saved = values[num_fwd_outputs:]
        tensors = sum(1 for v in saved if isinstance(v, fx.Node)
                      and isinstance(v.meta.get("val"), torch.Tensor))
        at = num_fwd_outputs + tensors  # after the saved tensors, before saved symbolic sizes
        values[at:at] = [get(n) for n in extra_outputs]
        out_copy.args = (tuple(values),) + tuple(out_copy.args[1:])
    new.eliminate_dead_code()
    new.lint()
    return fx.GraphModule(gm, new)


def lower(joint: tc.JointInfo, plan: Plan) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules that run ``plan``: the backward receives ``plan.saved`` and
    the step's outputs its schedule reads; both bodies follow the plan's schedule.

    A schedule keeps the step's outputs to the end, so its backward reads an output the plan
    does not save from the forward's. So does the lowered backward: it receives the output,
    which costs no memory while the caller holds it. Computed again instead, an OPT's logits
    (1 MiB, a matmul) were allocated at the backward's start beside the caller's, and its plan
    for 0.8 measured 0.7% above its prediction."""
    split = split_schedule(plan.schedule())
    saved = list(plan.saved_names)
    g = plan.graph
    saved += [s for s in split.saved if s not in saved and g[s].is_output and not g[s].is_primal]
    by_name = {n.name: n for n in joint.gm.graph.nodes}
    missing = [s for s in saved if s not in by_name]
    if missing:
        raise PlanError(f"saved values {missing[:3]} are not in the joint graph")
    fw, bw = tc.partition_with_saved(joint, [by_name[s] for s in saved])
    received = {p.name for p in bw.graph.find_nodes(op="placeholder")}
    dropped = [s for s in saved if s not in received]
    fw = in_statement_order(fw, joint.gm, split.forward, extra_outputs=dropped,
                            num_fwd_outputs=joint.num_fwd_outputs)
    bw = in_statement_order(bw, joint.gm, split.backward, extra_inputs=dropped)
    return fw, bw
