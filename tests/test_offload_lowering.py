"""Lowering offload and reload statements (remat.lower.offload, remat.lower.fx.rebuild).

On the CPU the copies lower to remat's own ops (``remat::offload`` / ``remat::reload``,
synchronous copies into separate host buffers), so these tests run the whole path
(torch.compile -> inductor's partitioner hook -> lower) and compare the loss and gradients
with eager autograd. The plans come from :func:`remat.solvers.magis.swap.swap` on a min-cut
plan (and, for the U-Net, offloads that close inside the forward: its skip connections).
The CUDA lowering (PyTorch's ``ao`` ops on a transfer stream) is checked for where its
nodes go, not run.
"""

from __future__ import annotations

import functools

import pytest
import torch

import remat
from remat import zoo
from remat.cost.transfer import link_for_graph
from remat.lower import backend as backend_module
from remat.lower import partitioner as partitioner_module
from remat.lower.backend import _SeededInterpreter, _compile_graph, _eager_compile
from remat.lower.fx import _crossing_both_ways, lower
from remat.lower.offload import HAS_AO, AsyncCopies, is_copy
from remat.lower.options import Options
from remat.lower.partitioner import RematPartitioner
from remat.plans.phases import split_schedule
from remat.plans.plan import Plan
from remat.plans.schedule import Schedule
from remat.plans.simulator import simulate
from remat.solvers import names as solver_names
from remat.solvers import solve
from remat.solvers.magis.swap import gaps, offload, swap
from remat.zoo.cnn import ConvBN


def _cut(schedule: Schedule) -> int:
    g = schedule.graph
    return next((k for k, s in enumerate(schedule.statements)
                 if s.op == "compute" and g[s.node].role in ("tangent", "backward")), len(schedule))


def offloading(schedule: Schedule, forward_gaps: int = 0) -> Schedule:
    """``swap(schedule, budget=0)``, then ``forward_gaps`` more of the longest gaps that open
    and close inside the forward swapped out (a U-Net's skip connections)."""
    s = swap(schedule, budget=0)
    link = link_for_graph(s.graph)
    for _ in range(forward_gaps):
        cut = _cut(s)
        inside = [gp for gp in gaps(s) if gp.before < cut and gp.before - gp.after > 3]
        if not inside:
            break
        gp = max(inside, key=lambda gp: (gp.before - gp.after, gp.node))
        cand = offload(s, gp, link)
        if not simulate(cand).valid:
            break
        s = cand
    return s


class OffloadingPartitioner(RematPartitioner):
    """remat's partitioner with the plan a min cut then :func:`offloading` make; keeps each
    graph's plan and lowered modules."""

    def __init__(self, forward_gaps: int = 0, **kwargs):
        super().__init__(Options.create(strict=True, **kwargs))
        self.forward_gaps = forward_gaps
        self.lowered: list[tuple[Plan, torch.fx.GraphModule, torch.fx.GraphModule]] = []

    def _plan(self, graph, split=None, joint=None):
        base = solve(graph, "mincut-conservative")
        return joint, Plan.from_schedule(offloading(base.schedule(), self.forward_gaps), solver="offload-test")

    def __call__(self, gm, joint_inputs, **kwargs):
        fw, bw = super().__call__(gm, joint_inputs, **kwargs)
        self.lowered.append((self._last_plan, fw, bw))  # as inductor receives them
        return fw, bw

    def _report(self, plan: Plan) -> None:
        self._last_plan = plan


def _case(name: str):
    torch.manual_seed(0)
    if name == "cnn-batchnorm":
        model, inputs = ConvBN(), (torch.randn(4, 3, 16, 16),)
        return model, inputs, lambda out: out.float().pow(2).mean()
    c = zoo.build(name, "tiny")
    return c.model, c.inputs, c.loss


def _grads(model, inputs):
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None] + \
        [x.grad.detach().clone() for x in inputs if isinstance(x, torch.Tensor) and x.grad is not None]


def _run(model, inputs, loss_fn, fn):
    model.zero_grad(set_to_none=True)
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None
    loss = loss_fn(fn(*inputs))
    loss.backward()
    return loss.detach(), _grads(model, inputs)


def _compiled(model, part: OffloadingPartitioner, compiler: str):
    if compiler == "eager":
        return torch.compile(model, backend=lambda gm, ex: _eager_compile(gm, ex, part))
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, ex):
        part.keeps_order = True
        return compile_fx(gm, ex, inner_compile=functools.partial(_compile_graph, part),
                          config_patches={"custom_partitioner_fn": part})
    return torch.compile(model, backend=backend)


def _count(gm: torch.fx.GraphModule, kind: str) -> int:
    return sum(1 for n in gm.graph.nodes if is_copy(n, kind))


def _check_lowered(part: OffloadingPartitioner) -> None:
    """Every graph's copies are in its modules: one offload node per offload statement, a
    reload per reload statement the modules need, the crossing host copies in the outputs."""
    assert part.lowered, "the partitioner never ran"
    total = 0
    for plan, fw, bw in part.lowered:
        schedule = plan.schedule()
        split = split_schedule(schedule)
        offloads = sum(1 for s in schedule.statements if s.op == "offload")
        total += offloads
        assert _count(fw, "offload") + _count(bw, "offload") == offloads
        reloads = sum(1 for s in schedule.statements if s.op == "reload")
        assert 0 < _count(fw, "reload") + _count(bw, "reload") <= reloads
        out = fw.graph.find_nodes(op="output")[0].args[0]
        crossing = [n for n in out if isinstance(n, torch.fx.Node) and is_copy(n, "offload")]
        both = _crossing_both_ways(split)  # resident at the cut, reloaded after its free
        assert len(crossing) == len(split.offloaded) + len(both)
        received = {p.name: p for p in bw.graph.find_nodes(op="placeholder")}
        for name in split.offloaded + [f"{v}_host" for v in both]:
            p = received[name]
            assert p.meta["val"].device.type == "cpu"
            assert any(is_copy(u, "reload") for u in p.users), f"{name} is received but never reloaded"
        if split.offloaded:
            assert _count(bw, "reload") >= len(split.offloaded)
    assert total > 0, "no graph offloaded anything: the test checks nothing"


@pytest.mark.parametrize("name,forward_gaps", [("mlp", 0), ("cnn-batchnorm", 0), ("gpt2", 0), ("unet", 3)])
def test_offloaded_plan_gives_eager_gradients(name, forward_gaps):
    model, inputs, loss_fn = _case(name)
    want_loss, want = _run(model, inputs, loss_fn, model)
    part = OffloadingPartitioner(forward_gaps=forward_gaps, compiler="eager")
    got_loss, got = _run(model, inputs, loss_fn, _compiled(model, part, "eager"))
    _check_lowered(part)
    torch.testing.assert_close(got_loss, want_loss)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if forward_gaps:  # a skip connection offloaded and reloaded inside the forward
        assert any(_count(fw, "reload") for _, fw, _ in part.lowered)


@pytest.mark.inductor
def test_offloaded_plan_under_inductor():
    """Inductor compiles remat's copy ops as fallback kernels, in the plan's order."""
    model, inputs, loss_fn = _case("mlp")
    want_loss, want = _run(model, inputs, loss_fn, model)
    part = OffloadingPartitioner(compiler="inductor")
    got_loss, got = _run(model, inputs, loss_fn, _compiled(model, part, "inductor"))
    _check_lowered(part)
    torch.testing.assert_close(got_loss, want_loss)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class _AoOnCpu(_SeededInterpreter):
    """Runs PyTorch's ``ao`` copy ops as a CPU stand-in would: ``ao.offload`` a contiguous
    host copy, ``ao.reload`` a copy in the given layout, ``ao.wait_tensor`` frees its
    ``keepalive``'s storage (``resize_(0)``) as the real one does once the copy is done. A
    wait placed too early, or a keepalive whose storage is still read, shows as an error or a
    wrong gradient."""

    def call_function(self, target, args, kwargs):
        ao = torch.ops.ao
        if target is ao.offload.default:
            (x,) = args
            return torch.empty(x.shape, dtype=x.dtype).copy_(x)
        if target is ao.reload.default:
            x, device, size, stride = (list(args) + [None, None])[:4]
            out = torch.empty(x.shape, dtype=x.dtype, device=device) if size is None else \
                torch.empty_strided(size, stride, dtype=x.dtype, device=device)
            return out.copy_(x)
        if target is ao.wait_tensor.default:
            tensor, keepalive = (list(args) + [None])[:2]
            keepalive = kwargs.get("keepalive", keepalive)
            if keepalive is not None:
                keepalive.untyped_storage().resize_(0)
            return tensor
        return super().call_function(target, args, kwargs)


@pytest.mark.skipif(not HAS_AO, reason="this torch has no torch.ops.ao offload ops")
@pytest.mark.parametrize("name,forward_gaps", [("cnn-batchnorm", 0), ("unet", 3)])
def test_cuda_lowering_places_ao_ops_as_the_schedule_says(name, forward_gaps, monkeypatch):
    """The CUDA lowering (PyTorch's ``ao`` ops) on the CPU, its ops run by a stand-in: the
    gradients are eager's, every ``ao.offload`` / ``ao.reload`` has exactly one wait, which
    names the copy's source as ``last_use_of_storage`` (never ``keepalive``, whose free inductor
    cannot see), a reload's wait comes right before its first reader, and the forward hands the
    backward the waited host copies."""
    monkeypatch.setattr(backend_module, "_SeededInterpreter", _AoOnCpu)
    monkeypatch.setattr(partitioner_module, "lower", lambda j, p: lower(j, p, copies=AsyncCopies()))
    model, inputs, loss_fn = _case(name)
    want_loss, want = _run(model, inputs, loss_fn, model)
    part = OffloadingPartitioner(forward_gaps=forward_gaps, compiler="eager")
    got_loss, got = _run(model, inputs, loss_fn, _compiled(model, part, "eager"))
    torch.testing.assert_close(got_loss, want_loss)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    ao = torch.ops.ao
    n_waits = 0
    for plan, fw, bw in part.lowered:
        offloads = sum(1 for s in plan.schedule().statements if s.op == "offload")
        assert sum(1 for m in (fw, bw) for n in m.graph.nodes if n.target is ao.offload.default) == offloads
        for m in (fw, bw):
            nodes = list(m.graph.nodes)
            for k, n in enumerate(nodes):
                if n.target in (ao.offload.default, ao.reload.default):
                    waits = [u for u in n.users if u.target is ao.wait_tensor.default]
                    assert len(waits) == 1 and len(n.users) == 1, n.name
                if n.target is ao.reload.default:
                    (wait,) = n.users
                    later = nodes[nodes.index(wait) + 1:]
                    first = next(u for u in later if u.target is not ao.wait_tensor.default)
                    assert first in wait.users or first.op == "output", f"{wait.name} is not waited for where read"
                if n.target is ao.wait_tensor.default:  # inductor sees the source's last use
                    assert len(n.args) == 1 and "keepalive" not in n.kwargs, n.format_node()
                    assert isinstance(n.kwargs.get("last_use_of_storage"), torch.fx.Node), n.format_node()
                    n_waits += 1
        out = fw.graph.find_nodes(op="output")[0].args[0]
        for n in out:
            if isinstance(n, torch.fx.Node) and n.target is ao.offload.default:
                raise AssertionError(f"forward returns {n.name} before waiting for it")
    assert n_waits > 0


@pytest.mark.skipif("swap" not in solver_names(), reason="no swap solver registered")
def test_remat_compile_with_the_swap_solver_runs_its_offloads(monkeypatch):
    """The whole path: remat.compile -> the partitioner hook -> the swap solver's plan ->
    lower. The modules carry the plan's copies and the gradients are eager's."""
    lowered = []

    def recording(joint, plan):
        fw, bw = lower(joint, plan)
        lowered.append((plan, fw, bw))
        return fw, bw

    monkeypatch.setattr(partitioner_module, "lower", recording)
    model, inputs, loss_fn = _case("cnn-batchnorm")
    want_loss, want = _run(model, inputs, loss_fn, model)
    step = remat.compile(model, solver="swap", budget=0.8, compiler="eager", strict=True)
    got_loss, got = _run(model, inputs, loss_fn, step)
    torch.testing.assert_close(got_loss, want_loss)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert lowered
    for plan, fw, bw in lowered:
        offloads = sum(1 for s in plan.schedule().statements if s.op == "offload")
        assert offloads > 0, "the swap plan offloads nothing at this budget: the test checks nothing"
        assert _count(fw, "offload") + _count(bw, "offload") == offloads
        assert _count(fw, "reload") + _count(bw, "reload") > 0
