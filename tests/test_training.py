"""Training steps through remat: gradients equal eager autograd, saved bytes <= PyTorch's
partitioner, random ops never recomputed. Most use the no-codegen compiler; the
``inductor`` ones compile real kernels."""

import copy

import pytest
import torch

import remat
from remat.zoo.cnn import ConvBN
from remat.zoo.mlp import MLP
from remat.zoo.patterns import TransformerBlock, f1, f2
from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny


def _cases():
    torch.manual_seed(0)
    return {
        "mlp": (MLP(), (torch.randn(16, 32),)),
        "cnn-batchnorm": (ConvBN(), (torch.randn(4, 3, 16, 16),)),
        "transformer": (TransformerBlock(), (torch.randn(2, 8, 32),)),
        "gpt2": (GPT2Loss(gpt2_tiny()), (torch.randint(0, 256, (2, 16)),)),
    }


def _loss(out):
    return out if out.dim() == 0 else out.float().pow(2).sum()


def _grads_after_step(model, inputs):
    model.zero_grad(set_to_none=True)
    _loss(model(*inputs)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


CASES = list(_cases())
TRAFFIC_OVER_BYTES = {("gpt2", "conservative")}


@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
@pytest.mark.parametrize("name", CASES)
def test_gradients_equal_eager_and_saved_bytes_at_most_torch(name, mode):
    model, inputs = _cases()[name]
    expected = _grads_after_step(copy.deepcopy(model), inputs)
    plans = []
    test_model = copy.deepcopy(model)
    compiled = remat.compile(test_model, solver=f"mincut-{mode}", compiler="eager", strict=True,
                             on_plan=lambda g, p: plans.append(p))
    _loss(compiled(*inputs)).backward()
    got = {n: p.grad for n, p in test_model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-4, atol=1e-5, msg=k)
    assert len(plans) == 1, "expected one graph (no graph breaks)"
    ours = plans[0]
    torch_plan = remat.plan(copy.deepcopy(model), *inputs, solver="torch-mincut")
    # the seeds' cost model: remat's cut is optimal, so never worse than torch's choice
    assert ours.cost <= torch_plan.cost
    if (name, mode) in TRAFFIC_OVER_BYTES:
        # GPT-2 conservative: at each LayerNorm remat saves the (already materialized) input and
        # its two 128-byte statistics instead of the fusible normalized output (2w in the
        # seeds' model): 4% less traffic for ~1.5% more bytes. Bounded, not hidden.
        assert ours.cost < torch_plan.cost
        assert ours.saved_activation_bytes <= 1.02 * torch_plan.saved_activation_bytes
    else:
        assert ours.saved_activation_bytes <= torch_plan.saved_activation_bytes


def test_batchnorm_running_stats_update_like_eager():
    model, inputs = _cases()["cnn-batchnorm"]
    ref = copy.deepcopy(model)
    ref(*inputs)
    test_model = copy.deepcopy(model)
    remat.compile(test_model, compiler="eager")(*inputs)
    torch.testing.assert_close(test_model.stem[1].running_mean, ref.stem[1].running_mean)


def test_dropout_backward_uses_forward_mask():
    """f2 (seeds/000): d(x*mask)/dx = mask, so the gradient must equal the forward's mask."""
    torch.manual_seed(0)
    x = torch.randn(4096, requires_grad=True)
    out = remat.compile(f2, compiler="eager", strict=True)(x)
    out.sum().backward()
    mask = (out != 0).float()
    assert 0.3 < mask.mean().item() < 0.7
    assert torch.equal(x.grad, mask)


@pytest.mark.parametrize("name", ["mlp", "transformer", "gpt2"])
def test_models_with_dropout_train(name):
    torch.manual_seed(0)
    if name == "mlp":
        model, inputs = MLP(dropout=0.3), (torch.randn(16, 32),)
    elif name == "transformer":
        model, inputs = TransformerBlock(dropout=0.2), (torch.randn(2, 8, 32),)
    else:
        model, inputs = GPT2Loss(gpt2_tiny(dropout=0.1)), (torch.randint(0, 256, (2, 16)),)
    plans = []
    compiled = remat.compile(model, compiler="eager", strict=True, on_plan=lambda g, p: plans.append(p))
    _loss(compiled(*inputs)).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    graph = plans[0].graph
    random_nodes = {n.name for n in graph if n.category == "random"}
    assert random_nodes, "dropout should appear as random ops in the joint graph"
    assert not random_nodes & set(plans[0].recomputed)


def test_backend_string_registered():
    torch.manual_seed(0)
    xs = [torch.randn(256, requires_grad=True) for _ in range(4)]
    plans = []
    f = torch.compile(f1, backend="remat",
                      options={"compiler": "eager", "on_plan": lambda g, p: plans.append(p)})
    f(*xs).sum().backward()
    refs = torch.autograd.grad(f1(*xs).sum(), xs)
    for x, ref in zip(xs, refs):
        torch.testing.assert_close(x.grad, ref)
    # no budget under the eager compiler: the frontier's plan, which also saves cos (the min cut
    # recomputes it as if fused; without fusion its recomputation is a kernel of its own)
    assert [s.name for s in plans[0].saved_activations] == ["add_2", "cos"]
    assert plans[0].solver == "frontier" and "budget" not in plans[0].options


def test_partitioner_uuid_reflects_solver_and_budget():
    from remat.lower.options import Options
    from remat.lower.partitioner import RematPartitioner

    ids = {RematPartitioner(Options.create(solver=s, budget=b)).uuid()
           for s in ("mincut-conservative", "mincut-aggressive", "auto") for b in (None, 0.5)}
    assert len(ids) == 6
    same = Options.create(solver="auto", on_plan=print)
    assert RematPartitioner(same).uuid() == RematPartitioner(Options.create(solver="auto")).uuid()


@pytest.mark.inductor
def test_inductor_mask_and_mlp_gradients():
    """Real inductor kernels: f2's gradient is the forward's mask; MLP gradients match eager."""
    torch.manual_seed(0)
    x = torch.randn(4096, requires_grad=True)
    out = remat.compile(f2, strict=True)(x)
    out.sum().backward()
    assert torch.equal(x.grad, (out != 0).float())

    model, inputs = _cases()["mlp"]
    expected = _grads_after_step(copy.deepcopy(model), inputs)
    test_model = copy.deepcopy(model)
    _loss(remat.compile(test_model, strict=True)(*inputs)).backward()
    for n, p in test_model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_plan_with_the_compiled_sizes_and_train_correctly():
    torch.manual_seed(0)
    model = MLP()
    plans = []
    compiled = remat.compile(copy.deepcopy(model), compiler="eager", strict=True, dynamic=True,
                             on_plan=lambda g, p: plans.append(p))
    for batch in (16, 24, 40):
        x = torch.randn(batch, 32)
        ref = copy.deepcopy(model)
        _loss(ref(x)).backward()
        out = compiled(x)
        torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-6)
    assert plans, "no graph was planned"
    assert all(p.saved_activation_bytes > 0 for p in plans)
