"""Offload and reload statements as PyTorch ops, for :func:`remat.lower.fx.rebuild`.

A schedule's ``offload v`` copies a value to host memory, the next ``free v`` releases its
device memory once that copy is done, and ``reload v`` copies it back before a later read
(:mod:`remat.plans.schedule`). Lowering writes them with one of two sets of ops, chosen by the
device of the values (:func:`copies_for`):

- :class:`HostCopies` (CPU): remat's own custom ops ``remat::offload(x)``, a copy of ``x``
  into a new host buffer of the same size, stride and dtype, and ``remat::reload(x, device)``,
  a copy back into a new buffer of the same layout. Both are plain synchronous copies, so
  every test runs here and checks values and gradients; they have fake implementations, so
  FakeTensor propagation and inductor compile them (as fallback kernels).
- :class:`AsyncCopies` (CUDA and other accelerators): copies on a transfer stream into pinned
  host buffers, the compute stream waiting on their events, never the host. The offload goes
  where the schedule offloads, its wait where the schedule frees the value; the reload where
  the schedule reloads, its wait just before the value's first reader after it. Which ops,
  :func:`async_ops` says: PyTorch's ``ao::offload``, ``ao::reload`` and ``ao::wait_tensor``
  (``torch._functorch._activation_offloading.offload_ops``) where this torch's have the
  arguments the lowering passes (:func:`ao_problem`), else remat's own
  ``remat::offload_async``, ``remat::reload_async`` and ``remat::wait_copy``
  (:mod:`remat.lower.copy_ops`, for torch 2.10-2.12) on CUDA and XPU. Where neither runs, a
  plan that offloads on such a device raises :class:`~remat.errors.RematError`.

A lowering calls ``offload`` at ``offload v``, ``offloaded`` at the ``free v`` that follows,
``reload`` at ``reload v`` and ``reloaded`` before the first read after it, then ``finish``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from ..errors import RematError
from . import copy_ops

try:  # registers ao::offload, ao::reload and ao::wait_tensor (recent torch only)
    from torch._functorch._activation_offloading import offload_ops as _ao_ops
except ImportError:  # pragma: no cover - depends on the torch version
    _ao_ops = None

AO_SCHEMAS = {
    "offload": ("tensor",),
    "reload": ("tensor", "device", "original_size", "original_stride"),
    "wait_tensor": ("tensor", "keepalive", "last_use_of_storage"),
}
"""The arguments remat's lowering passes to each ``torch.ops.ao`` op, by name: a torch whose
ops lack one of them (torch 2.10-2.12 have none of the ops; early versions of them had no
4-argument ``reload`` and no ``last_use_of_storage``) cannot run the lowering."""


def ao_problem(ns=None) -> str | None:
    """Why this torch's ``ao`` ops (``ns``: ``torch.ops.ao``) cannot run remat's lowering (a
    missing op or argument), or None when their schemas have every argument
    :data:`AO_SCHEMAS` names."""
    ns = torch.ops.ao if ns is None else ns
    for op, wanted in AO_SCHEMAS.items():
        try:
            schema = getattr(ns, op).default._schema
        except (AttributeError, RuntimeError):
            return f"torch {torch.__version__} has no torch.ops.ao.{op}"
        have = [a.name for a in schema.arguments]
        missing = [w for w in wanted if w not in have]
        if missing:
            return (f"torch {torch.__version__}'s torch.ops.ao.{op} has no argument "
                    f"{', '.join(missing)} ({schema})")
    return None


HAS_AO = ao_problem() is None
"""Whether this torch's ``ao`` ops have the schemas remat lowers to (:func:`ao_problem`)."""


@dataclass(frozen=True)
class AsyncOps:
    """One set of asynchronous copy ops: ``offload(x)``, ``reload(host, device, size,
    stride)`` and ``wait(t, **{source: s})``, whose ``source`` keyword names the copy's
    source as the wait's last use (it is never freed behind inductor's back)."""

    name: str
    offload: object
    reload: object
    wait: object
    source: str


def pytorch_ops() -> AsyncOps:
    """PyTorch's ``ao`` copy ops (check :func:`ao_problem` first)."""
    ao = torch.ops.ao
    return AsyncOps("ao", ao.offload.default, ao.reload.default, ao.wait_tensor.default, "last_use_of_storage")


REMAT_OPS = AsyncOps("remat", copy_ops.OFFLOAD, copy_ops.RELOAD, copy_ops.WAIT, "source")
"""remat's own copy ops (:mod:`remat.lower.copy_ops`)."""

REMAT_OPS_DEVICES = ("cuda", "xpu")
"""Device types whose streams and events remat's own copy ops use (``torch.Stream``,
``torch.Event``); CUDA includes ROCm."""


def async_ops(device_type: str) -> AsyncOps | None:
    """The asynchronous copy ops that lower offloads of values on ``device_type``: PyTorch's
    ``ao`` ops where their schemas have what the lowering passes (:func:`ao_problem` is None),
    else remat's own (:data:`REMAT_OPS`) on the devices they run on (:data:`REMAT_OPS_DEVICES`;
    a CPU while a stand-in for their streams is installed, :data:`ASYNC_ON_CPU`), else None.
    Decided at each call: nothing is cached."""
    if ao_problem() is None:
        return pytorch_ops()
    if device_type in REMAT_OPS_DEVICES or device_type == "cpu" and ASYNC_ON_CPU:
        return REMAT_OPS
    return None


def offload_support(device_type: str) -> tuple[bool, str]:
    """Whether remat can lower offloads for values on ``device_type``, and how (or why not):
    remat's synchronous copies on a CPU, else the ops :func:`async_ops` picks."""
    if device_type == "cpu" and not ASYNC_ON_CPU:
        return True, "remat's synchronous host copies (CPU)"
    ops = async_ops(device_type)
    if ops is None:
        return False, (f"{ao_problem()}, and remat's own copy ops run on {'/'.join(REMAT_OPS_DEVICES)} "
                       f"only: offloading on {device_type} has no async copy ops, so plans do not offload here")
    if ops.name == "ao":
        return True, "PyTorch's ao copy ops on a transfer stream"
    return True, (f"remat's own copy ops (remat::offload_async/reload_async/wait_copy) on a side stream, "
                  f"as {ao_problem()}")


ASYNC_ON_CPU = False
"""Lower CPU offloads with the ``ao`` ops too (set by :func:`remat.bench.ao_standin.install`,
which runs them on a CPU)."""


# -- remat's ops: synchronous copies (CPU) ---------------------------------------------------

@torch.library.custom_op("remat::offload", mutates_args=())
def offload(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` in a new host buffer: same size, dtype and, for a dense tensor, stride
    (``empty_like``'s ``preserve_format``; an overlapping or gapped one becomes dense)."""
    out = torch.empty_like(x, device="cpu")
    out.copy_(x)
    return out


@offload.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, device="cpu")


@torch.library.custom_op("remat::reload", mutates_args=())
def reload(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of the host copy ``x`` on ``device``, in a new buffer of ``x``'s layout (which
    :func:`offload` kept from the original)."""
    out = torch.empty_like(x, device=device)
    out.copy_(x)
    return out


@reload.register_fake
def _(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty_like(x, device=device)


# -- how a lowering writes the statements ------------------------------------------------------

def _call(graph: fx.Graph, target, args: tuple, val, name: str, kwargs: dict | None = None) -> fx.Node:
    node = graph.create_node("call_function", target, args, kwargs or {}, name=name)
    node.meta["val"] = val
    if isinstance(val, torch.Tensor):
        from torch.fx.passes.shape_prop import _extract_tensor_metadata
        try:
            node.meta["tensor_meta"] = _extract_tensor_metadata(val)
        except Exception:  # noqa: BLE001 - symbolic sizes: meta["val"] is what inductor reads
            pass
    return node


def _val(node: fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise RematError(f"cannot offload {node.name!r}: it is not a tensor ({type(val).__name__})")
    return val


class HostCopies:
    """remat's synchronous ops (see the module docstring): no waits."""

    OFFLOAD = torch.ops.remat.offload.default
    RELOAD = torch.ops.remat.reload.default

    def host_val(self, val: torch.Tensor) -> torch.Tensor:
        """The meta value of ``val``'s host copy."""
        return torch.empty_like(val, device="cpu")

    def offload(self, graph: fx.Graph, value: fx.Node, name: str) -> fx.Node:
        """At ``offload v``: start copying ``value`` out; returns the (pending) host copy."""
        return _call(graph, self.OFFLOAD, (value,), self.host_val(_val(value)), f"offload_{name}")

    def offloaded(self, graph: fx.Graph, host: fx.Node, value: fx.Node) -> fx.Node:
        """At the ``free v`` after ``offload v``: the host copy, ready; ``value`` may go."""
        return host

    def reload(self, graph: fx.Graph, host: fx.Node, val: torch.Tensor, name: str) -> fx.Node:
        """At ``reload v``: start copying ``host`` back to a tensor like ``val``; returns the
        (pending) device copy."""
        out = torch.empty_like(_val(host), device=val.device)
        return _call(graph, self.RELOAD, (host, val.device), out, f"reload_{name}")

    def reloaded(self, graph: fx.Graph, pending: fx.Node, host: fx.Node) -> fx.Node:
        """Before the first reader after ``reload v``: the device copy, ready."""
        return pending

    def finish(self, graph: fx.Graph) -> None:
        """Once the module is complete."""


class AsyncCopies(HostCopies):
    """Asynchronous copy ops (``ops``, default: :func:`async_ops` for ``device_type``): copies
    on a transfer stream, waits on the compute stream only (see the module docstring).

    Every wait names the copy's source as its last use (``ops.source``: PyTorch's
    ``last_use_of_storage``, remat's ``source``), never as PyTorch's ``keepalive``: a
    ``keepalive`` wait frees the source's storage itself (``resize_(0)``), which inductor does
    not know, so a kernel it places after the wait could write into that freed buffer (on a
    CPU with the ops' stream parts stubbed, ``buf5 = buf0; del buf0  # reuse`` after
    ``wait_tensor(buf2, buf0)`` segfaulted). Named as the last use, the source is freed after
    the wait, as inductor sees it, once the compute stream has waited for the copy."""

    def __init__(self, ops: AsyncOps | None = None, device_type: str = "cuda") -> None:
        ops = async_ops(device_type) if ops is None else ops
        if ops is None:
            raise RematError(
                f"offloading on {device_type} lowers to async copy ops, and {ao_problem()}, while "
                f"remat's own copy ops run on {'/'.join(REMAT_OPS_DEVICES)} only; plan without "
                f"offloading (offload=False) or use a torch release whose ao ops the lowering can use")
        self.ops = ops
        self.OFFLOAD, self.RELOAD, self.WAIT = ops.offload, ops.reload, ops.wait

    def host_val(self, val: torch.Tensor) -> torch.Tensor:
        return torch.empty(val.shape, dtype=val.dtype, device="cpu")  # the host copy is contiguous

    def offloaded(self, graph, host, value):
        return _call(graph, self.WAIT, (host,), host.meta["val"], f"{host.name}_done",
                     {self.ops.source: value})

    def reload(self, graph, host, val, name):
        concrete = all(isinstance(v, int) for v in (*val.shape, *val.stride()))
        if concrete and _dense(list(val.shape), list(val.stride())):
            size, stride = list(val.shape), list(val.stride())  # the original layout
            out = torch.empty_strided(size, stride, dtype=val.dtype, device=val.device)
        else:  # symbolic sizes or a layout empty_strided cannot hold: contiguous
            size = stride = None
            out = torch.empty(val.shape, dtype=val.dtype, device=val.device)
        return _call(graph, self.RELOAD, (host, val.device, size, stride), out, f"reload_{name}")

    def reloaded(self, graph, pending, host):
        return _call(graph, self.WAIT, (pending,), pending.meta["val"], f"{pending.name}_done",
                     {self.ops.source: host})


def _dense(size: list[int], stride: list[int]) -> bool:
    """Whether a layout of concrete ``size`` and ``stride`` covers its elements exactly once
    with no gaps (a permutation of a contiguous layout)."""
    if 0 in size:
        return True
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(size, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def copies_for(values: list[fx.Node]) -> HostCopies:
    """The ops that offload ``values``: remat's synchronous ones on the CPU, asynchronous ones
    (:func:`async_ops`) elsewhere."""
    devices = {_val(v).device.type for v in values}
    if not values or devices <= {"cpu"} and not ASYNC_ON_CPU:  # nothing to copy, or remat's CPU copies
        return HostCopies()
    device = next((d for d in sorted(devices) if d != "cpu"), "cpu")
    return AsyncCopies(device_type=device)


def is_copy(node: fx.Node, kind: str) -> bool:
    """Whether ``node`` is an offload (``kind="offload"``), a reload or a wait of either
    (``"wait"``) written by this module."""
    targets = {"offload": ("remat::offload", "ao::offload", "remat::offload_async"),
               "reload": ("remat::reload", "ao::reload", "remat::reload_async"),
               "wait": ("ao::wait_tensor", "remat::wait_copy")}[kind]
    name = getattr(getattr(node.target, "_schema", None), "name", None)
    return node.op == "call_function" and name in targets
