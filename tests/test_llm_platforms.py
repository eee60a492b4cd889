"""Where language models are trained: a peft LoRA fine-tune (and a QLoRA-style one, its frozen base
in bf16), a mixture of experts with transformers' grouped experts (``aten._grouped_mm``),
transformers' ``Trainer`` and Lightning's, with ``remat.checkpoint`` (eager) and ``remat.compile``
(the ``eager`` compiler). Each gives the gradients, losses or weights training without remat
gives, to rounding, and remat's plan is in force (the step saves less, or every graph is planned
without falling back). torchtitan under FSDP2 is ``tests/test_torchtitan_fsdp.py``; the
Trainer with ``remat.compile`` is ``tests/test_trainer.py``; Lightning on a plain-torch module is
``tests/test_lightning.py``."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import remat
from remat.bench.measure import saved_activation_bytes
from remat.cost.model import DeviceProfile

transformers = pytest.importorskip("transformers")

PROFILE = DeviceProfile("test-cpu", 50e9, 8e9, 2e-6)  # fixed: no calibration in tests
V, B, S = 256, 2, 32
TIGHT = 1e-5  # the largest gradient difference, as a share of the largest gradient: rounding


def _config(layers: int = 2, **extra) -> dict:
    return dict(vocab_size=V, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=S, use_cache=False, **extra)


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(5))


def _lora(dropout: float = 0.1, base_dtype: torch.dtype = torch.float32, layers: int = 2):
    """A peft LoRA model (rank 4 on q_proj and v_proj) of a tiny transformers Llama, its base
    frozen; LoRA's B starts small instead of at zero (as after some training), so that A has
    gradients too."""
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(intermediate_size=128, **_config(layers))).to(base_dtype)
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                          lora_dropout=dropout))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model.train()


def _moe(dtype: torch.dtype = torch.float32, layers: int = 2):
    """A tiny Qwen3-MoE (4 experts, top 2), whose experts transformers 5 runs as one grouped
    matmul (``experts_implementation="grouped_mm"``, its default where torch has it)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                         head_dim=16, **_config(layers))
    model = Qwen3MoeForCausalLM(cfg).to(dtype).train()
    assert model.config._experts_implementation == "grouped_mm"
    return model


def _step(model, seed: int = 0):
    """One training step's loss and gradients, by parameter name (a compiled module's names
    without ``_orig_mod.``)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(input_ids=_ids(), labels=_ids())
    out.loss.backward()
    return float(out.loss.detach()), {n.replace("_orig_mod.", ""): p.grad.detach().clone()
                                      for n, p in model.named_parameters() if p.grad is not None}


def max_grad_err(got: dict, want: dict) -> float:
    """max |g - g_ref| over every parameter, as a share of the largest |g_ref|; the same
    parameters must have gradients."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    diff = max(float((got[n].double() - want[n].double()).abs().max()) for n in want)
    return diff / max(float(want[n].double().abs().max()) for n in want)


def _saved(model) -> int:
    def one():
        _step(model)
    return saved_activation_bytes(one, held=list(model.parameters())).activation_bytes


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The ATen ops a region runs."""

    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# --- peft LoRA / QLoRA-style -------------------------------------------------------------------

@pytest.mark.parametrize("budget", [0.8, "min"])
def test_lora_checkpoint_gradients_equal_eager_with_dropout(budget):
    """Only the adapters get gradients, with and without remat, equal with LoRA's dropout drawn
    the same; at "min" the step saves less than without checkpointing."""
    ref = _lora(dropout=0.1)
    model = remat.checkpoint(copy.deepcopy(ref), budget=budget, profile=PROFILE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        for seed in (0, 1):  # the first step plans, the second runs the plan
            loss0, g0 = _step(ref, seed)
            loss1, g1 = _step(model, seed)
            assert g0 and all("lora_" in n for n in g0)
            assert max_grad_err(g1, g0) <= TIGHT and loss1 == pytest.approx(loss0, rel=1e-6)
        if budget == "min":
            assert _saved(model) < 0.8 * _saved(ref)


def test_qlora_style_bf16_base_checkpoint_gradients_equal_eager():
    """QLoRA's layout without its 4-bit kernels: the frozen base in bf16, the adapters in fp32
    (peft keeps them there); the same dtypes run with and without remat, so the gradients are
    equal to fp32 rounding."""
    ref = _lora(dropout=0.0, base_dtype=torch.bfloat16)
    assert {p.dtype for n, p in ref.named_parameters() if p.requires_grad} == {torch.float32}
    model = remat.checkpoint(copy.deepcopy(ref), budget="min", profile=PROFILE)
    for seed in (0, 1):
        g0, g1 = _step(ref, seed)[1], _step(model, seed)[1]
        assert max_grad_err(g1, g0) <= TIGHT
    assert _saved(model) < 0.8 * _saved(ref)


@pytest.mark.slow
def test_lora_compile_gradients_equal_eager():
    """remat.compile plans the LoRA step (a frozen base: its weights need no gradient) in one
    graph, and its gradients are eager's (no dropout: compiled dropout draws its own masks)."""
    ref = _lora(dropout=0.0, layers=1)
    plans = []
    compiled = remat.compile(copy.deepcopy(ref), budget=0.8, compiler="eager", cache=False,
                             on_plan=lambda g, p: plans.append(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", remat.RematBudgetWarning)
        g1 = _step(compiled)[1]
    assert max_grad_err(g1, _step(ref)[1]) <= TIGHT
    assert len(plans) == 1 and plans[0].fallback is None and plans[0].feasible


# --- a mixture of experts with grouped experts ---------------------------------------------------

def test_moe_grouped_experts_checkpoint_gradients_equal_eager():
    """The experts' grouped matmul runs inside the checkpointed layers (and is recomputed
    there); gradients equal eager's for every expert and the router."""
    ref = _moe()
    model = remat.checkpoint(copy.deepcopy(ref), budget="min", profile=PROFILE)
    with _Ops() as ops:
        g0 = _step(ref)[1]
    assert "_grouped_mm" in ops.names
    assert any("experts" in n for n in g0) and any("gate" in n for n in g0)
    for seed in (0, 1):
        g0, g1 = _step(ref, seed)[1], _step(model, seed)[1]
        assert max_grad_err(g1, g0) <= TIGHT
    assert _saved(model) < 0.8 * _saved(ref)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")  # transformers' own
def test_moe_grouped_experts_compile_gradients_equal_plain_compile():
    """In bf16 transformers keeps the grouped matmul under torch.compile (in fp32 it swaps in
    its own fallback op): remat plans a graph holding ``_grouped_mm``, and its gradients are
    plain ``torch.compile``'s, and eager's to bf16 rounding."""
    ref = _moe(torch.bfloat16, layers=1)
    plans = []
    compiled = remat.compile(copy.deepcopy(ref), budget="min", compiler="eager", cache=False,
                             on_plan=lambda g, p: plans.append(p))
    g1 = _step(compiled)[1]
    torch._dynamo.reset()
    plain = _step(torch.compile(copy.deepcopy(ref), backend="aot_eager"))[1]
    assert max_grad_err(g1, plain) <= TIGHT
    assert max_grad_err(g1, _step(ref)[1]) <= 2e-2
    assert len(plans) == 1 and plans[0].fallback is None
    assert any(n.op.startswith("_grouped_mm") for n in plans[0].graph.nodes)


# --- transformers' Trainer ----------------------------------------------------------------------

def _trainer_run(model, tmp_path):
    """3 steps of ``Trainer.train()`` (SGD-like AdamW on the adapters, LoRA dropout on): the
    logged losses and the trained parameters."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    data = [{"input_ids": r, "labels": r} for r in torch.randint(0, V, (6, S), generator=torch.Generator().manual_seed(3))]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=3, logging_steps=1,
                             learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             seed=0, data_seed=0, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _updates(after: dict, before: dict) -> dict:
    """What training changed, parameter by parameter (compared as gradients are: it is the
    gradients' work, and unlike the weights themselves it is not mostly the initial values)."""
    return {n: after[n] - before[n] for n in after}


def test_trainer_trains_a_lora_model_checkpointed_by_remat_as_without(tmp_path):
    """The usual fine-tune: peft LoRA, ``remat.checkpoint`` before ``Trainer``; after 3 steps
    the losses and the adapters' updates equal the same Trainer run without remat, and remat
    planned."""
    base = _lora(dropout=0.1)
    initial = {n: p.detach().clone() for n, p in base.named_parameters() if p.requires_grad}
    want_losses, want = _trainer_run(copy.deepcopy(base), tmp_path / "plain")
    model = remat.checkpoint(copy.deepcopy(base), budget=0.5, profile=PROFILE)
    losses, got = _trainer_run(model, tmp_path / "remat")
    assert len(losses) == len(want_losses) == 3
    assert losses == pytest.approx(want_losses, rel=1e-5)
    assert max_grad_err(_updates(got, initial), _updates(want, initial)) <= TIGHT
    assert model._remat_planner.plans


# --- Lightning ----------------------------------------------------------------------------------

@pytest.fixture
def pl():
    """``lightning.pytorch``, with ``torch.compile`` as Lightning leaves it for the test, and
    restored after it (the wrapper is process-wide)."""
    original = torch.compile
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.fabric.wrappers import _capture_compile_kwargs

    if not hasattr(torch.compile, "__wrapped__"):  # imported before, and restored after that test
        torch.compile = _capture_compile_kwargs(original)
    yield lightning
    torch.compile = original


def _lightning_fit(pl, wrap) -> tuple[dict, dict]:
    """2 steps of Lightning's ``Trainer.fit`` on a LightningModule around a 1-layer transformers
    Llama; its parameters before and after them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lm = LlamaForCausalLM(LlamaConfig(intermediate_size=128, **_config(1)))

        def forward(self, ids):
            return self.lm(input_ids=ids, labels=ids).loss

        def training_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    module = LM()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    data = torch.utils.data.TensorDataset(torch.randint(0, V, (4, S), generator=torch.Generator().manual_seed(2)))
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging; remat's budget notes
        trainer.fit(wrap(module), torch.utils.data.DataLoader(data, batch_size=2))
    return before, {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.slow
def test_lightning_trains_a_transformers_lm_with_remat_as_without(pl):
    """Inside Lightning's Trainer (which compiles ``training_step`` with remat's backend after
    unwrapping the compiled module) remat still plans the step, and both remat.compile and
    remat.checkpoint update the weights as plain training does."""
    before, want = _lightning_fit(pl, lambda m: m)
    assert any(not torch.equal(before[n], want[n]) for n in want)
    plans: list = []
    compiled = _lightning_fit(pl, lambda m: remat.compile(m, budget=0.5, compiler="eager", cache=False,
                                                          on_plan=lambda g, p: plans.append(p)))[1]
    torch._dynamo.reset()
    planned = []
    checkpointed = _lightning_fit(pl, lambda m: planned.append(remat.checkpoint(m, budget=0.5, profile=PROFILE))
                                  or planned[0])[1]
    for got in (compiled, checkpointed):
        assert max_grad_err(_updates(got, before), _updates(want, before)) <= TIGHT
    assert plans and all(p.fallback is None for p in plans)
    assert planned[0]._remat_planner.plans
