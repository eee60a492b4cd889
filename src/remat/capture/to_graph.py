"""PyTorch joint graph -> remat Graph.

The joint graph is the one AOTAutograd hands to inductor's partitioner (after inductor's
joint-graph passes, so random ops are already the seeded ``inductor_random`` form that
inductor will run). Sizes, shapes and dtypes come from the FakeTensor in ``node.meta["val"]``,
FLOPs from ``torch.utils.flop_counter``'s formulas, categories from PyTorch's own op lists
so that "fusible" means what inductor fuses.

Dynamic shapes (``torch.compile(..., dynamic=True)``, or dynamo marking a size dynamic after
it changed): the joint graph's sizes are symbols (``s0``). remat plans such a graph once, at
the sizes of the call that compiled it (the symbols' *hints*), and reads those hints without
adding a guard, so the graph is not specialised and dynamo does not recompile for new sizes.
The Graph says so in ``graph.meta["dynamic"]`` (``{"symbols": {"s0": 8, ...}}``, the hint of
each size symbol) and a node with symbolic sizes keeps them in ``meta["sym_shape"]``; its
``shape`` and ``bytes`` are those at the hints. The plan is a choice of which values cross
from forward to backward, so it stays valid for every size: the same values are saved and
recomputed, and the memory they take grows (or shrinks) with the sizes. How budgets scale
with them: a fractional budget (``budget=0.6``) is a share of the step's own peak, and the
same plan keeps about that share at other sizes where the sizes scale the step's tensors
alike (the batch size; a sequence length outside attention's T x T scores); a byte budget
(``"6GiB"``) is met at the hint sizes only: larger sizes run the same plan in proportionally
more memory, without a new plan and without a warning (compile with the largest sizes first,
or mark them static, to plan for them). Budgets are checked at the hints only.
"""

from __future__ import annotations

import operator
import re
from typing import Collection

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils.flop_counter import flop_registry
from torch.utils._pytree import tree_map

from ..cost.model import library_calls
from ..errors import UnsupportedGraphError
from ..graph.graph import Graph, Node
from .dims import dim_links
from .joint import JointInfo, must_recompute_tag, must_save_tag, op_types, prefers_recompute_tag
from .joint import size_hint as _hint
from .layouts import copied_views, views_first_input
from .workspace import inductor_channels_last, layout_copies, measure_workspaces

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
_EXTRA_FUSIBLE = {aten.embedding, aten.slice_scatter, aten.select_scatter, aten.copy, prims.fma}
"""Ops PyTorch's lists leave out of its fusible ops that inductor lowers to pointwise kernels:
an embedding is a gather from its table, computed inside its readers. Counted as a written
value, a recomputed embedding held its 128 KB where inductor reads the table (GPT-2's
least-memory plan was predicted 3% above its measured peak). A slice or select scatter (the
backward of a slice: rotary embeddings) is a masked select between its two inputs; a copy
and a fused multiply-add (T5's layer norm backward) are elementwise."""
_SIMPLE_BUILTINS = {operator.getitem}


def _packet(node: fx.Node):
    return getattr(node.target, "overloadpacket", None)


def _argument(node: fx.Node, name: str, default=None):
    """The value of ``node``'s argument ``name`` (positional, keyword or the schema's default)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return default
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            if not a.kwarg_only and i < len(node.args):
                return node.args[i]
            if name in node.kwargs:
                return node.kwargs[name]
            return a.default_value if a.has_default_value() else default
    return default


def _draws_nothing(node: fx.Node) -> bool:
    """An op tagged ``nondeterministic_seeded`` that draws no random number with these
    arguments: attention with ``dropout_p == 0`` (PyTorch tags every fused attention op, since
    it *may* apply dropout) and dropout with ``p == 0`` or ``train=False``."""
    dropout_p = _argument(node, "dropout_p")
    if isinstance(dropout_p, (int, float)) and not isinstance(dropout_p, bool):
        return dropout_p == 0
    if _packet(node) is aten.native_dropout:
        return _argument(node, "p") == 0 or _argument(node, "train") is False
    return False


def _is_random(node: fx.Node, ot) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags or ot.is_random(node):
        return not _draws_nothing(node)
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
    fusible = bool(ot.is_fusible(node)) or _packet(node) in _EXTRA_FUSIBLE
    if ot.is_view(node):
        return "view", True
    if _packet(node) in _REDUCTIONS:
        return "reduction", fusible
    if fusible:
        return "pointwise", True
    return "other", False


def inductor_kernel(node: fx.Node, category: str, fusible: bool) -> bool:
    """A non-fusible op inductor still generates a kernel for (a concatenation, a scatter, a
    pooling), rather than calling a library (a matmul, a convolution, attention, a fallback):
    on a CPU it joins the C++ kernels around it, whose frees wait for the next library call
    (:func:`remat.plans.simulator.simulate`)."""
    if fusible or category in ("compute", "random", "input") or node.op != "call_function":
        return False
    from torch._inductor.lowering import fallbacks, lowerings

    return node.target in lowerings and node.target not in fallbacks and not _scatter_falls_back(node)


def _scatter_falls_back(node: fx.Node) -> bool:
    """Inductor calls ATen for a scatter it cannot generate: a scatter-add on a CPU with more
    than one thread (``config.cpp.fallback_scatter_reduce_sum``), an accumulating index_put of
    integers, anything under deterministic algorithms. ResNet-18's max-pool backward is a
    scatter-add: a kernel on one thread, a library call on two."""
    from torch._inductor.utils import needs_fallback_due_to_atomic_add_limitations, use_scatter_fallback

    packet = _packet(node)
    dtype = getattr(node.meta.get("val"), "dtype", None)
    if packet in (aten.index_put, aten._unsafe_index_put, aten._unsafe_masked_index_put_accumulate):
        accumulate = packet is aten._unsafe_masked_index_put_accumulate or _argument(node, "accumulate", False)
        return bool(accumulate) and (
            dtype is None or needs_fallback_due_to_atomic_add_limitations(dtype)
            or torch.are_deterministic_algorithms_enabled())
    if packet not in (aten.scatter, aten.scatter_add, aten.scatter_reduce):
        return False
    src = _argument(node, "src", _argument(node, "value"))
    src_val = src.meta.get("val") if isinstance(src, fx.Node) else None
    if packet is aten.scatter:
        overload, reduce = aten.scatter_.src, _argument(node, "reduce")
    else:
        overload = aten.scatter_reduce_.two
        reduce = "sum" if packet is aten.scatter_add else _argument(node, "reduce")
    return bool(use_scatter_fallback(
        overload, reduce, dtype, src_val.dtype if src_val is not None else type(src),
        src_val.device.type if src_val is not None else "not impl", src_val is not None))


def _unrolled(node: fx.Node) -> bool:
    """Inductor makes a reduction over fewer than ``unroll_reductions_threshold`` elements
    (8) a pointwise op (``Reduction.create``; on a CPU not when it reduces to one element),
    which its readers compute inside them, like any pointwise value, rather than a kernel that
    writes it (T5's relative-position-bias gradient, a sum over a batch of 4: inductor computes
    it in the embedding backward's kernel, reading what the value it sums reads:
    :func:`remat.plans.simulator._allocations`)."""
    from torch._inductor import config as inductor_config

    val = node.meta.get("val")
    src = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    src_val = src.meta.get("val") if src is not None else None
    if not isinstance(val, torch.Tensor) or not isinstance(src_val, torch.Tensor):
        return False
    out, total = _hint(val.numel()), _hint(src_val.numel())
    if not out or total % out:
        return False
    reduced = total // out
    on_gpu = val.device.type not in ("cpu", "meta")
    return reduced == 1 or (reduced < inductor_config.unroll_reductions_threshold and (out != 1 or on_gpu))


def _scatters_into_copy(node: fx.Node, fusible: bool) -> bool:
    """A scatter inductor hands to ATen (:func:`_scatter_falls_back`) scatters in place into a
    copy of its first input, which the kernel before it writes: its output is allocated with
    that kernel's outputs, before the frees that wait for the call (``meta["scatters_into_copy"]``,
    :func:`remat.plans.simulator.simulate`)."""
    return not fusible and node.op == "call_function" and _packet(node) in _FUNCTIONAL_SCATTERS \
        and _scatter_falls_back(node)


_FUNCTIONAL_SCATTERS = (aten.scatter, aten.scatter_add, aten.scatter_reduce, aten.index_put,
                        aten._unsafe_index_put, aten._unsafe_masked_index_put_accumulate)


def _mark_copied_views(graph_nodes: list[fx.Node], nodes: list[Node], channels_last: bool) -> None:
    """``meta["copied_view"]`` on the views a library call (:func:`remat.cost.model.library_calls`)
    reads that inductor copies out of a channels-last storage
    (:func:`remat.capture.layouts.copied_views`). Marked before the Graph is built: a Graph
    does not change after construction."""
    if not channels_last:
        return
    index = {n.name: i for i, n in enumerate(nodes)}
    library = library_calls(Graph(nodes))
    for name in copied_views(graph_nodes, channels_last,
                             lambda u: u.op == "call_function" and u.name in index and bool(library[index[u.name]])):
        nodes[index[name]].meta["copied_view"] = True


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


def _opaque(gm: fx.GraphModule, node: fx.Node, fused: bool) -> int:
    """The transient bytes an op remat cannot look into takes while it runs: for a higher-order
    op, the largest of its subgraphs' (:func:`_subgraph_transient`); 0 for an op without
    subgraphs."""
    worst = 0
    for arg in node.all_input_nodes:
        if arg.op != "get_attr":
            continue
        sub = getattr(gm, str(arg.target), None)
        if isinstance(sub, fx.GraphModule):
            worst = max(worst, _subgraph_transient(sub, fused))
    return int(worst)


def _subgraph_transient(sub: fx.GraphModule, fused: bool, depth: int = 0) -> int:
    """What a subgraph holds while it runs, beyond its operands and what it returns: the peak of
    its live intermediate values, each freed after its last reader, less its outputs (the op's
    node counts them). Views hold nothing of their own, and a nested higher-order op adds its
    own transient. ``fused`` (inductor compiles the subgraph): a fusible value that only
    fusible ops read is computed inside their kernels and never held, the rule of the cost
    model's fused memory for the graph around it (:func:`remat.cost.model.materialized`)."""
    nodes = list(sub.graph.nodes)
    last: dict[fx.Node, int] = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last[a] = i
    outputs = {a for n in nodes if n.op == "output" for a in n.all_input_nodes}
    ot = op_types() if fused else None

    def fused_away(n: fx.Node) -> bool:
        if not fused or n in outputs or not categorize(n, ot)[1]:
            return False
        return all(u.op == "call_function" and categorize(u, ot)[1] for u in n.users)

    live = peak = 0
    held: dict[fx.Node, int] = {}
    for i, n in enumerate(nodes):
        if n.op != "call_function":
            continue
        view = getattr(n.target, "is_view", False) or n.target is operator.getitem
        own = 0 if view or fused_away(n) else _value_info(n.meta.get("val"))[0]
        inner = 0
        if depth < 8 and isinstance(n.target, torch._ops.HigherOrderOperator):
            inner = max([_subgraph_transient(getattr(sub, str(a.target)), fused, depth + 1) for a in n.all_input_nodes
                         if a.op == "get_attr" and isinstance(getattr(sub, str(a.target), None), fx.GraphModule)]
                        or [0])
        live += own
        held[n] = own
        peak = max(peak, live + inner)
        for a in n.all_input_nodes:
            if last.get(a) == i and a in held and a not in outputs:
                live -= held.pop(a)
    return max(0, peak - sum(held.get(o, 0) for o in outputs))


def _is_symbolic(x) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _has_symbolic_shape(val) -> bool:
    if not isinstance(val, torch.Tensor):
        return False
    try:
        strides = val.stride()
    except (RuntimeError, NotImplementedError):  # sparse and nested tensors have none
        strides = ()
    return any(_is_symbolic(s) for s in (*val.shape, *strides))


def _at_hints(val):
    """``val`` with every symbolic size replaced by its hint: a meta tensor of the hinted
    shape for a tensor, an int for a SymInt (for formulas that would guard on symbols)."""
    if isinstance(val, torch.Tensor) and _has_symbolic_shape(val):
        with unset_fake_temporarily():
            return torch.empty_strided([_hint(s) for s in val.shape], [_hint(s) for s in val.stride()],
                                       dtype=val.dtype, device="meta")
    if isinstance(val, torch.SymInt):
        return _hint(val)
    return val


def _value_info(val) -> tuple[int, tuple[int, ...] | None, str | None, bool]:
    """(bytes, shape, dtype, saveable) of a node's meta value."""
    if isinstance(val, torch.Tensor):
        numel = val.numel()
        if not isinstance(numel, int):  # symbolic size: plan with the hint of the first shapes
            numel = _hint(numel)
        nbytes = int(numel) * val.element_size()
        shape = tuple(_hint(s) for s in val.shape)  # the hints where sizes are symbolic
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
        if src is not None and views_first_input(node):
            base = src
        elif schema is not None and src is not None and _returns_views_list(schema):
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
        def to_val(a):  # hinted sizes: a formula on symbolic sizes would guard on them
            return _at_hints(a.meta.get("val") if isinstance(a, fx.Node) else a)
        try:
            args = tree_map(to_val, node.args)
            kwargs = tree_map(to_val, node.kwargs)
            out = tree_map(_at_hints, node.meta.get("val"))
            return float(flop_registry[packet](*args, **kwargs, out_val=out))
        except Exception:
            return 0.0
    return float(out_bytes_numel)


class _Regions:
    """What :func:`_recompute_region` knows of the nodes seen so far (in topological order)."""

    def __init__(self) -> None:
        self.available: dict[str, bool] = {}  # could the backward have this value?
        self.recomputable: dict[str, bool] = {}  # ... by computing it again, to the same value?
        self.random: set[str] = set()


def _recompute_region(node: fx.Node, category: str, saveable: bool, regions: _Regions) -> bool:
    """Whether a node a user's ``torch.utils.checkpoint`` region (or a selective-checkpoint
    policy) tags for recomputation is flagged ``must_recompute``; records what later nodes need.

    A tagged node is recomputed, even where remat alone would save it (a matmul, attention),
    unless recomputing it is impossible or would change its value:

    - a random op is computed once, in the forward, and its value is saved: its randomness is
      never drawn again, under any plan or budget. Random ops are those that draw: dropout,
      attention with ``dropout_p > 0`` (with ``dropout_p == 0`` it is a compute op), and on
      a CPU or GPU under inductor's joint passes ``inductor_seeds`` (draws the seeds) with
      the seeded ``inductor_lookup_seed`` -> ``inductor_random`` / ``inductor_randint``
      chain that replaces dropout's ``rand``. The seeded ops would give the same numbers again
      (inductor's kernels, and remat's eager compiler, run them from the seed; PyTorch's
      partitioner recomputes them from the saved seed), but remat treats them as it treats
      random ops outside a region: computed once, the backward reads the forward's value
      (the boolean mask, when that is the cheapest thing to keep).
    - a node whose input can be neither saved nor recomputed (an item of a random op's tuple,
      such as dropout's mask) cannot be recomputed either: it may be saved.
    - with ``PREFER_RECOMPUTE`` (a plain checkpoint region), a node that reads a random op's
      value directly (dropout's ``rand < p`` mask) may be saved, so the plan can keep the
      smaller of the random tensor and what is computed from it; ``MUST_RECOMPUTE`` (a
      policy) keeps it recomputed.

    So a region never makes a plan impossible: the min cut and every other solver plan it
    without falling back, and what the user asked to recompute is recomputed wherever that is
    possible.
    """
    name = node.name
    if node.op == "placeholder":
        regions.available[name] = regions.recomputable[name] = True
        return False
    inputs = [a.name for a in node.all_input_nodes]
    recomputable = category != "random" and all(regions.available.get(i, True) for i in inputs)
    regions.recomputable[name] = recomputable
    regions.available[name] = recomputable or saveable
    if category == "random":
        regions.random.add(name)
    if not recomputable:
        return False
    reads_random = any(i in regions.random for i in inputs)
    return not (reads_random and prefers_recompute_tag(node))


def graph_from_joint(joint: JointInfo, param_indices: Collection[int] = (), name: str = "joint",
                     compiler: str = "inductor", opaque: bool = False) -> Graph:
    """Build a remat Graph from a prepared joint graph (:func:`remat.capture.joint.prepare_joint`)
    that ``compiler`` (``"inductor"`` or remat's ``"eager"``) will run; ``meta["compiler"]``
    records it (the cost model's fused memory) and it decides which ops' scratch is measured.

    Raises UnsupportedGraphError, naming the node, for graphs remat cannot plan. With
    ``opaque``, such nodes (a higher-order op such as ``torch.cond``, an op remat does not
    know) become opaque ones instead (:func:`_opaque`): a Graph good for predicting the memory
    of a partition made by someone else (PyTorch's, where remat falls back), not for planning.
    """
    ot = op_types()
    symbols: dict[str, int] = {}
    regions = _Regions()
    primal_index = {p: i for i, p in enumerate(joint.primals)}
    tangents = set(joint.tangents)
    fwd_out = set(joint.fwd_outputs)
    bwd_out = set(joint.bwd_outputs)
    nodes: list[Node] = []
    aliases: dict[str, str] = {}
    graph_nodes = list(joint.gm.graph.nodes)
    unknown: dict[str, int] = {}  # opaque nodes: their transient bytes
    # report a higher-order op itself before the get_attr nodes that hold its subgraphs
    for node in sorted(graph_nodes, key=lambda n: n.op != "call_function"):
        try:
            _check_supported(node)
        except UnsupportedGraphError:
            if not opaque:
                raise
            if node.op == "call_function":
                unknown[node.name] = _opaque(joint.gm, node, fused=compiler == "inductor")
    if opaque:  # the subgraphs a higher-order op calls are its own business
        graph_nodes = [n for n in graph_nodes if n.op != "get_attr"]
    channels_last = compiler == "inductor" and inductor_channels_last(joint.gm)  # inductor's layout choice
    # convolutions' scratch, on the real device and in that layout; the inputs copied to it
    workspace = measure_workspaces(graph_nodes, compiler, channels_last)
    copies = layout_copies(graph_nodes, channels_last)
    for node in graph_nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        nbytes, shape, dtype, saveable = _value_info(val)
        category, fusible = ("other", False) if node.name in unknown else categorize(node, ot)
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
        recomputable = _recompute_region(node, category, saveable, regions)  # sees every node
        must_recompute = (not must_save) and must_recompute_tag(node) and recomputable
        numel = nbytes // val.element_size() if isinstance(val, torch.Tensor) else 0
        meta = _memory_meta(node, val, aliases)
        module = _module_path(node)
        if module:
            meta["module"] = module
        if node.name in unknown:
            meta["workspace"] = unknown[node.name]
        elif not _has_symbolic_shape(val) and (links := dim_links(node)) is not None:
            meta["dims"] = links  # remat.capture.dims: which input dims are which of its axes
        if must_recompute_tag(node):  # what the user's checkpoint region asked, whether or not granted
            meta["checkpoint"] = "prefer_recompute" if prefers_recompute_tag(node) else "must_recompute"
        if compiler == "inductor" and inductor_kernel(node, category, fusible):
            meta["inductor_kernel"] = True
        if compiler == "inductor" and _scatters_into_copy(node, fusible):
            meta["scatters_into_copy"] = True
        if compiler == "inductor" and category == "reduction" and _unrolled(node):
            meta["unrolled"] = True
        if node.name in workspace:
            meta["workspace"] = workspace[node.name]
        if node.name in copies:
            meta["layout_copy"] = copies[node.name]
        if _has_symbolic_shape(val):
            meta["sym_shape"] = [str(d) if _is_symbolic(d) else int(d) for d in val.shape]
        elif compiler == "inductor" and isinstance(val, torch.Tensor) and not val.is_contiguous():
            meta["strides"] = [int(s) for s in val.stride()]  # a kernel reads it in another order
        if node.op == "placeholder":
            _collect_symbols(val, symbols)
        nodes.append(Node(
            name=node.name,
            op=str(getattr(node.target, "__name__", node.target)) if node.op != "placeholder" else "placeholder",
            inputs=tuple(a.name for a in node.all_input_nodes if a.op != "get_attr" or not opaque),
            role=role, bytes=nbytes,
            flops=_flops(node, numel) if node.op == "call_function" and node.name not in unknown else 0.0,
            category=category, shape=shape, dtype=dtype, fusible=fusible,
            must_save=must_save,
            must_recompute=must_recompute,
            can_save=saveable,
            is_output=(role == "forward" and node in fwd_out) or (role == "backward" and node in bwd_out),
            backward_output=role in ("forward", "input", "param") and node in bwd_out,
            meta=meta,
        ))
    _mark_copied_views(graph_nodes, nodes, channels_last)
    meta: dict = {"device": _device_info(joint, nodes), "compiler": compiler}
    if symbols:
        meta["dynamic"] = {"symbols": symbols}
    if channels_last:  # the backward compiles in it too (remat.lower.backend._compile_graph)
        meta["channels_last"] = True
    return Graph(nodes, name=name, meta=meta)


def _device_info(joint: JointInfo, nodes: list[Node]) -> dict:
    """Where the step runs, for the cost model (:func:`remat.cost.model.profile_for_graph`):
    ``{"type": "cuda", "name": <the GPU's name>, "dtype": <the floating dtype holding the most
    parameter and input bytes>}``, or ``{"type": "cpu", ...}``."""
    device = None
    for p in joint.primals:
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor):
            device = val.device
            if device.type != "cpu":
                break
    out: dict = {"type": device.type if device is not None else "cpu"}
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        out["name"] = torch.cuda.get_device_name(device)
    weights: dict[str, int] = {}
    for n in nodes:
        if n.is_primal and n.dtype and ("float" in n.dtype or "bfloat" in n.dtype):
            weights[n.dtype] = weights.get(n.dtype, 0) + int(n.bytes)
    if weights:
        out["dtype"] = max(weights, key=weights.get)
    return out


def _collect_symbols(val, out: dict[str, int]) -> None:
    """The size symbols of an input (``s0``) with their hints, into ``out``."""
    sizes = [val] if isinstance(val, torch.SymInt) else \
        list(val.shape) if isinstance(val, torch.Tensor) else []
    for d in sizes:
        if not isinstance(d, torch.SymInt):
            continue
        expr = d.node.expr
        if expr.is_Symbol:
            out.setdefault(str(expr), _hint(d))
            continue
        env = d.node.shape_env
        values = getattr(env, "backed_var_to_val", None)
        if values is None:
            values = getattr(env, "var_to_val", {})
        for sym in expr.free_symbols:
            if str(sym) not in out and sym in values:
                out[str(sym)] = int(values[sym])
