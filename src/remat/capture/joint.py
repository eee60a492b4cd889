"""The one place remat touches PyTorch's private partitioner API (torch._functorch.partitioners).

Those functions are private and their signatures drift between releases; everything remat
needs from them goes through here, and the versions remat is tested on are listed in
``TESTED_TORCH``. Public helpers:

- :func:`copy_joint` copies a joint graph module (``copy.deepcopy`` fails on fake storages);
- :func:`prepare_joint` runs the clean-up torch's min-cut partitioner runs before choosing
  (DCE, CSE, recompute-tag clean-up, forced saves) and classifies nodes;
- :func:`partition_with_saved` builds the forward and backward modules from a saved set,
  exactly as torch's partitioner does once it has chosen (RNG functionalization, backward
  reordering, getitem raising);
- :func:`torch_mincut` / :func:`no_recompute` run PyTorch's own partitioners (baselines);
  PyTorch's activation offloading, built on them, is in :mod:`remat.lower.torch_offload`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import torch
import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as P
from torch.fx.experimental import symbolic_shapes as ss
from torch.fx.experimental.proxy_tensor import is_sym_node
from torch.utils.checkpoint import CheckpointPolicy

TESTED_TORCH = ("2.11", "2.13")
aten = torch.ops.aten


def torch_version_ok() -> bool:
    return any(torch.__version__.startswith(v) for v in TESTED_TORCH)


def copy_joint(gm: fx.GraphModule) -> fx.GraphModule:
    """An independent copy of a joint graph module (node names and meta preserved)."""
    g = fx.Graph()
    out = g.graph_copy(gm.graph, {}, return_output_node=True)
    if isinstance(out, tuple):  # graph_copy returns (value, output_node) when asked
        out_val, out_node = out
        g.output(out_val, type_expr=getattr(out_node, "type", None))
        g.find_nodes(op="output")[0].meta = dict(out_node.meta)
    else:
        g.output(out)
    return fx.GraphModule(gm, g)


@dataclasses.dataclass
class JointInfo:
    """What the partitioner knows about each node of a prepared joint graph."""

    gm: fx.GraphModule
    num_fwd_outputs: int
    primals: list[fx.Node]
    tangents: list[fx.Node]
    fwd_outputs: list[fx.Node]
    bwd_outputs: list[fx.Node]
    required_fw: set[fx.Node]
    tangent_closure: set[fx.Node]
    static_lifetime_inputs: set[fx.Node]
    node_info: Any


def prepare_joint(gm: fx.GraphModule, num_fwd_outputs: int,
                  static_lifetime_input_indices: Sequence[int] | None = None) -> JointInfo:
    """Clean a joint graph up as torch's min-cut partitioner does, and classify its nodes."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    if functorch_config.cse:
        gm.graph = P.fx_graph_cse(gm.graph)
        gm.recompile()
    if P.has_recomputable_ops(gm):
        gm = P.cleanup_recompute_tags(gm, is_default_partition=False)
    if not functorch_config.unsafe_allow_optimization_of_collectives:
        P.force_save_collectives(gm)
    P.force_save_effectful_ops(gm)
    P.force_save_bw_mutation_src(gm)
    info = P.classify_nodes(gm, list(static_lifetime_input_indices or []), num_fwd_outputs)
    fwd_outputs, bwd_outputs, _, _ = P._extract_fwd_bwd_outputs(gm, num_fwd_outputs=num_fwd_outputs)
    placeholders = gm.graph.find_nodes(op="placeholder")
    return JointInfo(
        gm=gm, num_fwd_outputs=num_fwd_outputs,
        primals=[p for p in placeholders if P._is_primal(p) or P._is_fwd_seed_offset(p)],
        tangents=[p for p in placeholders if P._is_tangent(p) or P._is_bwd_seed_offset(p)],
        fwd_outputs=[o for o in fwd_outputs if isinstance(o, fx.Node)],
        bwd_outputs=[o for o in bwd_outputs if isinstance(o, fx.Node)],
        required_fw=set(info.required_fw_nodes),
        tangent_closure=set(info.tangents_closure),
        static_lifetime_inputs=set(info.static_lifetime_input_nodes),
        node_info=info,
    )


def must_save_tag(node: fx.Node) -> bool:
    return (node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE
            or P._has_tag_must_be_in_forward(node))


def must_recompute_tag(node: fx.Node) -> bool:
    """Tagged MUST_RECOMPUTE or PREFER_RECOMPUTE: inside a ``torch.utils.checkpoint`` region
    (PREFER_RECOMPUTE) or chosen so by a selective-checkpoint policy."""
    return P.must_recompute(node)


def prefers_recompute_tag(node: fx.Node) -> bool:
    """Tagged PREFER_RECOMPUTE (what a plain ``torch.utils.checkpoint`` region asks for), as
    opposed to a policy's MUST_RECOMPUTE."""
    return node.meta.get("recompute") == CheckpointPolicy.PREFER_RECOMPUTE


def partition_with_saved(joint: JointInfo, saved: Iterable[fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules for a chosen saved set (torch's extraction, unchanged)."""
    gm = joint.gm
    saved = list(saved)
    saved_sym = [n for n in saved if is_sym_node(n)]
    opaque = getattr(P, "is_opaque_node", None)  # torch >= 2.12 passes opaque objects apart
    saved_opaque = [n for n in saved if opaque is not None and opaque(n)]
    saved_values = [n for n in saved if not is_sym_node(n) and n not in saved_opaque]
    extra = {"saved_opaque_nodes": saved_opaque} if opaque is not None else {}
    fw, bw = P._extract_fwd_bwd_modules(
        gm, saved_values, saved_sym_nodes=saved_sym, num_fwd_outputs=joint.num_fwd_outputs,
        static_lifetime_input_nodes=joint.node_info.static_lifetime_input_nodes, **extra,
    )
    if P.has_recomputable_ops(gm) and P.has_recomputable_rng_ops(gm):
        fw, bw = P.functionalize_rng_ops(gm, fw, bw, len(saved_sym))
    bw = P.reordering_to_mimic_autograd_engine(bw)
    fw = P.raise_getitems(fw)
    bw = P.raise_getitems(bw)
    fw = P.thread_graphsafe_rng_from_hops(fw, is_backward=False)
    bw = P.thread_graphsafe_rng_from_hops(bw, is_backward=True)
    return fw, bw


def torch_mincut(gm: fx.GraphModule, joint_inputs: Any, **kwargs) -> tuple[fx.GraphModule, fx.GraphModule]:
    """PyTorch's own partitioner (min_cut_rematerialization_partition), the baseline."""
    kwargs.setdefault("compiler", "inductor")
    return P.min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)


def no_recompute(gm: fx.GraphModule, joint_inputs: Any, **kwargs) -> tuple[fx.GraphModule, fx.GraphModule]:
    """PyTorch's default_partition: saves what eager autograd would, recomputes nothing."""
    kwargs.pop("compiler", None)
    return P.default_partition(gm, joint_inputs, **kwargs)


def saved_from_backward(bw: fx.GraphModule) -> list[str]:
    """Names of the values a partition saves: the backward's inputs that are not tangents."""
    return [p.name for p in bw.graph.find_nodes(op="placeholder")
            if not P._is_tangent(p) and not P._is_bwd_seed_offset(p) and not P._is_backward_state(p)]


def is_tangent_like(p: fx.Node) -> bool:
    """A backward placeholder that is not a saved value: a tangent, an RNG offset or state."""
    return P._is_tangent(p) or P._is_bwd_seed_offset(p) or P._is_backward_state(p)


def op_types():
    return P.get_default_op_list()


def size_of(node: fx.Node) -> int:
    return int(P._size_of(node))


def size_hint(x) -> int:
    """A symbolic size's value for the shapes being compiled (its hint), read without adding a
    guard: ``int(sym)`` or a comparison would specialise the graph to these sizes, and dynamo
    would then recompile for every new batch size or sequence length."""
    if isinstance(x, int):
        return x
    for name in ("optimization_hint", "size_hint", "hint_int"):
        fn = getattr(ss, name, None)  # the name changes between torch releases; none guards
        if fn is not None:
            try:
                return int(fn(x))
            except Exception:  # noqa: BLE001 - try the next spelling
                continue
    return int(x.node.hint)
