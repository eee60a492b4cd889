"""A split region's parts lowered as one subgraph called n times, not n copies of its ops.

:func:`remat.lower.fission.fission_joint` unrolls a fission (MAGIS's "fission": the region run
as n parts along one dimension, one after another): the joint graph, and the forward and
backward modules lowered from it, hold the region's ops n times. Inductor lowers, schedules and
compiles each copy; the slices' offsets differ, so even the kernels differ, and on a 16k-vocab
LM head + cross-entropy the first step took about 4.6x plain ``torch.compile``'s.

:func:`loop_parts` rewrites a lowered forward or backward module so that the parts of each
fission that are the same computation run as calls of one subgraph,
``torch.ops.higher_order.invoke_subgraph(subgraph, identifier, *operands)`` (the higher-order
op behind ``torch.compiler.nested_compile_region``). Inductor lowers a subgraph once per
module and calls the one compiled function n times; without codegen (``compiler="eager"``) the
subgraph runs as an fx module. What the plan decided stays:

- the parts run in the order the plan scheduled them, one after another: each call is placed
  where its part's last node was, and a node that read a part's output before that point moves
  after the call (a stable topological sort), so only one part's intermediates are alive at a
  time, as unrolled;
- what the parts read stays outside the subgraph: the slices of the sliced inputs (views, at
  offsets that differ per part) and the shared inputs (weights) are the call's operands, and
  part k's operands are part k's slices; only values made from no input (``full``,
  ``scalar_tensor``, ``iota``: deterministic, pure) are computed again inside the subgraph, as
  inductor computes them inside the kernels that read them unrolled (passed in as buffers,
  they tipped inductor into writing each part's one-hot mask of the logits: 1.26x the
  unrolled peak on a small head, measured);
- the merges stay outside too: the running sums (``sum_name(v, k)``), the mean's division and
  the concatenations read the calls' outputs as they read the parts' nodes, so a partial sum
  is added in as soon as its part returns;
- a part's outputs are the part's nodes read outside it (by a merge, by the backward through
  the forward's outputs, by the module's output);
- a pointwise value outside the parts that the plan writes where it computes it because its
  first reader is far (:func:`remat.lower.plan_order.realize_far`, the simulator's ``FAR``) is
  marked so in the unrolled module, before the parts collapse into calls and its reader comes
  near (:func:`_mark_far`; the parts' own nodes get the same pass in the subgraph): unmarked,
  inductor computed the running sums of an LM head's weight gradient as one kernel after the
  last call, all n parts' gradients alive until then (1.67x the unrolled peak, measured).

Which parts are called and which stay unrolled, per fission and per module:

- **Loop form**: the parts whose nodes are the same computation as another part's: the same
  ops in the same order, with the same constant arguments, reading their operands in the same
  pattern, operands of the same shape, strides, dtype and device, the same nodes read outside.
  Parts are grouped by that signature; every group of two or more parts becomes one subgraph
  (most often one group: all n parts).
- **Unrolled, as** :mod:`remat.lower.fission` **lowers it**: a part that matches no other (a
  plan that saves part 0's logits but recomputes part 1's in the backward: the backward holds
  different ops for the two); a fission whose part node appears twice in one module (a value
  of a part computed again there); a part whose nodes are not call_function ops, or whose value
  read outside it is not a tensor (a call returns tensors); a part a call
  cannot replace without a cycle (a node outside the part both reads it and feeds it); and
  every fission when ``REMAT_FISSION_LOOP=0`` is set (the unrolled lowering, for comparison).
  Each unrolled fission's reason is recorded in the module's ``meta["fission_loops"]``.

The parts are found by ``meta["fission_part"] = (index, node, k)``, which
:func:`~remat.lower.fission.fission_joint` puts on every part node it makes and fx keeps on
the copies the lowering makes of them.

The partitioner runs it on both modules of every plan with fissions; the forward of an LM head
+ cross-entropy split in 4 token parts then reads ``fw.meta["fission_loops"] == [{"fission": 0,
"parts": 4, "calls": 4, "subgraphs": 1, "unrolled": 0, "reason": None}]``.
"""

from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..capture.joint import copy_joint
from ..graph.fission import Fission
from ..plans.simulator import FAR
from .fission import PART_META, _sort_stably
from .plan_order import realize_far

REPORT_META = "fission_loops"
"""``gm.meta[REPORT_META]``: per fission, how :func:`loop_parts` lowered its parts here."""

LOOP_ENV = "REMAT_FISSION_LOOP"
"""Set to ``0`` to lower every fission unrolled (the lowering before the loop form)."""

_invoke = torch.ops.higher_order.invoke_subgraph
_ids = itertools.count()


def loop_enabled() -> bool:
    """Whether fissions are lowered in loop form (``REMAT_FISSION_LOOP`` is not ``0``)."""
    return os.environ.get(LOOP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def loop_key() -> str:
    """What the loop form adds to compile-cache keys."""
    return f"fission-loop={int(loop_enabled())}"


class _Unrolled(Exception):
    """This fission's parts stay unrolled in this module, for the reason given."""


@dataclass
class _Part:
    k: int
    nodes: list[fx.Node]  # graph order
    operands: list[fx.Node]  # first read first
    outputs: list[int]  # positions in nodes of the values read outside the part
    key: tuple
    constants: list[fx.Node]  # read by the part, made from no input; in graph order


def loop_parts(gm: fx.GraphModule, fissions: Sequence[Fission]) -> fx.GraphModule:
    """``gm`` (a forward or backward module lowered from a fissioned joint graph) with the
    parts of each fission of ``fissions`` run as calls of one subgraph per group of identical
    parts (see the module docstring); a fission that cannot be is left unrolled. Returns a new
    module (``gm`` itself where no part became a call) whose ``meta["fission_loops"]`` says,
    per fission, how many parts were called and why any stayed unrolled."""
    enabled = [f for f in fissions if f.n > 1]
    if not enabled:
        return gm
    report = []
    out = gm
    if loop_enabled():
        out = copy_joint(gm)
        _mark_far(out.graph)
    for f in enabled:
        entry = {"fission": f.index, "parts": 0, "calls": 0, "subgraphs": 0, "unrolled": 0, "reason": None}
        report.append(entry)
        if not loop_enabled():
            entry["reason"] = f"{LOOP_ENV}=0"
            continue
        try:
            out = _loop_one(out, f, entry)
        except _Unrolled as e:
            entry["reason"] = str(e)
    if not any(e["calls"] for e in report):
        out = gm  # unrolled as lowered, unmarked
    out.meta[REPORT_META] = report
    return out


def _mark_far(graph: fx.Graph) -> None:
    """Mark the values outside the parts that the unrolled module writes where they are
    computed (:func:`~remat.lower.plan_order.realize_far`): collapsed into calls, the parts no
    longer keep such a value's reader far, and inductor would compute it inside that reader.
    A part's own nodes are left to the subgraph, where the same pass sees them as unrolled."""
    key = "inductor_realize_to_strides"
    before = {n for n in graph.nodes if n.meta.get(key)}
    realize_far(graph, FAR)
    for n in graph.nodes:
        if n not in before and PART_META in n.meta:
            n.meta.pop(key, None)


def _loop_one(gm: fx.GraphModule, f: Fission, entry: dict) -> fx.GraphModule:
    parts = _parts(gm.graph, f)
    entry["parts"] = len(parts)
    if len(parts) < 2:
        raise _Unrolled(f"{len(parts)} part(s) of the fission in this module")
    groups: dict[tuple, list[_Part]] = {}
    for p in parts:
        groups.setdefault(p.key, []).append(p)
    looped = [g for g in groups.values() if len(g) > 1]
    entry["unrolled"] = sum(len(g) for g in groups.values() if len(g) == 1)
    if not looped:
        raise _Unrolled("no two parts are the same computation in this module")
    new = copy_joint(gm)
    by_name = {n.name: n for n in new.graph.nodes}
    for j, group in enumerate(looped):
        name = _free_attr(new, f"fission{f.index}_part{'' if len(looped) == 1 else f'_{j}'}")
        sub = _subgraph(group[0])
        new.register_module(name, sub)
        ident = f"remat_{name}_{next(_ids)}"
        for p in group:
            _call(new.graph, name, ident, [by_name[n.name] for n in p.nodes],
                  [by_name[a.name] for a in p.operands], p.outputs)
        entry["calls"] += len(group)
        entry["subgraphs"] += 1
    constants = {c.name for g in looped for p in g for c in p.constants}
    for n in reversed(list(new.graph.nodes)):  # a constant only the parts read is gone with them
        if n.name in constants and not n.users:
            new.graph.erase_node(n)
    if entry["unrolled"]:
        entry["reason"] = f"{entry['unrolled']} part(s) match no other part in this module"
    try:
        _sort_stably(new.graph)
    except Exception as e:  # a cycle: the unrolled module stands
        raise _Unrolled(f"a call cannot replace the parts here: {e}") from e
    new.graph.lint()
    new.recompile()
    return new


def _parts(graph: fx.Graph, f: Fission) -> list[_Part]:
    nodes: dict[int, list[fx.Node]] = {}
    seen: set[tuple[str, int]] = set()
    for node in graph.nodes:
        tag = node.meta.get(PART_META)
        if not tag or tag[0] != f.index:
            continue
        _, v, k = tag
        if (v, k) in seen:
            raise _Unrolled(f"part {k} of {v!r} is computed twice in this module")
        seen.add((v, k))
        if node.op != "call_function":
            raise _Unrolled(f"part node {node.name!r} is a {node.op!r} node")
        nodes.setdefault(k, []).append(node)
    return [_signature(k, ns) for k, ns in sorted(nodes.items())]


def _signature(k: int, nodes: list[fx.Node]) -> _Part:
    """The part's operands and outputs, and a key equal for parts that compute the same."""
    local = {n: i for i, n in enumerate(nodes)}
    operands: list[fx.Node] = []
    at: dict[fx.Node, int] = {}
    constants: dict[fx.Node, Any] = {}  # made from no input: computed again in the subgraph
    memo: dict[fx.Node, bool] = {}

    def canon(a: Any) -> Any:
        if isinstance(a, fx.Node):
            if a in local:
                return ("part", local[a])
            if _constant(a, memo):
                if a not in constants:
                    constants[a] = ("constant", a.target, canon(a.args), canon(a.kwargs))
                return constants[a]
            if a not in at:
                at[a] = len(operands)
                operands.append(a)
            return ("operand", at[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(canon(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((key, canon(x)) for key, x in sorted(a.items())))
        if isinstance(a, (bool, int, float, str, type(None))):
            return (type(a).__name__, a)
        return (type(a).__name__, repr(a))

    ops = tuple((n.meta[PART_META][1], n.target, canon(n.args), canon(n.kwargs)) for n in nodes)
    outputs = [i for i, n in enumerate(nodes) if any(u not in local for u in n.users)]
    for i in outputs:
        if not isinstance(nodes[i].meta.get("val"), torch.Tensor):
            raise _Unrolled(f"part node {nodes[i].name!r}, read outside its part, is not a tensor")
    layouts = tuple(_layout(a.meta.get("val")) for a in operands)
    if any(x is None for x in layouts):
        bad = next(a for a, x in zip(operands, layouts) if x is None)
        raise _Unrolled(f"operand {bad.name!r} of part {k} has no tensor value")
    return _Part(k, nodes, operands, outputs, (ops, tuple(outputs), layouts), list(constants))


def _constant(a: fx.Node, memo: dict[fx.Node, bool]) -> bool:
    """Whether ``a`` is computed from no input by deterministic, pure ops (``full``,
    ``scalar_tensor``, ``iota`` and views of them, not slices: a fission slices a constant
    input at each part's offset, and such a slice is the part's operand): the subgraph computes such an operand itself,
    as inductor computes it inside the kernels that read it in the unrolled module. Passed in,
    it is a buffer read from memory, and inductor's heuristics then wrote a part's one-hot mask
    of the logits' size that the unrolled module computes inside its reader."""
    if a in memo:
        return memo[a]
    target = a.target
    schema = getattr(target, "_schema", None)
    ok = (a.op == "call_function" and isinstance(target, torch._ops.OpOverload) and PART_META not in a.meta
          and target is not torch.ops.aten.slice.Tensor  # a fission's slice: offsets differ per part
          and schema is not None and not schema.is_mutable
          and torch.Tag.nondeterministic_seeded not in target.tags
          and isinstance(a.meta.get("val"), torch.Tensor))
    memo[a] = ok and all(_constant(i, memo) for i in a.all_input_nodes)
    return memo[a]


def _layout(val) -> tuple | None:
    if isinstance(val, torch.Tensor):
        return (tuple(val.shape), tuple(val.stride()), val.dtype, str(val.device))
    if isinstance(val, (int, float, bool)):
        return (type(val).__name__,)
    return None


def _subgraph(p: _Part) -> fx.GraphModule:
    """Part ``p``'s nodes as a module of its operands returning its outputs (a tuple)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, a in enumerate(p.operands):
        ph = g.placeholder(f"operand{i}")
        ph.meta = {key: x for key, x in a.meta.items() if key in ("val", "tensor_meta")}
        env[a] = ph
    for c in sorted(p.constants, key=_position(p)):
        env[c] = g.node_copy(c, lambda a: env[a])
    for n in p.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])  # meta[PART_META] kept: part 0's node
    g.output(tuple(env[p.nodes[i]] for i in p.outputs))
    g.lint()
    return fx.GraphModule(torch.nn.Module(), g)


def _position(p: _Part):
    order = {n: i for i, n in enumerate(p.nodes[0].graph.nodes)}
    return order.__getitem__


def _call(graph: fx.Graph, attr: str, ident: str, nodes: list[fx.Node], operands: list[fx.Node],
          outputs: list[int]) -> None:
    """Replace part ``nodes`` by one call of subgraph ``attr`` where the last of them was."""
    inside = set(nodes)
    results = [nodes[i] for i in outputs]
    with graph.inserting_after(nodes[-1]):
        get = graph.get_attr(attr)
    with graph.inserting_after(get):
        call = graph.call_function(_invoke, (get, ident, *operands))
    call.meta["val"] = tuple(r.meta.get("val") for r in results)
    prev = call
    for i, r in enumerate(results):
        with graph.inserting_after(prev):  # named after the part's node: mm__part2__out
            item = graph.create_node("call_function", operator.getitem, (call, i), name=f"{r.name}__out")
        item.meta = {key: x for key, x in r.meta.items() if key != PART_META}
        r.replace_all_uses_with(item, delete_user_cb=lambda u: u not in inside)
        prev = item
    for n in reversed(nodes):
        graph.erase_node(n)


def _free_attr(gm: fx.GraphModule, base: str) -> str:
    name, i = base, 1
    while hasattr(gm, name):
        name, i = f"{base}_{i}", i + 1
    return name


def op_counts(gm: fx.GraphModule) -> dict[str, int]:
    """How many nodes of each op ``gm`` holds, a subgraph it calls counted once (what inductor
    lowers); the calls and their outputs are not counted. Unrolled, a split region's ops count
    n times; in loop form, once.

    >>> sum(op_counts(fx.symbolic_trace(lambda x: torch.sin(x + 1))).values())
    2
    """
    counts: dict[str, int] = {}
    seen: set[str] = set()

    def walk(m: fx.GraphModule) -> None:
        for n in m.graph.nodes:
            if n.op == "get_attr" and isinstance(sub := getattr(m, n.target, None), fx.GraphModule):
                if n.target not in seen:
                    seen.add(n.target)
                    walk(sub)
                continue
            if n.op != "call_function" and n.op != "call_method":
                continue
            if n.target is _invoke or (n.target is operator.getitem and getattr(n.args[0], "target", None) is _invoke):
                continue
            key = str(n.target)
            counts[key] = counts.get(key, 0) + 1

    walk(gm)
    return counts
