"""remat's own asynchronous copy ops (remat.lower.copy_ops), the ones that offload on torch
releases whose PyTorch ``ao`` ops are missing or older (torch 2.10-2.12).

On this CPU their stream parts run on :class:`remat.bench.ao_standin.CpuStreams`, whose side
stream runs a copy only when something waits for it and poisons its destination (NaN) until
then: a reader before its wait, or a source reused mid-copy, gives a wrong gradient here.
The lowered steps are checked against eager autograd, and every copy issued is waited for.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

import remat
from remat.bench.ao_standin import standing_in
from remat.lower import copy_ops
from remat.lower import offload as lowering
from remat.lower import partitioner as partitioner_module
from remat.lower.copy_ops import HostPool
from remat.lower.fx import lower
from remat.lower.offload import REMAT_OPS, AsyncCopies, async_ops, is_copy

OPS = torch.ops.remat


@pytest.fixture
def on_standin():
    copy_ops.forget_pending()
    with standing_in() as t:
        yield t
    assert copy_ops.forget_pending() == 0, "a copy was left pending"


def _plain(n, dtype):
    return torch.empty(n, dtype=dtype)


def test_the_pool_reuses_a_buffer_only_once_nothing_holds_it():
    pool = HostPool(alloc=_plain)
    a = pool.take(12, torch.float32, "cuda:0").view(3, 4)
    b = pool.take(12, torch.float32, "cuda:0")
    assert a.data_ptr() != b.data_ptr(), "a buffer in use was handed out twice"
    a_ptr = a.data_ptr()
    view = a.t()  # a view keeps the buffer in use
    del a
    c = pool.take(12, torch.float32, "cuda:0")
    assert c.data_ptr() not in (a_ptr, b.data_ptr())
    assert pool.stats()["in_use"] == 3
    del view
    d = pool.take(12, torch.float32, "cuda:0")
    assert d.data_ptr() == a_ptr and pool.stats()["reused"] == 1
    # another size, dtype or device never gets it
    del d
    others = [pool.take(6, torch.float32, "cuda:0"), pool.take(12, torch.float16, "cuda:0"),
              pool.take(12, torch.float32, "cuda:1")]
    assert a_ptr not in {o.data_ptr() for o in others}
    assert pool.stats()["buffers"] == 6 and pool.stats()["in_use"] == 5
    # a storage shared another way (detach, set_) still counts as held
    e = pool.take(12, torch.float32, "cuda:0")
    assert e.data_ptr() == a_ptr
    kept = torch.empty(0).set_(e.untyped_storage())
    del e
    f = pool.take(12, torch.float32, "cuda:0")
    assert f.data_ptr() != a_ptr
    del kept, f, b, c, others
    assert pool.stats()["in_use"] == 0
    assert pool.clear() == 7 and pool.stats()["buffers"] == 0


def test_a_pending_copy_holds_its_buffers_and_lands_at_its_wait(on_standin):
    """On the stand-in a copy runs at its wait: before it the host copy reads NaN; the source,
    dropped by the caller, is kept alive until then; the reload lands in the original layout."""
    x = torch.randn(5, 7).t()  # not contiguous
    want = x.clone()
    before = copy_ops.counts()
    host = OPS.offload_async(x)
    assert host.is_contiguous() and host.shape == x.shape and copy_ops.pending() == 1
    assert torch.isnan(host).all(), "the stand-in ran the copy before its wait"
    source = StorageWeakRef(x.untyped_storage())
    del x  # the pending copy keeps its source alive
    assert not source.expired()
    host = OPS.wait_copy(host, source=None)
    assert source.expired(), "the wait did not let go of the source"
    torch.testing.assert_close(host, want, rtol=0, atol=0)
    dev = OPS.reload_async(host, torch.device("cpu"), list(want.shape), list(want.stride()))
    assert dev.stride() == want.stride() and torch.isnan(dev).all()
    dev = OPS.wait_copy(dev, source=host)
    torch.testing.assert_close(dev, want, rtol=0, atol=0)
    after = copy_ops.counts()
    assert after["issued"] - before["issued"] == 2 == after["waited"] - before["waited"]
    assert on_standin.copies == 2 and on_standin.queued() == 0
    with pytest.raises(RuntimeError, match="no copy into this"):
        OPS.wait_copy(dev)  # waited for once already


def test_a_finished_copy_lets_go_and_one_nobody_can_wait_for_is_dropped(on_standin):
    """Once a copy is done the registry no longer holds its source; a copy done whose
    destination is gone (a step that failed before the wait) is no longer pending."""
    side = on_standin.side_stream(torch.device("cpu"))
    y = torch.randn(8)
    host = OPS.offload_async(y)
    source = StorageWeakRef(y.untyped_storage())
    del y
    side.run()  # the copy finishes
    assert copy_ops.pending() == 1 and source.expired()  # its wait may still come
    OPS.wait_copy(host)
    before = copy_ops.counts()
    x = torch.randn(8)
    lost = OPS.offload_async(x)
    source = StorageWeakRef(x.untyped_storage())
    del x, lost  # never waited for
    assert copy_ops.pending() == 1 and not source.expired(), "a running copy let go of its source"
    side.run()
    assert copy_ops.pending() == 0 and source.expired()
    assert copy_ops.counts()["abandoned"] == before["abandoned"] + 1
    # an abandoned copy's host buffer, handed out again: its wait is the new copy's
    lost = OPS.offload_async(torch.randn(8))
    side.run()
    ptr = lost.data_ptr()
    del lost
    z = torch.randn(8)
    again = OPS.offload_async(z)
    assert again.data_ptr() == ptr and copy_ops.pending() == 1
    torch.testing.assert_close(OPS.wait_copy(again, source=z), z, rtol=0, atol=0)


def test_on_a_cpu_without_a_stand_in_the_copies_are_synchronous():
    assert isinstance(copy_ops.transport(), copy_ops.Streams)
    x = torch.arange(6.0).view(2, 3)
    host = OPS.offload_async(x)
    torch.testing.assert_close(host, x)  # already there
    assert copy_ops.pending() == 1
    OPS.wait_copy(host, source=x)
    assert copy_ops.pending() == 0


def test_the_ops_propagate_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 6).t()
        host = OPS.offload_async(x)
        waited = OPS.wait_copy(host, source=x)
        dev = OPS.reload_async(waited, torch.device("cpu"), [6, 4], [1, 6])
    assert host.device.type == "cpu" and host.is_contiguous() and waited.shape == (6, 4)
    assert dev.stride() == (1, 6)
    assert copy_ops.pending() == 0, "a fake copy was registered"


def test_remat_ops_are_chosen_where_the_ao_ops_cannot_run(monkeypatch):
    """This torch's ``ao`` ops fit: they lower offloads. Where they do not (torch 2.11 has none),
    remat's own do, on CUDA and XPU; nothing does on a device remat's ops do not know."""
    assert async_ops("cuda").name == ("ao" if lowering.ao_problem() is None else "remat")
    monkeypatch.setattr(lowering, "ao_problem", lambda ns=None: "torch X has no torch.ops.ao.offload")
    assert async_ops("cuda") is REMAT_OPS and async_ops("xpu") is REMAT_OPS
    ok, how = lowering.offload_support("cuda")
    assert ok and "remat::offload_async" in how and "no torch.ops.ao.offload" in how
    assert async_ops("mps") is None
    ok, why = lowering.offload_support("mps")
    assert not ok and "no torch.ops.ao.offload" in why and "cuda/xpu" in why
    with pytest.raises(remat.RematError, match="offload=False"):
        AsyncCopies(device_type="mps")
    assert async_ops("cpu") is None and lowering.offload_support("cpu")[0]  # remat's synchronous copies
    monkeypatch.setattr(lowering, "ASYNC_ON_CPU", True)
    assert async_ops("cpu") is REMAT_OPS


def _case(name: str):
    from test_offload_lowering import _case as case
    return case(name)


def _steps(model, inputs, loss_fn, fn, n=2):
    from test_offload_lowering import _run
    return [_run(model, inputs, loss_fn, fn) for _ in range(n)]


def _assert_equal(got, want):
    for (gl, gg), (wl, wg) in zip(got, want):
        torch.testing.assert_close(gl, wl)
        assert len(gg) == len(wg) > 0
        for a, b in zip(gg, wg):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,forward_gaps", [("cnn-batchnorm", 0), ("unet", 3)])
def test_lowered_with_remat_ops_gives_eager_gradients(name, forward_gaps, on_standin, monkeypatch):
    """A min cut swapped down (and, for the U-Net, skip connections offloaded and reloaded
    inside the forward) lowered with remat's ops, two steps: eager's gradients; one copy issued
    per offload and reload node the modules run, each waited for; the pool's host buffers
    reused in the second step."""
    from test_offload_lowering import OffloadingPartitioner, _compiled
    monkeypatch.setattr(partitioner_module, "lower", lambda j, p: lower(j, p, copies=AsyncCopies(REMAT_OPS)))
    model, inputs, loss_fn = _case(name)
    want = _steps(model, inputs, loss_fn, model)
    part = OffloadingPartitioner(forward_gaps=forward_gaps, compiler="eager")
    step = _compiled(model, part, "eager")
    before, pool = copy_ops.counts(), copy_ops.POOL.stats()
    got = _steps(model, inputs, loss_fn, step)
    _assert_equal(got, want)
    nodes = [n for _, fw, bw in part.lowered for m in (fw, bw) for n in m.graph.nodes]
    copies = sum(is_copy(n, "offload") or is_copy(n, "reload") for n in nodes)
    assert copies > 0 and sum(is_copy(n, "wait") for n in nodes) == copies
    assert all(n.target in (REMAT_OPS.offload, REMAT_OPS.reload, REMAT_OPS.wait) for n in nodes if
               is_copy(n, "offload") or is_copy(n, "reload") or is_copy(n, "wait"))
    after = copy_ops.counts()
    assert after["issued"] - before["issued"] == 2 * copies == after["waited"] - before["waited"]
    assert copy_ops.pending() == 0 and on_standin.queued() == 0
    stats = copy_ops.POOL.stats()
    assert stats["buffers"] - pool["buffers"] < stats["taken"] - pool["taken"], "no host buffer was reused"
    if forward_gaps:
        assert any(is_copy(n, "reload") for _, fw, _ in part.lowered for n in fw.graph.nodes)


def test_a_read_before_its_wait_shows_on_the_stand_in(on_standin, monkeypatch):
    """The check above can fail: a lowering whose reloads are read without their waits gives
    NaN gradients on the stand-in."""
    from test_offload_lowering import OffloadingPartitioner, _compiled

    class NoReloadWait(AsyncCopies):
        def reloaded(self, graph, pending, host):
            return pending

    monkeypatch.setattr(partitioner_module, "lower", lambda j, p: lower(j, p, copies=NoReloadWait(REMAT_OPS)))
    model, inputs, loss_fn = _case("cnn-batchnorm")
    part = OffloadingPartitioner(compiler="eager")
    (_, grads), = _steps(model, inputs, loss_fn, _compiled(model, part, "eager"), n=1)
    assert any(torch.isnan(g).any() for g in grads)
    assert copy_ops.forget_pending() > 0  # the reloads were never waited for
    on_standin.compute.run()


def _check_wrapper_order(codes: list[str]) -> None:
    """In inductor's wrapper code every copy is a fallback call, its wait comes after it and
    names its source, and that source is neither freed nor handed to another buffer between
    the two."""
    import re
    lines = [ln.strip() for code in codes for ln in code.splitlines()]
    copies = [(k, m.group(1)) for k, ln in enumerate(lines)
              if (m := re.search(r"torch\.ops\.remat\.(?:offload|reload)_async\.default\((\w+)", ln))]
    assert copies, "inductor's code calls none of remat's copy ops"
    for k, src in copies:
        wait = next((j for j in range(k + 1, len(lines))
                     if "torch.ops.remat.wait_copy.default(" in lines[j] and f"source={src})" in lines[j]), None)
        assert wait is not None, f"no wait names {src} as its source after {lines[k]!r}"
        between = lines[k + 1:wait]
        assert not [ln for ln in between if re.search(rf"\bdel {src}\b", ln)], \
            f"{src} is freed or reused before its copy's wait: {between}"


def _compile_step(name, compiler, budget, monkeypatch):
    """remat.compile(solver="swap") as on torch 2.11: this torch's ``ao`` ops look absent."""
    monkeypatch.setattr(lowering, "ao_problem", lambda ns=None: f"torch {torch.__version__} has no "
                        "torch.ops.ao.offload (hidden by the test)")
    model, inputs, loss_fn = _case(name)
    want = _steps(model, inputs, loss_fn, model)
    plans = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = remat.compile(model, solver="swap", budget=budget, compiler=compiler, cache=False, strict=True,
                             on_plan=lambda g, p: plans.append(p))
        before = copy_ops.counts()
        if compiler == "inductor":  # keep the wrapper code inductor writes
            from torch._inductor.utils import run_and_get_code
            first, codes = run_and_get_code(_steps, model, inputs, loss_fn, step, n=1)
            got = first + _steps(model, inputs, loss_fn, step, n=1)
            _check_wrapper_order(codes)
        else:
            got = _steps(model, inputs, loss_fn, step)
    _assert_equal(got, want)
    offloads = sum(s.op == "offload" for p in plans for s in p.schedule().statements)
    assert plans and offloads > 0, "no plan offloaded: the test checks nothing"
    after = copy_ops.counts()
    assert after["issued"] - before["issued"] >= 2 * 2 * offloads  # each offload and its reload, two steps
    assert after["issued"] - before["issued"] == after["waited"] - before["waited"]
    assert copy_ops.pending() == 0
    assert not [w for w in caught if w.category.__module__.startswith("remat")], [str(w.message) for w in caught]
    return plans


def test_remat_compile_offloads_with_remat_ops_where_ao_is_missing(on_standin, monkeypatch):
    """The user's path on torch 2.11: ``offload_support`` says remat's ops run, the swap solver
    offloads (strict: no fallback), and the step gives eager's gradients."""
    plans = _compile_step("mlp", "eager", "min", monkeypatch)
    assert all(p.graph.meta["offload"]["allowed"] for p in plans)
    assert all("remat::offload_async" in p.graph.meta["offload"]["reason"] for p in plans)
    assert on_standin.copies > 0


@pytest.mark.inductor
def test_remat_ops_under_inductor(on_standin, monkeypatch):
    """The same under inductor: its fallback kernels run remat's ops in the plan's order, and
    a source is not handed to another kernel before its copy ran (the stand-in runs copies at
    their waits, so a reused source would give a wrong gradient)."""
    _compile_step("mlp", "inductor", "min", monkeypatch)
    assert on_standin.copies > 0
