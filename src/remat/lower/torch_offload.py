"""PyTorch's own activation offloading as a baseline partitioner (solver ``torch-offload``):
its min cut with every saved activation marked for offloading, and what its forward copies.

- :func:`torch_offload` partitions a joint graph as PyTorch's activation offloading does;
- :func:`last_use_waits` rewrites its waits so inductor cannot reuse a buffer a copy reads;
- :func:`offload_transfers` counts the copies a forward module makes, and
  :func:`saved_before_offload` names its saved values as they were before offloading renamed them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch._functorch import config as functorch_config

from ..capture.joint import saved_from_backward, torch_mincut
from . import offload as lowering


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
    return bool(lowering.ASYNC_ON_CPU)  # read at call time: the ao stand-in sets it


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
    problem = lowering.ao_problem()  # the one schema check
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
