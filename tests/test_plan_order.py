"""Inductor keeps a budgeted plan's order (remat.lower.plan_order): fusion may not move work
across the plan's peak, so a plan measures within its prediction under real inductor kernels."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import remat
from remat.bench.measure import peak_memory
from remat.lower import plan_order
from remat.lower.plan_order import PlanOrderChoices, in_plan_order
from remat.plans.budget import activation_bytes, resident_bytes


class _Node:
    def __init__(self, lo: int, hi: int | None = None) -> None:
        self.min_order, self.max_order = lo, lo if hi is None else hi


class _Base:
    def __init__(self) -> None:
        self.asked = 0

    def can_fuse(self, scheduler, node1, node2, shared_data_score) -> bool:
        self.asked += 1
        return True

    def other_heuristic(self) -> str:
        return "base's"


def test_near_kernels_fuse_as_inductor_decides_and_far_ones_never():
    base = _Base()
    handler = PlanOrderChoices(base, near=3)
    scheduler = object()
    assert handler.can_fuse(scheduler, _Node(4), _Node(7), 1) and base.asked == 1
    assert handler.can_fuse(scheduler, _Node(7, 8), _Node(5, 6), 1) and base.asked == 2  # parts 5..8
    assert not handler.can_fuse(scheduler, _Node(4), _Node(8), 1)
    assert not handler.can_fuse(scheduler, _Node(20, 30), _Node(2), 1)  # a group spanning far
    assert not handler.can_fuse(scheduler, _Node(5, 6), _Node(6, 9), 1)  # parts 5 and 9: 4 apart
    assert base.asked == 2 and handler.vetoed == 3
    assert handler.other_heuristic() == "base's"  # everything else is the installed handler's


def test_the_handler_and_config_are_installed_while_compiling_and_removed_after():
    from torch._inductor import config as inductor_config
    from torch._inductor.virtualized import V

    def user_pass(graph):  # a post-grad pass the user configured runs first
        user_pass.ran = True

    before = V.choices
    with inductor_config.patch(post_grad_custom_post_pass=user_pass):
        with in_plan_order() as handler:
            assert V.choices is handler and handler.base is before and handler.near == plan_order.NEAR
            assert inductor_config.allow_buffer_reuse is False
            assert inductor_config.reorder_for_peak_memory is False
            split = inductor_config.post_grad_custom_post_pass
            assert isinstance(split, plan_order.PlanOrderPass) and split.chained is user_pass
            split(torch.fx.Graph())
            assert user_pass.ran
        assert V.choices is before and inductor_config.post_grad_custom_post_pass is user_pass
    assert inductor_config.allow_buffer_reuse is True


class _RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = _RMSNorm(d), nn.Linear(d, h, bias=False), nn.Linear(h, d, bias=False)

    def forward(self, x):
        return x + self.down(nn.functional.silu(self.up(self.norm(x))))


class _Stack(nn.Module):
    """Llama's MLP half, 4 blocks: a budget recomputes the RMS norms, and inductor, left alone,
    fuses a block's recomputed norm with the next block's norm backward (both read the residual
    stream): measured 1.42x the plan's prediction (1,119,496 bytes against 788,228); kept to the
    plan's order, 790,024."""

    def __init__(self, d: int = 64, h: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[_Block(d, h) for _ in range(layers)])
        self.norm = _RMSNorm(d)

    def forward(self, x):
        return self.norm(self.blocks(x)).pow(2).mean()


@pytest.mark.inductor
@pytest.mark.slow
def test_a_budgeted_plan_measures_within_its_prediction_under_inductor(monkeypatch):
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    torch.manual_seed(0)
    net, x = _Stack(), torch.randn(256, 64)
    reference = _Stack()
    reference.load_state_dict(net.state_dict())
    plans = []
    step_fn = remat.compile(net, budget=0.5, cache=False, on_plan=lambda g, p: plans.append(p))

    def step():
        for p in net.parameters():
            if p.grad is not None:
                p.grad.zero_()
        step_fn(x).backward()

    measured = peak_memory(step, "cpu", warmup=2, timeline=False).peak_bytes
    (plan,) = plans
    assert plan.schedule(plan.graph).recomputed, "the budget should make the plan recompute"
    predicted = plan.peak_bytes - resident_bytes(plan.graph)
    assert measured <= 1.02 * predicted, (measured, predicted)
    reference(x).backward()
    for p, r in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)


def _late_bias(a, b, c, hops: int):
    x = c
    for _ in range(hops):
        x = x.sin()
    return torch.addmm(x, a, b)


@pytest.mark.parametrize("hops, split", [(40, 1), (3, 0)])
def test_an_addmm_whose_bias_comes_late_is_split_back_where_its_matrices_are(hops, split):
    """inductor's post-grad ``add(x, mm(a, b)) -> addmm`` moves the product to the sum, keeping
    its inputs alive (T5's tied embeddings: a plan for 0.6 measured 0.80)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from remat.lower.plan_order import split_late_addmm

    a, b, c = torch.randn(8, 4), torch.randn(4, 6), torch.randn(8, 6)
    gm = make_fx(lambda a, b, c: _late_bias(a, b, c, hops), tracing_mode="fake")(a, b, c)
    assert split_late_addmm(gm.graph, late=16) == split
    gm.recompile()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    targets = [n.target for n in nodes]
    if split:
        assert torch.ops.aten.addmm.default not in targets
        assert nodes[0].target is torch.ops.aten.mm.default  # right after the inputs
        assert nodes[-1].target is torch.ops.aten.add.Tensor and nodes[-1].args[1] is nodes[0]
    else:
        assert targets[-1] is torch.ops.aten.addmm.default
    torch.testing.assert_close(gm(a, b, c), _late_bias(a, b, c, hops))


class _T5Loss(nn.Module):
    def __init__(self, t5: nn.Module) -> None:
        super().__init__()
        self.t5 = t5

    def forward(self, ids, labels):
        return self.t5(input_ids=ids, labels=labels).loss


@pytest.mark.inductor
@pytest.mark.slow
def test_t5_keeps_its_budget_under_inductor(monkeypatch):
    """T5 (tied embeddings, an encoder and a decoder, ``benchmarks/budgets_vs_torch.py``'s quick
    size) at 0.6: its plan measured 1.17x its prediction while inductor fused recomputed
    embeddings of several layers into one kernel and held dead feed-forward buffers for reuse
    across the attention backward; kept to the plan's order it measures within it."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=1024, d_model=128, d_kv=32, d_ff=512, num_layers=1,
                                   num_decoder_layers=1, num_heads=4, dropout_rate=0.0,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = _T5Loss(transformers.T5ForConditionalGeneration(config)).train()
    ids, labels = torch.randint(2, 1024, (4, 64)), torch.randint(2, 1024, (4, 64))
    plans = []
    step_fn = remat.compile(model, budget=0.6, cache=False, on_plan=lambda g, p: plans.append(p))

    def step():
        model.zero_grad(set_to_none=False)
        step_fn(ids, labels).backward()

    measured = peak_memory(step, "cpu", warmup=2, timeline=False).peak_bytes
    (plan,) = plans
    predicted = plan.peak_bytes - resident_bytes(plan.graph)
    assert measured <= 1.02 * predicted, (measured, predicted)


def _far_reader(x, hops: int):
    s = x.cos() + 1.0
    y = x
    for _ in range(hops):
        y = y.sin()
    return torch.mm(s, y)


@pytest.mark.parametrize("hops, marked", [(30, True), (3, False)])
def test_a_pointwise_value_read_far_away_is_written_where_it_is(hops, marked):
    """inductor would compute ``s`` inside its far reader, keeping ``x`` alive until then; the
    plan's pass has inductor write it where it is, as the simulator counts it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from remat.lower.plan_order import realize_far

    x = torch.randn(8, 8)
    gm = make_fx(lambda x: _far_reader(x, hops), tracing_mode="fake")(x)
    realize_far(gm.graph, far=16)
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)
    assert bool(add.meta.get("inductor_realize_to_strides")) is marked
    cos = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.cos.default)
    assert not cos.meta.get("inductor_realize_to_strides")  # its reader is next to it


class _LMLoss(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


@pytest.mark.inductor
@pytest.mark.slow
def test_gpt2_at_six_tenths_plans_and_keeps_its_budget_under_inductor(monkeypatch):
    """GPT-2 (``benchmarks/budgets_vs_torch.py``'s quick size) at 0.6 of its activation memory:
    refused while every recomputation was counted written (least memory predicted 0.62, measured
    0.49), although PyTorch's knob reached 0.59; planned now, and kept."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0)
    lm = transformers.GPT2LMHeadModel(config)
    lm.loss_type = "ForCausalLM"
    model = _LMLoss(lm).train()
    ids = torch.randint(0, 1024, (4, 64))
    plans = []
    step_fn = remat.compile(model, budget=0.6, cache=False, on_plan=lambda g, p: plans.append(p))
    measured, predicted, activation = _measured_and_predicted(model, step_fn, (ids,), plans)
    assert predicted <= 0.6 * activation
    assert measured <= 1.02 * predicted, (measured, predicted)


def _measured_and_predicted(model, step_fn, inputs: tuple, plans: list) -> tuple[int, int, int]:
    """(measured peak above the step's start, the one plan's prediction of it, the activation
    memory) of a training step of ``step_fn``."""
    def step():
        model.zero_grad(set_to_none=False)
        step_fn(*inputs).backward()

    measured = peak_memory(step, "cpu", warmup=2, timeline=False).peak_bytes
    (plan,) = plans
    return measured, plan.peak_bytes - resident_bytes(plan.graph), activation_bytes(plan.graph)


@pytest.mark.inductor
@pytest.mark.slow
def test_a_cnn_under_inductor_plans_at_the_knob_s_fraction_and_keeps_it(monkeypatch):
    """The ConvBN CNN (``budgets_vs_torch.py``'s quick size): PyTorch's knob reaches 0.91 of the
    activation memory. Its least-memory plan was predicted at 0.92 and refused 0.9 while
    convolution scratch was measured on contiguous operands (inductor runs them channels-last)
    and a residual gradient inductor writes was counted in registers; now it plans, and the
    prediction holds."""
    from remat.zoo.cnn import ConvBN

    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    torch.manual_seed(0)
    model = ConvBN(channels=16, blocks=2)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    plans = []
    step_fn = remat.compile(lambda x: nn.functional.cross_entropy(model(x), y), budget=0.9, cache=False,
                            on_plan=lambda g, p: plans.append(p))
    measured, predicted, activation = _measured_and_predicted(model, step_fn, (x,), plans)
    assert predicted <= 0.9 * activation
    assert predicted * 0.98 <= measured <= 1.02 * predicted, (measured, predicted)


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.parametrize("budget", ["min", 0.8])
def test_a_depthwise_cnn_s_plans_under_inductor_measure_what_they_predict(monkeypatch, budget):
    """A MobileNetV2-like block (1x1, depthwise 3x3, 1x1 convolutions with BatchNorm and ReLU6).
    Inductor decides its layout per graph: a backward that recomputes no convolution ran its
    convolutions' backward on whatever layouts its kernels left, and oneDNN reordered them
    (12.6 MB of scratch for a 4 MB depthwise input, measured 4.6 KB channels-last). remat now
    compiles the backward channels-last with the forward, as capture measured it; with the
    items of a convolution's backward counted as the buffers they are, least-memory and 0.6
    plans measured 14-30% above their predictions before."""
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")

    class Block(nn.Module):
        def __init__(self, c: int = 8, h: int = 32) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
            self.f = nn.Sequential(
                nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
                nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
            self.head = nn.Linear(c, 10)

        def forward(self, x, y):
            x = self.stem(x)
            x = x + self.f(x)
            return nn.functional.cross_entropy(self.head(x.mean((2, 3))), y)

    torch.manual_seed(0)
    model = Block()
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    plans = []
    step_fn = remat.compile(model, budget=budget, cache=False, on_plan=lambda g, p: plans.append(p))
    measured, predicted, activation = _measured_and_predicted(model, step_fn, (x, y), plans)
    assert predicted < activation
    assert predicted * 0.98 <= measured <= 1.02 * predicted, (measured, predicted)


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1])  # two threads: benchmarks/predictions.py --threads 2, and the VGG test above
def test_resnet18_s_least_memory_plan_goes_below_the_knob_s_and_measures_what_it_predicts(monkeypatch, threads):
    """ResNet-18 tiny (``budgets_vs_torch.py`` quick): PyTorch's knob at 0.2 measures 0.68 of the
    activation memory; remat's frontier stopped at 0.77. The peak descent recomputes the stem
    convolution among others (0.66 on one thread), and such plans measure what they predict:
    before the backward compiled channels-last, recomputing the stem measured 8-15% above its
    prediction. On two threads inductor calls ATen's scatter-add for the max-pool backward,
    copying its index and source out of their channels-last storages into buffers of their
    own and allocating its output with the kernel before it: the least-memory plan measured
    13.8% above its prediction until the simulator knew (:mod:`remat.capture.layouts`).
    Fractions are of plain torch.compile's activation memory since issue 30 (0.88 of the
    no-recompute partition's on this model): the knob's 0.68 is 0.77 of it, 0.75 is 0.85."""
    # each thread count in a process of its own: the second of two in one process measured
    # 0.99 (or 22% below its prediction) on this machine, with the code before issue 11 too
    import subprocess
    import sys
    from pathlib import Path
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch; "
            f"torch.set_num_threads({threads}); import test_plan_order as t; "
            f"t._resnet18_least_memory(below={0.77 if threads == 1 else 0.85})")
    env = {**os.environ, "REMAT_CACHE_DIR": "off"}  # compiled graphs uncached (conftest), kernels cached
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def _resnet18_least_memory(below: float) -> None:
    from remat.zoo.cnn import BasicBlock, ResNet

    torch.manual_seed(0)
    model = ResNet(BasicBlock, (1, 1, 1, 1), 8, 10)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    plans = []
    step_fn = remat.compile(lambda x: nn.functional.cross_entropy(model(x), y), budget="min", cache=False,
                            on_plan=lambda g, p: plans.append(p))
    measured, predicted, activation = _measured_and_predicted(model, step_fn, (x,), plans)
    stem = next(n.name for n in plans[0].graph.nodes if n.op.startswith("convolution.")
                and plans[0].graph[n.inputs[0]].role == "input")
    assert stem not in plans[0].saved_names
    assert measured < below * activation
    assert predicted * 0.98 <= measured <= 1.02 * predicted, (measured, predicted)


@pytest.mark.inductor
@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, "min"])
def test_a_vgg_s_plans_on_two_threads_measure_what_they_predict(monkeypatch, budget):
    """On two threads each max-pool backward is ATen's scatter. Without a budget, inductor's
    reordering for its own peak estimate computed each pool's int64 indices a layer early
    (measured 6.3% above the prediction); at ``min``, the ReLU gradient that reads the scatter's
    output last was counted in its storage, which inductor never reuses (39% above)."""
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    torch.manual_seed(0)
    from remat.zoo.cnn import PooledConvBN

    net = PooledConvBN(widths=(16, 32, 64, 64), classes=10, side=32).train()
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    plans = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        step_fn = remat.compile(lambda x: nn.functional.cross_entropy(net(x), y), cache=False,
                                on_plan=lambda g, p: plans.append(p), **({} if budget is None else {"budget": budget}))
        measured, predicted, _ = _measured_and_predicted(net, step_fn, (x,), plans)
    finally:
        torch.set_num_threads(before)
    assert predicted * 0.98 <= measured <= 1.02 * predicted, (measured, predicted)
