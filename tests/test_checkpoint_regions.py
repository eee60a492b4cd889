"""A user's ``torch.utils.checkpoint`` region is honoured, and never makes remat fall back.

The values inside a region are flagged ``must_recompute`` (recomputed even where remat alone
would save them: the attention and the matmuls), except random ops, which are computed once
and saved, and what cannot be recomputed without them (remat.capture.to_graph
``_recompute_region``). Every plan runs with ``strict=True`` (a fallback would raise) and
with fallback warnings turned into errors; gradients match eager ``torch.utils.checkpoint``.

Dropout is compared bit for bit with eager under ``fallback_random`` (inductor then keeps
PyTorch's own random ops, which draw the same numbers as eager). Without it, inductor's
joint passes turn dropout into seeded ``inductor_random`` ops, which draw other numbers than
eager; there the reference is the same model without the region, whose forward draws the
same numbers and whose backward can only use the forward's.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import remat
from remat.eager.blocks import enable_transformers_checkpointing
from remat.errors import InfeasibleBudgetError, RematFallbackWarning

pytest.importorskip("torch._inductor")


class Block(nn.Module):
    """Pre-norm attention (F.scaled_dot_product_attention, dropout in training) inside a
    checkpoint region, then an MLP outside it."""

    def __init__(self, d=32, heads=4, dropout=0.0, region=True):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)
        self.ff = nn.Linear(d, d)
        self.heads, self.dropout, self.region = heads, dropout, region

    def attn(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        a = checkpoint(self.attn, x, use_reentrant=False) if self.region else self.attn(x)
        x = x + a
        return x + self.ff(x).relu()


def _step(model, fn, x):
    model.zero_grad()
    x = x.detach().requires_grad_()
    torch.manual_seed(5)  # the same random numbers for every run
    out = fn(x)
    out.square().mean().backward()
    return [out.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


def _compiled(model, **kw):
    plans = []
    fn = remat.compile(model, compiler="eager", strict=True, on_plan=lambda g, p: plans.append((g, p)), **kw)
    return fn, plans


def _run(model, x, **kw):
    torch._dynamo.reset()
    fn, plans = _compiled(model, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematFallbackWarning)
        got = _step(model, fn, x)
    assert len(plans) == 1
    return got, plans[0]


def _assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _random_computed_once(graph, plan):
    counts = plan.schedule().compute_counts()
    for n in graph.nodes:
        if n.category == "random":
            assert counts.get(n.name, 0) <= 1, f"random {n.name} computed {counts[n.name]} times"


def _region(graph):
    return {n.name for n in graph.nodes if n.role == "forward" and "checkpoint" in n.meta}


SOLVERS = ("auto", "mincut-conservative", "mincut-aggressive")


@pytest.mark.parametrize("solver", SOLVERS)
def test_checkpointed_attention_plans_and_recomputes_the_region(solver):
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 8, 32)
    got, (graph, plan) = _run(model, x, solver=solver)
    _assert_same(got, _step(model, model, x))
    region = _region(graph)
    attention = [n for n in graph.nodes if "scaled_dot_product" in n.op and n.role == "forward"]
    assert attention and attention[0].category == "compute"  # dropout_p=0 draws nothing
    assert attention[0].name in region and attention[0].must_recompute
    # everything the user asked to recompute is recomputed: nothing from the region is saved
    assert region and all(graph[name].must_recompute for name in region)
    assert not set(plan.saved_names) & region
    assert attention[0].name in plan.recomputed


@pytest.mark.parametrize("solver", SOLVERS)
def test_dropout_in_region_matches_eager_checkpoint(solver):
    torch.manual_seed(0)
    model = Block(dropout=0.25)
    x = torch.randn(2, 8, 32)
    with torch._inductor.config.patch(fallback_random=True):
        want = _step(model, model, x)
        got, (graph, plan) = _run(model, x, solver=solver)
    _assert_same(got, want)  # the same dropout masks as eager: drawn once, not again
    _random_computed_once(graph, plan)
    random = {n.name for n in graph.nodes if n.category == "random"}
    assert random & _region(graph)
    # only the random values (and items of random ops) cross from the region
    for name in set(plan.saved_names) & _region(graph):
        node = graph[name]
        assert node.category == "random" or set(node.inputs) & random, name
        assert not node.must_recompute


@pytest.mark.parametrize("solver", SOLVERS + ("torch-mincut",))
def test_seeded_dropout_in_region_never_redrawn(solver):
    """inductor's seeded random ops (the default): the plan's gradients are those of the
    masks the forward drew (the model without the region draws the same ones)."""
    torch.manual_seed(0)
    model = Block(dropout=0.25)
    plain = Block(dropout=0.25, region=False)
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 8, 32)
    want, _ = _run(plain, x, solver="no-recompute")
    got, (graph, plan) = _run(model, x, solver=solver)
    _assert_same(got, want)
    ops = {n.op.split(".")[0] for n in graph.nodes if n.category == "random"}
    assert {"inductor_seeds", "inductor_random"} <= ops
    if solver != "torch-mincut":
        _random_computed_once(graph, plan)
        # the boolean mask is kept, not the float random numbers
        saved_random = [s for s in plan.saved_names if graph[s].op.startswith("inductor_random")]
        assert not saved_random


class DropoutMLP(nn.Module):
    """Two linears with dropout between them, in a checkpoint region: a graph small enough for
    Checkmate's MILP to prove its optimum (the attention block's 162 nodes took it 60 s to its
    time limit, and 76 s for 20 branch-and-bound nodes)."""

    def __init__(self, d=32):
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def inner(self, x):
        return self.down(F.dropout(F.gelu(self.up(x)), 0.25, training=self.training))

    def forward(self, x):
        return x + checkpoint(self.inner, x, use_reentrant=False)


@pytest.mark.parametrize("solver, make", [("checkmate", DropoutMLP), ("chen-greedy", lambda: Block(dropout=0.25))])
def test_budgeted_solvers_keep_random_values(solver, make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 8, 32)
    with torch._inductor.config.patch(fallback_random=True):
        want = _step(model, model, x)
        try:
            got, (graph, plan) = _run(model, x, solver=solver, budget=0.95, time_limit=None)
        except InfeasibleBudgetError as e:  # budget semantics may move; a fallback may not
            pytest.skip(f"budget 0.95 infeasible here: {e}")
    _assert_same(got, want)
    assert any(n.category == "random" for n in graph.nodes)
    _random_computed_once(graph, plan)
    if solver == "checkmate":
        assert plan.solver == "checkmate" and plan.status == "optimal"  # proved, not stopped by the clock


def test_random_container_items_can_be_saved():
    """native_dropout's (output, mask) tuple can be neither saved nor recomputed: its items,
    which the region tags for recomputation, are saved instead of failing the plan."""
    from remat.capture import joint as tc
    from remat.capture.to_graph import graph_from_joint

    def f(x, w):
        return checkpoint(lambda a: torch.nn.functional.dropout(a @ w, 0.5, training=True).sin(), x,
                          use_reentrant=False)

    captured = []

    class Capture(remat.lower.partitioner.RematPartitioner):
        def __call__(self, gm, joint_inputs, **kwargs):
            joint = tc.prepare_joint(tc.copy_joint(gm), kwargs["num_fwd_outputs"])
            captured.append(graph_from_joint(joint))
            return super().__call__(gm, joint_inputs, **kwargs)

    from remat.lower.backend import _eager_compile
    from remat.lower.options import Options

    def backend(gm, inputs):
        return _eager_compile(gm, inputs, Capture(Options.create(strict=True)))

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(1)
        y = torch.compile(f, backend=backend)(x, w)
        y.sum().backward()
    g = captured[0]
    drop = next(n for n in g.nodes if n.op.startswith("native_dropout"))
    assert drop.category == "random" and not drop.must_recompute and not drop.can_save
    items = [n for n in g.nodes if n.inputs == (drop.name,)]
    assert items and all(not n.must_recompute and n.meta.get("checkpoint") for n in items)
    sin = next(n for n in g.nodes if n.op.startswith("sin") and n.role == "forward")
    assert sin.must_recompute  # reads a saved item: still recomputed, as asked


def test_gpt2_gradient_checkpointing_with_dropout():
    pytest.importorskip("transformers")
    from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny

    torch.manual_seed(0)
    lm = gpt2_tiny(dropout=0.1)
    enable_transformers_checkpointing(lm, use_reentrant=False)
    lm.train()
    model = GPT2Loss(lm)
    ids = torch.randint(0, 256, (2, 16))

    def step(fn):
        model.zero_grad()
        torch.manual_seed(5)
        fn(ids).backward()
        return [p.grad.clone() for p in model.parameters()]

    with torch._inductor.config.patch(fallback_random=True):
        want = step(model)
        fn, plans = _compiled(model, solver="auto")
        with warnings.catch_warnings():
            warnings.simplefilter("error", RematFallbackWarning)
            got = step(fn)
    _assert_same(got, want)
    assert plans and any(_region(g) for g, _ in plans)
    for g, p in plans:
        _random_computed_once(g, p)
