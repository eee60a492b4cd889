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
  :func:`torch_offload` its min cut with its activation offloading made to offload, and
  :func:`offload_transfers` counts the copies a forward module makes.
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


def _ao_op(name: str):
    """``torch.ops.ao.<name>.default``, or None where this torch lacks it (2.11 and older)."""
    try:
        import torch._functorch._activation_offloading.offload_ops  # noqa: F401 - registers ao ops
    except ImportError:
        return None
    try:
        return getattr(getattr(torch.ops.ao, name), "default")
    except (AttributeError, RuntimeError):
        return None


def _joint_devices(gm: fx.GraphModule) -> set[str]:
    """The device types of the joint graph's tensor values."""
    devices = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            devices.add(val.device.type)
    return devices


def offload_separate_stream(gm: fx.GraphModule) -> bool:
    """Whether PyTorch's activation offloading should run its copies on a side stream (its
    ``ao`` ops) for this joint graph: on an accelerator, yes; on a CPU only where the ops'
    stream parts are replaced by stand-ins (:func:`remat.bench.ao_standin.install`), else its
    synchronous ``prims.device_put`` copies."""
    if _ao_op("offload") is None:
        # torch without the ao ops: its side-stream path is device_put + stream ops (CUDA only)
        return bool(_joint_devices(gm) - {"cpu", "meta"})
    if _joint_devices(gm) - {"cpu", "meta"}:
        return True
    from ..lower import offload as lowering  # lazily: capture does not import lower otherwise
    return bool(getattr(lowering, "ASYNC_ON_CPU", False))


def mark_all_offload(gm: fx.GraphModule) -> int:
    """Mark every computed value of a joint graph ``meta["should_offload"]`` (torchtune's
    offload-everything policy); PyTorch's ``can_offload`` keeps only the saved activations
    among them (no views, getitems, non-contiguous tensors, model outputs or static inputs).
    Returns how many nodes were marked."""
    marked = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor):
            n.meta["should_offload"] = True
            marked += 1
    return marked


def torch_offload(gm: fx.GraphModule, joint_inputs: Any, *, separate_stream: bool | None = None,
                  waits: str = "pytorch", **kwargs) -> tuple[fx.GraphModule, fx.GraphModule]:
    """PyTorch's own activation offloading, made to offload: its min cut
    (:func:`torch_mincut`) with every saved activation marked ``should_offload`` inside the
    partitioner (marks made in a joint-graph pass are lost under inductor) and
    ``enable_activation_offloading`` on while it partitions. ``separate_stream``: use the
    ``ao`` ops on a side stream (default: :func:`offload_separate_stream`). Count what it
    copies with :func:`offload_transfers` on the forward module.

    ``waits="pytorch"`` keeps the forward as PyTorch writes it: each offload's
    ``ao.wait_tensor`` frees the device tensor as its ``keepalive``, which inductor does not
    know; it may reuse that buffer for a kernel it runs after the wait (measured on torch 2.13
    with :mod:`remat.bench.ao_standin`: a segfault on GPT-2 and on a 3-layer MLP).
    ``waits="last-use"`` passes it as ``last_use_of_storage`` instead (:func:`last_use_waits`)."""
    if waits not in ("pytorch", "last-use"):
        raise ValueError(f"waits={waits!r}: 'pytorch' or 'last-use'")
    mark_all_offload(gm)
    if separate_stream is None:
        separate_stream = offload_separate_stream(gm)
    patch = {"enable_activation_offloading": True}
    if hasattr(functorch_config, "activation_offload_separate_stream"):
        patch["activation_offload_separate_stream"] = bool(separate_stream)
    with functorch_config.patch(**patch):
        fw, bw = torch_mincut(gm, joint_inputs, **kwargs)
    if waits == "last-use":
        last_use_waits(fw)
    return fw, bw


def last_use_waits(fw: fx.GraphModule) -> int:
    """Make each offload's ``ao.wait_tensor(cpu, keepalive=src)`` in a forward module a
    ``ao.wait_tensor(cpu, last_use_of_storage=src)``: the wait no longer frees ``src``'s
    storage behind inductor's back; ``src`` is freed when its last reader (the wait) is done.
    Returns how many waits changed; raises where this torch's ``wait_tensor`` has no
    ``last_use_of_storage``."""
    from ..lower.offload import ao_problem  # the one schema check (lazily, as above)
    problem = ao_problem()
    if problem is not None:
        raise RuntimeError(problem)
    wait, offload = _ao_op("wait_tensor"), _ao_op("offload")
    changed = 0
    for n in fw.graph.nodes:
        if n.op != "call_function" or n.target is not wait:
            continue
        src = n.args[0] if n.args else None
        if not (isinstance(src, fx.Node) and src.target is offload):
            continue  # a reload's wait: it frees the host copy, which no kernel reuses
        keep = n.args[1] if len(n.args) > 1 else n.kwargs.get("keepalive")
        if keep is None:
            continue
        n.args = (n.args[0],)
        n.kwargs = {"last_use_of_storage": keep}
        changed += 1
    fw.recompile()
    return changed


def offload_transfers(fw: fx.GraphModule) -> int:
    """How many values a forward module copies to host memory: its ``ao.offload`` nodes, or
    its ``prims.device_put`` to the CPU (PyTorch's synchronous or pre-``ao`` offloading)."""
    offload = _ao_op("offload")
    count = 0
    for n in fw.graph.nodes:
        if n.op != "call_function":
            continue
        if offload is not None and n.target is offload:
            count += 1
        elif n.target is torch.ops.prims.device_put.default:
            dev = n.args[1] if len(n.args) > 1 else n.kwargs.get("device")
            if dev is not None and torch.device(dev).type == "cpu":
                count += 1
    return count


def saved_before_offload(bw: fx.GraphModule) -> list[str]:
    """:func:`saved_from_backward` with PyTorch's offloaded values under their own names (its
    offloading renames a saved ``x`` to ``cpu_offload_x`` in the backward's inputs)."""
    try:
        from torch._functorch._activation_offloading.activation_offloading import CPU_OFFLOAD_PREFIX
    except ImportError:  # a torch without activation offloading
        CPU_OFFLOAD_PREFIX = "cpu_offload_"
    return [s.removeprefix(CPU_OFFLOAD_PREFIX) for s in saved_from_backward(bw)]
