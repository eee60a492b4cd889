"""remat.checkpoint / remat.policy on plain PyTorch models, eager (no torch.compile)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import remat
import remat.eager.policy as _policy
from remat.bench.measure import peak_memory
from remat.cost.model import DeviceProfile
from remat.eager import plan as eplan

PROFILE = DeviceProfile("test-cpu", 50e9, 8e9, 2e-6)  # fixed: no calibration in tests
_policy._profiles["sac"] = 10e-6  # SAC's per-op overhead, fixed too (measured otherwise)


class Block(nn.Module):
    def __init__(self, d: int, p: float = 0.1) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(self.drop(F.gelu(self.fc1(self.ln(x))))))


class Branchy(Block):
    """Data-dependent control flow: the op sequence depends on the values."""

    def forward(self, x):
        h = self.fc1(self.ln(x))
        if h.mean() > 0:
            h = F.gelu(h)
        else:
            h = torch.tanh(h)
        return x + self.fc2(h)


class Net(nn.Module):
    def __init__(self, d: int = 32, layers: int = 4, p: float = 0.1, block=Block) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList(block(d, p) for _ in range(layers))
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x).float().logsumexp(-1).mean()


def _x(seq: int = 64, d: int = 32):
    return torch.randn(4, seq, d, generator=torch.Generator().manual_seed(3))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _run(model, x, seed=7, autocast=False):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x)
    loss.backward()
    return loss.detach(), _grads(model)


def _pair(budget, **kw):
    torch.manual_seed(0)
    ref = Net(**{k: v for k, v in kw.items() if k in ("d", "layers", "p", "block")})
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget=budget, profile=PROFILE,
                     **{k: v for k, v in kw.items() if k in ("blocks", "strict")})
    return ref, model


@pytest.mark.parametrize("budget", [0.8, 0.5, "min"])
def test_gradients_equal_eager_with_dropout(budget):
    ref, model = _pair(budget)
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for step in range(2):  # the first step plans, the second runs the plan made with the measured outside
            l0, g0 = _run(ref, x, seed=step)
            l1, g1 = _run(model, x, seed=step)
            assert torch.equal(l0, l1)
            for a, b in zip(g0, g1):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    s = model.remat_summary()
    assert s.planned and any(r.plan in ("selective", "full") for r in s.rows)  # something is checkpointed


def test_dropout_masks_replayed_not_redrawn():
    """With dropout, a plan that recomputed the masks with fresh randomness would differ from eager."""
    ref, model = _pair("min", p=0.5)
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        _run(model, x)
        l1, g1 = _run(model, x, seed=11)
    l0, g0 = _run(ref, x, seed=11)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # and the masks do depend on the seed: another seed gives other gradients
    _, g2 = _run(ref, x, seed=12)
    assert not all(torch.allclose(a, b) for a, b in zip(g0, g2))


def test_autocast_bf16_gradients_close():
    ref, model = _pair(0.5)
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for step in range(2):
            l0, g0 = _run(ref, x, seed=step, autocast=True)
            l1, g1 = _run(model, x, seed=step, autocast=True)
            torch.testing.assert_close(l0, l1, rtol=1e-2, atol=1e-2)
            for a, b in zip(g0, g1):
                torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    keys = list(model._remat_planner.plans)
    assert any(k[3] == (("cpu", "torch.bfloat16"),) for k in keys)  # planned under the autocast state


def _peak(model, x):
    def step():
        torch.manual_seed(0)
        model(x).backward()
    return peak_memory(step, warmup=1, timeline=False).peak_bytes


@pytest.mark.parametrize("budget", [0.6, "min", "bytes"])
def test_measured_peak_within_budget(budget):
    torch.manual_seed(0)
    ref = Net(d=64, layers=4, p=0.0)
    x = torch.randn(4, 96, 64)
    eager = _peak(ref, x)
    model = copy.deepcopy(ref)
    asked = budget
    if budget == "bytes":  # bytes bound the whole step: parameters and gradients, and the peak above them
        resident = 2 * sum(p.numel() * p.element_size() for p in ref.parameters())
        asked, budget = resident + int(0.6 * eager), 0.6
    remat.checkpoint(model, budget=asked, profile=PROFILE)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        peak = _peak(model, x)
    warned = any(issubclass(x.category, remat.RematBudgetWarning) for x in w)
    assert peak < 0.8 * eager
    if budget != "min":
        assert peak <= budget * eager * 1.03 or warned, (peak / eager, budget)
    s = model.remat_summary()
    # the prediction is close to the measurement (the same cost model picks the plan)
    assert abs(s.peak - peak) <= 0.1 * eager, (s.peak, peak, eager)
    assert abs(s.peak_eager - eager) <= 0.1 * eager, (s.peak_eager, eager)


def test_unreachable_budget_warns_or_raises():
    torch.manual_seed(0)
    x = _x()
    model = Net()
    remat.checkpoint(model, budget=1000, profile=PROFILE)  # 1000 bytes for the whole step
    with pytest.warns(remat.RematBudgetWarning, match="the least it reaches is"):
        _run(model, x)
    model = Net()
    remat.checkpoint(model, budget=1000, profile=PROFILE, strict=True)
    with pytest.raises(remat.InfeasibleBudgetError) as e:
        _run(model, x)
    assert e.value.smallest_feasible > 1000


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func] = self.n.get(func, 0) + 1
        return func(*args, **(kwargs or {}))


def _backward_addmm(model, x):
    torch.manual_seed(0)
    loss = model(x)
    with _Count() as c:
        loss.backward()
    return c.n.get(torch.ops.aten.addmm.default, 0)


def test_saved_ops_are_not_recomputed():
    """The backward re-runs exactly the addmm calls the plan does not save."""
    x = _x()
    for budget in ("min", 0.6, 1.0):
        _, model = _pair(budget, p=0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", remat.RematBudgetWarning)
            _run(model, x)
            _run(model, x)
            n = _backward_addmm(model, x)
        planner = model._remat_planner
        expected = 0
        for name, _ in planner.blocks:
            bp = planner.plans[planner.block_key[name]]
            point = planner.choice[name]
            if not point.unwrapped:
                expected += sum(1 for i, op in enumerate(bp.capture.ops[:eplan.replayed(bp.capture)])
                                if op.name == "aten.addmm.default" and i not in point.saved)
        assert n == expected, (budget, n, expected)
        if budget == "min":
            assert n > 0
        if budget == 1.0:
            assert n == 0


def test_blocks_saving_everything_are_unwrapped(monkeypatch):
    calls = []
    import remat.eager.checkpoint as ck

    real = ck._torch_checkpoint
    monkeypatch.setattr(ck, "_torch_checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    ref, model = _pair(1.0)
    x = _x()
    l0, g0 = _run(ref, x)
    l1, g1 = _run(model, x)
    _run(model, x)
    assert calls == []
    assert all(r.plan == "unwrapped" for r in model.remat_summary().rows)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the same model at min checkpoints every block
    _, model = _pair("min")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        _run(model, x)
    assert len(calls) == 4


def test_none_is_no_budget_and_full_checkpointing_s_peak_is_the_default():
    """budget=None means what it means everywhere in remat (no budget: the step as it runs
    without remat, every block unwrapped, nothing recomputed); the default, "full", keeps full
    checkpointing's predicted peak with the least recomputation."""
    torch.manual_seed(0)
    ref = Net(d=64, layers=4, p=0.0)
    x = torch.randn(4, 96, 64)
    none, default = copy.deepcopy(ref), copy.deepcopy(ref)
    remat.checkpoint(none, budget=None, profile=PROFILE)
    remat.checkpoint(default, profile=PROFILE)
    _run(none, x), _run(default, x)
    assert all(p.unwrapped for p in none._remat_planner.choice.values())
    assert "no budget" in str(none.remat_summary())
    s = default.remat_summary()
    assert "'full'" in str(s) and any(not p.unwrapped for p in default._remat_planner.choice.values())
    targets = default._remat_planner.targets
    assert targets["target"] <= targets["full"] < targets["eager"]
    assert s.peak <= targets["full"] * 1.01


def test_unsupported_block_left_unwrapped_with_warning():
    torch.manual_seed(0)
    ref = Net(block=Branchy, p=0.0)
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget="min", profile=PROFILE)
    x = _x()
    with pytest.warns(remat.RematFallbackWarning, match="data-dependent"):
        l1, g1 = _run(model, x)
    l0, g0 = _run(ref, x)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    s = model.remat_summary()
    assert all(r.plan.startswith("unsupported") for r in s.rows)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # training goes on
        opt.zero_grad()
        loss, _ = _run(model, x)
        opt.step()
        assert torch.isfinite(loss)


def test_new_shapes_plan_again_from_a_cache(monkeypatch):
    import remat.eager.policy as pol

    captured = []
    real = pol.capture_block
    monkeypatch.setattr(pol, "capture_block", lambda *a, **k: captured.append(1) or real(*a, **k))
    ref, model = _pair(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for seq in (64, 32, 64, 32):
            x = _x(seq)
            l0, g0 = _run(ref, x)
            l1, g1 = _run(model, x)
            for a, b in zip(g0, g1):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # one signature per shape, each captured once
    assert len(captured) == 2
    assert len(model._remat_planner.plans) == 2
    # what autograd saves outside the blocks is measured once per input shape too
    outs = model._remat_planner._outside_by_sig
    assert len(outs) == 2 and len({o.after for o in outs.values()}) == 2


def test_blocks_argument_forms():
    torch.manual_seed(0)
    from remat.eager.blocks import find_blocks

    m = Net()
    assert [n for n, _ in find_blocks(m)] == [f"blocks.{i}" for i in range(4)]
    assert [n for n, _ in find_blocks(m, Block)] == [f"blocks.{i}" for i in range(4)]
    assert [n for n, _ in find_blocks(m, ["blocks.1", "blocks.3"])] == ["blocks.1", "blocks.3"]
    assert [n for n, _ in find_blocks(m, lambda n, mod: n.endswith("fc1"))] == [f"blocks.{i}.fc1" for i in range(4)]
    with pytest.raises(remat.OptionError):
        find_blocks(m, ["nope"])
    ref, model = _pair("min", blocks=["blocks.1", "blocks.2"])
    x = _x()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        _, g1 = _run(model, x)
    _, g0 = _run(ref, x)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert {n for r in model.remat_summary().rows for n in r.blocks} == {"blocks.1", "blocks.2"}


def test_summary_lists_saved_and_recomputed_ops():
    _, model = _pair(0.5)
    assert "not planned yet" in str(model.remat_summary())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        _run(model, _x())
        _run(model, _x())
    s = model.remat_summary()
    text = str(s)
    assert "Block x" in text and "saved:" in text and "recomputed:" in text
    assert "of no checkpointing" in text and "full checkpointing" in text
    assert s.peak_full <= s.peak <= 0.5 * s.peak_eager + 1
    assert 1.0 < s.time_ratio < s.time_ratio_full


def test_policy_on_one_block_with_torch_checkpoint():
    torch.manual_seed(0)
    block = Block(32, p=0.2)
    ref = copy.deepcopy(block)
    x = torch.randn(4, 64, 32, requires_grad=True)
    fn = remat.policy(block, x, budget=0.5, profile=PROFILE)
    s = fn.summary()
    assert s.planned and s.rows[0].plan in ("selective", "full")
    assert s.rows[0].held <= 0.5 * s.rows[0].eager + 1
    for seed in (0, 1):
        torch.manual_seed(seed)
        out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=fn)
        gx, = torch.autograd.grad(out.square().sum(), x)
        torch.manual_seed(seed)
        gx0, = torch.autograd.grad(ref(x).square().sum(), x)
        torch.testing.assert_close(gx, gx0, rtol=0, atol=1e-6)


def test_frontier_and_choice_are_torch_free():
    """The step's choice: least recompute within the target, least memory at min."""
    P = eplan.Point
    f = [P(frozenset(), 100, 120, 0.0, unwrapped=True), P(frozenset({1}), 40, 130, 1.0), P(frozenset(), 10, 130, 3.0)]
    fronts = [f, f, f]
    assert eplan.step_peak([x[0] for x in fronts]) == 320  # 2 blocks held, the last one's backward
    c = eplan.choose(fronts, 200)
    assert c.feasible and c.peak <= 200
    assert c.recompute == min(sum(p.recompute for p in combo) for combo in _combos(fronts)
                              if eplan.step_peak(list(combo)) <= 200)
    least = eplan.choose(fronts, None)
    assert least.peak == eplan.step_peak([f[2]] * 3)
    bad = eplan.choose(fronts, 50)
    assert not bad.feasible and bad.peak == least.peak


def _combos(fronts):
    import itertools

    return itertools.product(*fronts)


def test_planned_offload_moves_only_what_the_plan_offloads():
    pytest.importorskip("remat.eager.offload")
    torch.manual_seed(0)
    ref = Net(d=64, layers=4, p=0.1)
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget=0.5, profile=PROFILE, offload=True)
    x = torch.randn(4, 128, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for seed in (0, 1):
            _, g0 = _run(ref, x, seed)
            _, g1 = _run(model, x, seed)
            for a, b in zip(g0, g1):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    planner = model._remat_planner
    planned = {}
    for name, _ in planner.blocks:
        bp, point = planner.plans[planner.block_key[name]], planner.choice[name]
        d = eplan.decisions(bp, point, offload=True)
        if not point.unwrapped:
            for i in point.offloaded:
                op = bp.capture.ops[i]
                assert d[(op.name, op.index)] == "offload"
                planned[op.name] = planned.get(op.name, 0) + 1
        else:
            assert "offload" not in d.values()
    assert planned, "on this CPU copies cost less than recomputing a matmul: the plan offloads some"
    stats = planner._offloader.stats
    # what moved is what the plan marked, in the last step (the counters add up over the 2 steps)
    assert set(stats.ops) == set(planned) and all(stats.ops[k] == 2 * v for k, v in planned.items()), (stats.ops, planned)
    assert "offloaded:" in str(model.remat_summary())


def test_choice_is_optimal_on_small_random_steps():
    """choose() against brute force over every combination of frontier points."""
    import itertools
    import random

    rng = random.Random(0)
    P = eplan.Point
    checked = 0
    for _ in range(150):
        fronts = []
        for _k in range(rng.randint(2, 4)):
            eager = rng.randint(50, 100)
            f = [P(frozenset(), eager, eager + 10, 0.0, unwrapped=True)]
            held, t = eager, 0.0
            for j in range(rng.randint(1, 4)):
                held = rng.randint(5, held - 1) if held > 6 else held
                t += rng.random() * 3
                f.append(P(frozenset({j}), held, eager + 10, t))
            fronts.append(f)
        out = eplan.Outside(before=rng.randint(0, 20), after=rng.randint(0, 50), kept=rng.randint(0, 20))
        target = int(eplan.step_peak([f[0] for f in fronts], out) * rng.uniform(0.3, 0.9))
        c = eplan.choose(fronts, target, out)
        fits = [sum(p.recompute for p in combo) for combo in itertools.product(*fronts)
                if eplan.step_peak(list(combo), out) <= target]
        if not fits:
            assert not c.feasible
            continue
        checked += 1
        assert c.feasible and c.peak <= target
        assert c.recompute <= min(fits) + 1e-9
    assert checked > 50


class ConvBlock(nn.Module):
    def __init__(self, c: int, p: float = 0.0) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


@pytest.mark.parametrize("budget", ["min", 0.6])
def test_batchnorm_running_statistics_updated_once(budget):
    """A replay would update BatchNorm's running statistics a second time: remat restores them."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Sequential(*[ConvBlock(8) for _ in range(3)]),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget=budget, profile=PROFILE)
    x = torch.randn(4, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for _ in range(2):
            for m in (ref, model):
                m.zero_grad(set_to_none=True)
                m(x).square().mean().backward()
    assert any(not p.unwrapped for p in model._remat_planner.choice.values())  # some block replays
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6)
    for (n, a), b in zip(ref.named_buffers(), model.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
