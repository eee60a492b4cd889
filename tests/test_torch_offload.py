"""PyTorch's own activation offloading as a baseline (solver ``"torch-offload"``).

``torch._functorch.config.enable_activation_offloading`` copies only the nodes marked
``meta["should_offload"]``, and nothing in torch marks them. ``torch-offload`` is PyTorch's
min cut with every saved activation marked inside the partitioner
(:func:`remat.lower.torch_offload.torch_offload`); each plan reports how many values its forward
copies out (``plan.transfers``). On this CPU the copies are PyTorch's synchronous
``prims.device_put``; with :func:`remat.bench.ao_standin.install` (process-wide: run in a
subprocess) they are its ``ao`` ops, stream parts stubbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import remat
from remat.lower import torch_offload as tc
from remat.solvers import info, names


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def _step(solver: str, compiler: str):
    """Gradients' largest difference from eager autograd, and the plans reported."""
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    ref = _mlp()
    ref(x).square().mean().backward()
    model, plans = _mlp(), []
    step = remat.compile(model, solver=solver, compiler=compiler, cache=False,
                         on_plan=lambda g, p: plans.append(p))
    step(x).square().mean().backward()
    err = max(float((a.grad - b.grad).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    return err, plans


def test_registered_as_pytorch_partitioner():
    assert "torch-offload" in names(family="pytorch")
    assert not info("torch-offload").runs_on_graphs


def test_marks_only_computed_tensors():
    def f(x, w):
        return (x @ w).relu().sum()

    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
    marked = tc.mark_all_offload(gm)
    assert marked == sum(n.op == "call_function" for n in gm.graph.nodes)
    assert all(not n.meta.get("should_offload") for n in gm.graph.nodes if n.op == "placeholder")


def test_offloads_with_gradients_of_eager():
    err, plans = _step("torch-offload", "eager")
    assert err < 1e-6
    assert plans and plans[0].transfers > 0
    # what it saves is the min cut's, under the values' own names (not cpu_offload_*)
    _, base = _step("torch-mincut", "eager")
    assert sorted(plans[0].saved_names) == sorted(base[0].saved_names)
    assert base[0].transfers == 0


def test_synchronous_copies_without_stand_in():
    """On a CPU without the ``ao`` stand-ins PyTorch's synchronous path is used."""
    gm = torch.fx.GraphModule({}, torch.fx.Graph())
    node = gm.graph.placeholder("x")
    node.meta["val"] = torch.empty(2)
    from remat.lower import offload as lowering
    if not getattr(lowering, "ASYNC_ON_CPU", False):
        assert tc.offload_separate_stream(gm) is False


_AO_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    import torch
    from torch import nn
    from remat.bench import ao_standin
    ao_standin.install()
    from torch._functorch._activation_offloading import offload_ops
    import remat
    if sys.argv[2] != "pytorch":
        import functools
        from remat.lower import torch_offload as tc
        from remat.lower import partitioner
        partitioner.TORCH_PARTITIONERS["torch-offload"] = functools.partial(tc.torch_offload, waits=sys.argv[2])
    from remat.lower import torch_offload as joint
    keepalives, count = [], joint.offload_transfers
    def spy(fw):  # the forward as it will run
        keepalives.extend(len(n.args) > 1 or "keepalive" in n.kwargs for n in fw.graph.nodes
                          if n.target is torch.ops.ao.wait_tensor.default)
        return count(fw)
    joint.offload_transfers = spy
    copies, register = [0], offload_ops._register_wait
    def counted(*a):
        copies[0] += 1
        return register(*a)
    offload_ops._register_wait = counted
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    ref = mlp()
    ref(x).square().mean().backward()
    model, plans = mlp(), []
    step = remat.compile(model, solver="torch-offload", compiler=sys.argv[1], cache=False,
                         on_plan=lambda g, p: plans.append(p))
    for _ in range(2):
        model.zero_grad()
        step(x).square().mean().backward()
    err = max(float((a.grad - b.grad).abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
    print(json.dumps({"err": err, "transfers": [p.transfers for p in plans],
                      "registered": copies[0], "pending": ao_standin.pending(), "keepalives": keepalives}))
""")


@pytest.mark.parametrize("waits", ["pytorch", "last-use"])
def test_ao_ops_with_stand_ins(waits):
    """With the stand-ins the ``ao`` ops run (two steps: every copy waited for once). As PyTorch
    writes them, the offloads' waits free the device tensor (``keepalive``); ``last-use``
    passes it as ``last_use_of_storage`` (what inductor needs: see ``torch_offload``)."""
    r = subprocess.run([sys.executable, "-c", _AO_SCRIPT, "eager", waits], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["err"] < 1e-6
    n = out["transfers"][0]
    assert n > 0
    assert out["registered"] == 2 * 2 * n  # offload + reload, two steps
    assert out["pending"] == 0
    assert out["keepalives"].count(True) == (n if waits == "pytorch" else 0)


@pytest.mark.inductor
def test_inductor_offloads_with_gradients_of_eager():
    err, plans = _step("torch-offload", "inductor")
    assert err < 1e-6
    assert plans[0].transfers > 0
