"""Lowering a Schedule to the forward and backward fx graphs that PyTorch compiles.

Every plan lowers this one way. The schedule's forward and backward phases and the saved set
between them come from :func:`remat.plans.phases.split_schedule`; PyTorch's own extraction
(:func:`remat.capture.joint.partition_with_saved`) builds the two modules' inputs and outputs
from the saved set, and their bodies are then rebuilt in statement order: a node computed
again becomes a fresh copy, so every later reader uses the copy, and fx frees each value
after its last use, as the schedule frees it. Offload and reload statements become copy ops
where the schedule has them (:mod:`remat.lower.offload`); a saved value the forward offloads
crosses to the backward as its host copy.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..capture import joint as tc
from ..errors import PlanError
from ..plans.phases import Split, split_schedule
from ..plans.plan import Plan
from ..plans.schedule import COPIES, Statement
from .offload import HostCopies, copies_for


def in_statement_order(gm: fx.GraphModule, joint: fx.GraphModule, stmts: list[Statement], *,
                       extra_inputs: list[str] = (), extra_outputs: list[str] = (),
                       num_fwd_outputs: int = 0, offloaded: list[str] = (),
                       host_outputs: list[str] = (), host_inputs: list[str] = (),
                       copies: HostCopies | None = None) -> fx.GraphModule:
    """``gm`` running its body in ``stmts`` order. When every node the statements compute is
    in ``gm`` once and nothing is to be added, ``gm``'s own nodes are moved into that order
    (:func:`reorder`); otherwise, and whenever the statements offload or reload, the module
    is rebuilt (:func:`rebuild`). ``offloaded``: saved values that cross as host copies;
    ``host_outputs`` / ``host_inputs``: values whose host copy crosses beside them."""
    computes = [s.node for s in stmts if s.op == "compute"]
    own = {n.name: n for n in gm.graph.nodes}
    inputs = {n.name for n in gm.graph.find_nodes(op="placeholder")}
    body = [c for c in computes if c not in inputs]
    copying = bool(offloaded or host_outputs or host_inputs) or any(s.op in COPIES for s in stmts)
    if not copying and not extra_inputs and not extra_outputs and len(set(body)) == len(body) \
            and all(c in own for c in body):
        return reorder(gm, [own[c] for c in body])
    return rebuild(gm, joint, stmts, extra_inputs=extra_inputs, extra_outputs=extra_outputs,
                   num_fwd_outputs=num_fwd_outputs, offloaded=offloaded, host_outputs=host_outputs,
                   host_inputs=host_inputs, copies=copies)


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
            num_fwd_outputs: int = 0, offloaded: list[str] = (),
            host_outputs: list[str] = (), host_inputs: list[str] = (),
            copies: HostCopies | None = None) -> fx.GraphModule:
    """``gm``'s placeholders and output, with its body recomputed in ``stmts`` order.

    A compute of a value that is current (a placeholder, or computed and not freed since)
    is skipped; any other compute copies the joint graph's node with its inputs' current
    versions. Nodes the output needs that no statement computes (symbolic sizes, RNG state
    plumbing added by the extraction) are copied from ``gm`` on demand.

    Copies (:mod:`remat.lower.offload`, ``copies``' ops): ``offload v`` copies the current
    ``v`` out; the ``free v`` after it completes that copy and drops ``v``, so later reads go
    through a reload; ``reload v`` copies the host copy back, and the first read after it
    waits for that copy. ``offloaded`` names saved values that cross as host copies: the
    forward outputs its host copy of each, and the backward's placeholder for it receives
    that copy (read through the backward's ``reload v``). ``host_outputs`` (forward) and
    ``host_inputs`` (backward) name values that cross both ways: the backward receives ``v``
    and, after the other saved values, ``v_host``, the host copy it reloads once it has freed
    ``v`` (the forward offloaded ``v`` and its free comes in the backward).
    """
    joint_nodes = {n.name: n for n in joint.graph.nodes}
    own = {n.name: n for n in gm.graph.nodes}
    new = fx.Graph()
    env: dict[str, fx.Node] = {}
    current: set[str] = set()
    offloaded = set(offloaded)
    host: dict[str, fx.Node] = {}  # value -> its host copy (pending until its free)
    offloading: dict[str, fx.Node] = {}  # value -> the device tensor its pending offload reads
    reloading: dict[str, fx.Node] = {}  # value -> the host copy its pending reload reads
    if copies is None:
        copied = offloaded | set(host_outputs) | set(host_inputs) | {s.node for s in stmts if s.op == "offload"}
        copies = copies_for([own.get(n) or joint_nodes[n] for n in sorted(copied)])

    def receive(p: fx.Node, name: str) -> None:
        if name in offloaded:  # the forward's host copy: read through a reload
            p.meta = dict(p.meta)
            p.meta["val"] = copies.host_val(p.meta["val"])
            p.meta.pop("tensor_meta", None)
            host[name] = p
            return
        env[name] = p
        current.add(name)

    for p in gm.graph.find_nodes(op="placeholder"):
        if (extra_inputs or host_inputs) and tc.is_tangent_like(p):
            # saved values PyTorch's extraction dropped (its own backward would not read
            # them) go after the other saved values, before the tangents; then host copies
            for name in extra_inputs:
                src = joint_nodes[name]
                ph = new.placeholder(name)
                ph.meta = dict(src.meta)
                receive(ph, name)
            for name in host_inputs:
                src = own.get(name) or joint_nodes[name]
                ph = new.placeholder(f"{name}_host")
                ph.meta = {"val": copies.host_val(src.meta["val"])}
                host[name] = ph
            extra_inputs = host_inputs = ()
        receive(new.node_copy(p), p.name)

    def host_copy(name: str) -> fx.Node:
        if name in offloading:  # its device copy is still wanted: the copy completes here
            host[name] = copies.offloaded(new, host[name], offloading.pop(name))
        return host[name]

    def reload(name: str) -> fx.Node:
        src = own.get(name) or joint_nodes[name]
        h = host_copy(name)
        env[name] = copies.reload(new, h, src.meta["val"], name)
        reloading[name] = h
        current.add(name)
        return env[name]

    def get(name: str) -> fx.Node:
        if name in reloading:  # the first read after a reload waits for it
            env[name] = copies.reloaded(new, env[name], reloading.pop(name))
        if name in env:
            return env[name]
        if name in host:  # freed after its offload, read again: the schedule's reload is missing
            reload(name)
            return get(name)
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
            if s.node in host:  # offloaded: the host copy stays, the device copy goes
                host_copy(s.node)
                if s.node in reloading:  # reloaded and never read: still wait for it
                    get(s.node)
                env.pop(s.node, None)
            continue
        if s.op == "offload":
            if s.node not in host:  # a value with a host copy is not copied out again
                value = get(s.node)
                host[s.node] = copies.offload(new, value, s.node)
                offloading[s.node] = value
            continue
        if s.op == "reload":
            if s.node not in current:
                if s.node not in host:
                    raise PlanError(f"statement 'reload {s.node}': {s.node!r} has no host copy here")
                reload(s.node)
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

    def result(name: str) -> fx.Node:
        return host_copy(name) if name in offloaded else get(name)

    extra = [result(n) for n in extra_outputs] + [host_copy(n) for n in host_outputs]
    for name in list(offloading):  # offloads whose free did not come: done before returning
        host_copy(name)
    out_copy = new.node_copy(out, lambda a: result(a.name))
    if extra:
        values = list(out_copy.args[0])
        saved = values[num_fwd_outputs:]
        tensors = sum(1 for v in saved if isinstance(v, fx.Node)
                      and isinstance(v.meta.get("val"), torch.Tensor))
        at = num_fwd_outputs + tensors  # after the saved tensors, before saved symbolic sizes
        values[at:at] = extra
        out_copy.args = (tuple(values),) + tuple(out_copy.args[1:])
    with new.inserting_before(out_copy):  # reloads nothing read: waited for all the same
        for name in list(reloading):
            get(name)
    new.eliminate_dead_code()
    copies.finish(new)
    new.lint()
    return fx.GraphModule(gm, new)


def lower(joint: tc.JointInfo, plan: Plan, copies: HostCopies | None = None
          ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules that run ``plan``: the backward receives ``plan.saved`` and
    the step's outputs its schedule reads; both bodies follow the plan's schedule.

    A schedule keeps the step's outputs to the end, so its backward reads an output the plan
    does not save from the forward's. So does the lowered backward: it receives the output,
    which costs no memory while the caller holds it. Computed again instead, an OPT's logits
    (1 MiB, a matmul) were allocated at the backward's start beside the caller's, and its plan
    for 0.8 measured 0.7% above its prediction.

    A schedule that offloads and reloads lowers its copies with ``copies``' ops (default: by
    the values' device, :func:`remat.lower.offload.copies_for`); a saved value the forward
    offloads and the backward reloads (``split.offloaded``) crosses as its host copy."""
    schedule = plan.schedule()
    split = split_schedule(schedule)
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
    offloaded = [s for s in split.offloaded if s in by_name]
    both = _crossing_both_ways(split)
    if copies is None and (offloaded or any(s.op in COPIES for s in schedule.statements)):
        copied = set(offloaded) | {s.node for s in schedule.statements if s.op == "offload"}
        copies = copies_for([by_name[n] for n in sorted(copied) if n in by_name])
    fw = in_statement_order(fw, joint.gm, split.forward, extra_outputs=dropped,
                            num_fwd_outputs=joint.num_fwd_outputs, offloaded=offloaded,
                            host_outputs=both, copies=copies)
    bw = in_statement_order(bw, joint.gm, split.backward, extra_inputs=dropped, offloaded=offloaded,
                            host_inputs=both, copies=copies)
    return fw, bw


def _crossing_both_ways(split: Split) -> list[str]:
    """Values the forward offloads that cross as themselves (still resident when the backward
    starts: their ``free`` is the backward's) and whose host copy the backward reloads
    before it makes one of its own: both cross."""
    copied = {s.node for s in split.forward if s.op == "offload"}
    offloaded = set(split.offloaded)
    made: set[str] = set()
    out: list[str] = []
    for s in split.backward:
        if s.op == "offload":
            made.add(s.node)
        elif s.op == "reload" and s.node in copied and s.node not in made | offloaded and s.node not in out:
            out.append(s.node)
    return out
