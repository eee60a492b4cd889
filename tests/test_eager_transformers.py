"""remat.checkpoint / remat.policy on a tiny transformers Llama, eager (no torch.compile)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import remat
import remat.eager.policy as _policy
from hf import checkpointing_arguments
from remat.eager.blocks import enable_transformers_checkpointing
from remat.bench.measure import peak_memory
from remat.cost.model import DeviceProfile

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

PROFILE = DeviceProfile("test-cpu", 50e9, 8e9, 2e-6)  # fixed: no calibration in tests
_policy._profiles["sac"] = 10e-6  # SAC's per-op overhead, fixed too (measured otherwise)
V, B, S = 256, 4, 64


def _llama(dropout: float = 0.1, layers: int = 3):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=S,
                      attention_dropout=dropout, use_cache=False)
    m = LlamaForCausalLM(cfg)
    m.config._attn_implementation = "sdpa"
    m.train()
    return m


def _ids(seq: int = S):
    return torch.randint(0, V, (B, seq), generator=torch.Generator().manual_seed(5))


def _step(model, ids, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same(g0, g1, atol=1e-5):
    assert g0.keys() == g1.keys()
    for n in g0:
        torch.testing.assert_close(g0[n], g1[n], rtol=1e-4, atol=atol, msg=n)


def test_the_transformers_route_uses_transformers_5_s_names():
    """transformers 5 deprecates gradient_checkpointing_enable (a FutureWarning); remat enters
    through activation_checkpointing_enable, and so do the tests and the README."""
    model = _llama(dropout=0.0, layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        remat.checkpoint(model, budget=0.5, profile=PROFILE)
        _step(model, _ids())
    on = getattr(type(model), "is_activation_checkpointing", None)
    assert model._remat_planner.hf_route and (model.is_activation_checkpointing if on is not None
                                              else model.is_gradient_checkpointing)


def test_the_readme_and_the_tests_call_transformers_by_its_5_names():
    """The README's transformers route and the tests use activation_checkpointing*; the
    deprecated gradient_checkpointing* names appear only where it says they are the old ones."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", readme, flags=re.S))
    assert "activation_checkpointing_kwargs" in code and "gradient_checkpointing" not in code
    calls = re.compile(r"\.gradient_checkpointing_enable\(|gradient_checkpointing_kwargs=|gradient_checkpointing=True")
    for path in [*root.glob("tests/*.py"), *root.glob("benchmarks/*.py"), *root.glob("src/remat/**/*.py")]:
        text = path.read_text()
        found = [m.group(0) for m in calls.finditer(text)]
        if path.name in ("hf.py", "blocks.py", "test_eager_transformers.py"):
            continue  # the one fallback to the old names, for transformers 4, and this test
        assert not found, (path, found)


def test_context_fn_through_transformers_checkpointing():
    ref = _llama()
    model = copy.deepcopy(ref)
    fn = remat.policy(model, budget=0.5, profile=PROFILE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers 5's name, not the deprecated one
        enable_transformers_checkpointing(model, use_reentrant=False, context_fn=fn)
    ids = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for seed in (0, 1):  # attention dropout: the same masks as eager under the same seed
            l0, g0 = _step(ref, ids, seed)
            l1, g1 = _step(model, ids, seed)
            torch.testing.assert_close(l0, l1)
            _same(g0, g1)
    planner = fn.planner
    # the context_fn saw each layer's input shapes (hidden states B x S x 64) through the layers' hooks
    keys = set(planner.block_key.values())
    assert len(keys) == 1
    (key,) = keys
    assert key[0].endswith("LlamaDecoderLayer") and ("T", (B, S, 64), "torch.float32", "cpu", True) in key[1]
    s = fn.summary()
    assert any(r.plan in ("selective", "full") for r in s.rows)
    assert "LlamaDecoderLayer" in str(s)
    # the plan runs inside transformers' checkpoint: its backward re-runs exactly the forward-only
    # ops (silu, rsqrt) the plan neither keeps nor leaves unwrapped
    from torch.utils._python_dispatch import TorchDispatchMode

    fwd_only = {torch.ops.aten.silu.default, torch.ops.aten.rsqrt.default}

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func in fwd_only
            return func(*args, **(kwargs or {}))

    from remat.eager.plan import replayed

    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    with Count():
        loss.backward()
    expected = 0
    for name, layer in planner.blocks:
        bp, point = planner.plans[planner.block_key[name]], planner.choice[name]
        assert layer.gradient_checkpointing == (not point.unwrapped)
        if not point.unwrapped:
            expected += sum(1 for i, op in enumerate(bp.capture.ops[:replayed(bp.capture)])
                            if op.func in fwd_only and i not in point.kept)
    assert Count.n == expected and expected > 0, (Count.n, expected)


def test_checkpoint_uses_transformers_route_and_meets_budget():
    ref = _llama(dropout=0.0, layers=4)
    ids = _ids(128)

    def peak(m):
        def step():
            torch.manual_seed(0)
            m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return peak_memory(step, warmup=1, timeline=False).peak_bytes

    eager = peak(ref)
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget=0.5, profile=PROFILE)
    assert model.model.layers[0]._gradient_checkpointing_func is not None  # transformers' own route
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = peak(model)
    warned = any(issubclass(x.category, remat.RematBudgetWarning) for x in w)
    assert got < eager
    assert got <= 0.5 * eager * 1.03 or warned, got / eager
    # unwrapped layers have transformers' checkpointing off, the others on
    planner = model._remat_planner
    for name, layer in planner.blocks:
        assert layer.gradient_checkpointing == (not planner.choice[name].unwrapped)
    _same(_step(ref, ids)[1], _step(model, ids)[1])


@pytest.mark.parametrize("budget", ["min", 0.8])
def test_checkpoint_gradients_equal_with_dropout(budget):
    ref = _llama(dropout=0.2)
    model = copy.deepcopy(ref)
    remat.checkpoint(model, budget=budget, profile=PROFILE)
    ids = _ids()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for seed in (0, 1):
            l0, g0 = _step(ref, ids, seed)
            l1, g1 = _step(model, ids, seed)
            torch.testing.assert_close(l0, l1)
            _same(g0, g1)


def test_trainer_trains_with_either_route(tmp_path):
    from transformers import Trainer, TrainingArguments

    data = [{"input_ids": r, "labels": r} for r in _ids(32)]

    def train(model, **kw):
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=3,
                                 logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                                 learning_rate=1e-3, seed=0, data_seed=0, **kw)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    base = _llama(dropout=0.0, layers=2)
    ref = train(copy.deepcopy(base))
    m1 = remat.checkpoint(copy.deepcopy(base), budget=0.5, profile=PROFILE)
    l1 = train(m1)
    m2 = copy.deepcopy(base)
    fn = remat.policy(m2, budget="min", profile=PROFILE)
    l2 = train(m2, **checkpointing_arguments({"use_reentrant": False, "context_fn": fn}))
    assert len(ref) == len(l1) == len(l2) == 3
    for a, b, c in zip(ref, l1, l2):
        assert abs(a - b) < 1e-4 and abs(a - c) < 1e-4, (ref, l1, l2)
    assert m1._remat_planner.plans and fn.planner.plans
