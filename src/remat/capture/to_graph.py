"""PyTorch joint graph -> remat Graph.

The joint graph is the one AOTAutograd hands to inductor's partitioner (after inductor's
joint-graph passes, so random ops are already the seeded ``inductor_random`` form that
inductor will run). Sizes, shapes and dtypes come from the FakeTensor in ``node.meta["val"]``,
FLOPs from ``torch.utils.flop_counter``'s formulas, categories from PyTorch's own op lists
so that "fusible" means what inductor fuses.
"""

from __future__ import annotations

import operator
import re
from typing import Collection

import torch
import torch.fx as fx
from torch.fx.experimental import symbolic_shapes as ss
from torch.utils.flop_counter import flop_registry
from torch.utils._pytree import tree_map

from ..errors import UnsupportedGraphError
from ..graph.graph import Graph, Node
from .joint import JointInfo, must_recompute_tag, must_save_tag, op_types

aten = torch.ops.aten
prims = torch.ops.prims

_REDUCTIONS = {
    aten.sum, aten.mean, aten.amax, aten.amin, aten.var, aten.var_mean, aten.std, aten.prod,
    aten.any, aten.all, aten.max, aten.min, aten.argmax, aten.argmin, aten.logsumexp,
    aten.norm, aten.linalg_vector_norm, aten._softmax, aten._log_softmax,
    prims.sum, prims.var, prims.amax, prims.amin, prims.prod,
}
_RANDOM_NAMES = ("inductor_random", "inductor_seeds", "inductor_lookup_seed", "inductor_randint",
                 "philox", "native_dropout", "bernoulli", "rand", "normal", "uniform", "exponential")
_EXTRA_COMPUTE = {aten.convolution_backward, aten._scaled_dot_product_flash_attention_for_cpu,
                  aten._scaled_dot_product_flash_attention_for_cpu_backward,
                  aten.baddbmm, aten.addbmm, aten.linear, aten.matmul, aten.einsum}
_SIMPLE_BUILTINS = {operator.getitem}


def _packet(node: fx.Node):
    return getattr(node.target, "overloadpacket", None)


def _is_random(node: fx.Node, ot) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags or ot.is_random(node):
        return True
    name = str(getattr(target, "__name__", target))
    return any(name.startswith(r) for r in _RANDOM_NAMES) and isinstance(target, torch._ops.OpOverload)


def categorize(node: fx.Node, ot=None) -> tuple[str, bool]:
    """(category, fusible) of an fx node, from PyTorch's own op lists."""
    ot = ot or op_types()
    if node.op == "placeholder":
        return "input", False
    if node.target is operator.getitem:
        return "view", True
    if _is_random(node, ot):
        return "random", False
    if ot.is_compute_intensive(node) or _packet(node) in _EXTRA_COMPUTE:
        return "compute", False
    fusible = bool(ot.is_fusible(node))
    if ot.is_view(node):
        return "view", True
    if _packet(node) in _REDUCTIONS:
        return "reduction", fusible
    if fusible:
        return "pointwise", True
    return "other", False


def _check_supported(node: fx.Node) -> None:
    if node.op in ("placeholder", "output"):
        return
    if node.op != "call_function":
        raise UnsupportedGraphError(
            f"node {node.name!r} is a {node.op!r} node ({node.target}); remat plans joint graphs of "
            "call_function nodes only"
        )
    target = node.target
    if isinstance(target, torch._ops.HigherOrderOperator):
        raise UnsupportedGraphError(
            f"node {node.name!r} calls the higher-order op {target.name()!r}, whose subgraph remat "
            "cannot plan yet (torch.cond, while_loop, ...); rewrite the region without it or use "
            "strict=False to fall back to PyTorch's partitioner"
        )
    if not isinstance(target, torch._ops.OpOverload) and target not in _SIMPLE_BUILTINS:
        if not (getattr(target, "__module__", "") or "").startswith(("_operator", "torch", "math")):
            raise UnsupportedGraphError(
                f"node {node.name!r} calls {target!r}, an op remat does not know; only torch ops "
                "and operator builtins can be planned"
            )


def _hint(x) -> int:
    """A symbolic size's value for the shapes being compiled (planning uses these)."""
    for name in ("optimization_hint", "guarding_hint_or_throw", "size_hint", "hint_int"):
        fn = getattr(ss, name, None)  # the name changes between torch releases
        if fn is not None:
            try:
                return int(fn(x))
            except Exception:  # noqa: BLE001 - try the next spelling
                continue
    return int(x.node.hint)


def _value_info(val) -> tuple[int, tuple[int, ...] | None, str | None, bool]:
    """(bytes, shape, dtype, saveable) of a node's meta value."""
    if isinstance(val, torch.Tensor):
        numel = val.numel()
        if not isinstance(numel, int):  # symbolic size: plan with the hint of the first shapes
            numel = _hint(numel)
        nbytes = int(numel) * val.element_size()
        shape = tuple(int(s) if isinstance(s, int) else -1 for s in val.shape)
        return nbytes, shape, str(val.dtype).removeprefix("torch."), True
    if isinstance(val, (torch.SymInt, int)):
        return 8, (), "int64", True
    if isinstance(val, (torch.SymFloat, torch.SymBool, float, bool)):
        return 8, (), type(val).__name__, False
    if isinstance(val, (tuple, list)):
        total = sum(_value_info(v)[0] for v in val if v is not None)
        return total, None, None, False
    return 0, None, None, val is not None


def _returns_views_list(schema) -> bool:
    """``Tensor(a)[]`` returned from a ``Tensor(a ...)`` first argument (split, unbind, chunk):
    the Python binding leaves a list's alias set empty, so the schema text is read."""
    text = str(schema)
    ret = re.fullmatch(r"Tensor\((\w+)\)\[\]", text.rsplit(") -> ", 1)[-1].strip())
    arg = re.search(r"\(Tensor\((\w+)( -> \*)?\) ", text)
    return bool(ret and arg and ret.group(1) == arg.group(1))


def _memory_meta(node: fx.Node, val, aliases: dict[str, str]) -> dict:
    """How a value holds memory: ``alias_of`` names the value whose storage a view shares
    (followed to its root); ``container`` marks a tuple, whose items hold the memory."""
    if node.op != "call_function":
        return {}
    src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    base = None
    if node.target is operator.getitem:
        base = src if src is not None and src.name in aliases else None
    else:
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.returns and schema.arguments and src is not None:
            ret, arg = schema.returns[0].alias_info, schema.arguments[0].alias_info
            if ret is not None and arg is not None and not ret.is_write \
                    and set(ret.before_set) & set(arg.before_set):
                base = src
            elif _returns_views_list(schema):
                base = src  # split/unbind/chunk: the list's items are views of the input
    meta: dict = {}
    if base is not None:
        aliases[node.name] = meta["alias_of"] = aliases.get(base.name, base.name)
    if isinstance(val, (tuple, list)):
        meta["container"] = True
    return meta


def _module_path(node: fx.Node) -> str | None:
    """The submodule whose forward computes ``node`` (``layers.1.mlp``), from fx's
    ``nn_module_stack`` (innermost entry; the backward's nodes carry their forward's)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"L\['(\w+)'\]", r"\1", path) or None


def _flops(node: fx.Node, out_bytes_numel: int) -> float:
    packet = _packet(node)
    if packet in flop_registry:
        def to_val(a):
            return a.meta.get("val") if isinstance(a, fx.Node) else a
        try:
            args = tree_map(to_val, node.args)
            kwargs = tree_map(to_val, node.kwargs)
            return float(flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val")))
        except Exception:
            return 0.0
    return float(out_bytes_numel)


def graph_from_joint(joint: JointInfo, param_indices: Collection[int] = (), name: str = "joint") -> Graph:
    """Build a remat Graph from a prepared joint graph (:func:`remat.capture.joint.prepare_joint`).

    Raises UnsupportedGraphError, naming the node, for graphs remat cannot plan.
    """
    ot = op_types()
    primal_index = {p: i for i, p in enumerate(joint.primals)}
    tangents = set(joint.tangents)
    fwd_out = set(joint.fwd_outputs)
    bwd_out = set(joint.bwd_outputs)
    nodes: list[Node] = []
    aliases: dict[str, str] = {}
    graph_nodes = list(joint.gm.graph.nodes)
    # report a higher-order op itself before the get_attr nodes that hold its subgraphs
    for node in sorted(graph_nodes, key=lambda n: n.op != "call_function"):
        _check_supported(node)
    for node in graph_nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        nbytes, shape, dtype, saveable = _value_info(val)
        category, fusible = categorize(node, ot)
        if node.op == "placeholder":
            if node in tangents:
                role = "tangent"
            elif node in primal_index:
                role = "param" if (primal_index[node] in param_indices
                                   or node in joint.static_lifetime_inputs) else "input"
            else:
                raise UnsupportedGraphError(f"placeholder {node.name!r} is neither a primal nor a tangent")
        else:
            role = "backward" if node in joint.tangent_closure else "forward"
        must_save = role == "forward" and must_save_tag(node)
        numel = nbytes // val.element_size() if isinstance(val, torch.Tensor) else 0
        meta = _memory_meta(node, val, aliases)
        module = _module_path(node)
        if module:
            meta["module"] = module
        nodes.append(Node(
            name=node.name,
            op=str(getattr(node.target, "__name__", node.target)) if node.op != "placeholder" else "placeholder",
            inputs=tuple(a.name for a in node.all_input_nodes),
            role=role, bytes=nbytes, flops=_flops(node, numel) if node.op == "call_function" else 0.0,
            category=category, shape=shape, dtype=dtype, fusible=fusible,
            must_save=must_save,
            must_recompute=(not must_save) and must_recompute_tag(node),
            can_save=saveable,
            is_output=(role == "forward" and node in fwd_out) or (role == "backward" and node in bwd_out),
            backward_output=role == "forward" and node in bwd_out,
            meta=meta,
        ))
    return Graph(nodes, name=name)
