"""The head and loss of a language model split along the tokens in eager training
(remat.eager.chunked, remat.eager.lm_head): the loss and gradients are the model's own."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import remat
from remat.cost.model import PROFILES
from remat.eager.chunked import linear_cross_entropy, token_slices

transformers = pytest.importorskip("transformers")

PROFILE = PROFILES["cpu"]


def _grads(params):
    return [None if p.grad is None else p.grad.clone() for p in params]


def _max_err(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b) if x is not None or y is not None)


# -- the chunked loss itself ---------------------------------------------------------------------

@pytest.mark.parametrize("smoothing,softcap,reduction,bias", [
    (0.0, None, "mean", False), (0.1, 5.0, "mean", True), (0.0, None, "sum", True)])
def test_linear_cross_entropy_equals_the_unchunked_loss(smoothing, softcap, reduction, bias):
    torch.manual_seed(0)
    h = torch.randn(2, 19, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, requires_grad=True) if bias else None
    y = torch.randint(0, 50, (2, 19))
    y[0, :4] = -100
    y[1, 7] = -100
    wrt = [h, w] + ([b] if bias else [])

    z = F.linear(h, w, b)
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    ref = F.cross_entropy(z.reshape(-1, 50), y.reshape(-1), ignore_index=-100, label_smoothing=smoothing,
                          reduction=reduction)
    want = torch.autograd.grad(ref * 3.0, wrt)
    got_loss = linear_cross_entropy(h, w, y, b, label_smoothing=smoothing, softcap=softcap, reduction=reduction,
                                    chunk=5)
    got = torch.autograd.grad(got_loss * 3.0, wrt)
    assert got_loss.dtype == ref.dtype and torch.allclose(got_loss, ref, rtol=1e-10)
    for a, c in zip(want, got):
        assert torch.allclose(a, c, rtol=1e-8, atol=1e-11)


def test_a_retained_graph_backs_up_twice():
    torch.manual_seed(0)
    h = torch.randn(12, 4, requires_grad=True)
    w = torch.randn(9, 4, requires_grad=True)
    y = torch.randint(0, 9, (12,))
    loss = linear_cross_entropy(h, w, y, chunk=5)
    (loss * 2).backward(retain_graph=True)
    first = h.grad.clone()
    loss.backward()
    assert torch.allclose(h.grad, first * 1.5, rtol=1e-6)


def test_token_slices_cover_every_token_once():
    s = token_slices(10, 4)
    assert [(x.start, x.stop) for x in s] == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(remat.OptionError):
        token_slices(10, 0)


def test_labels_must_match_the_tokens():
    with pytest.raises(remat.OptionError, match="one label per token"):
        linear_cross_entropy(torch.randn(2, 3, 4), torch.randn(5, 4), torch.zeros(2, 4, dtype=torch.long))


# -- transformers causal LMs ---------------------------------------------------------------------

def _llama(vocab=400, tie=False, cls=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie, use_cache=False)
    return (cls or LlamaForCausalLM)(cfg).train()


def _batch(vocab=400, b=2, t=48):
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (b, t))
    labels = ids.clone()
    labels[0, :9] = -100
    return ids, labels


def _step(model, ids, labels, **kw):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, **kw)
    out.loss.backward()
    return out


@pytest.mark.parametrize("tie", [False, True])
def test_a_llama_trains_with_its_head_split_and_the_same_gradients(tie):
    base = _llama(tie=tie)
    ids, labels = _batch()
    ref = _step(base, ids, labels)
    want = _grads(base.parameters())
    m = remat.checkpoint(copy.deepcopy(base), budget="min", profile=PROFILE)
    for _ in range(2):
        out = _step(m, ids, labels)
    head = m._remat_planner.head
    assert head is not None and head.last_chunk is not None and head.last_chunk < labels.numel()
    assert out.logits is None  # the logits of every token never existed at once
    assert torch.allclose(out.loss, ref.loss, rtol=1e-6)
    assert _max_err(want, _grads(m.parameters())) < 1e-6
    m.eval()
    with torch.no_grad():
        assert m(input_ids=ids).logits.shape == (2, 48, 400)  # eval: the model's own head


def test_the_split_head_holds_a_fraction_of_the_models_own():
    from remat.bench.measure import peak_memory

    base = _llama(vocab=4000)
    ids, labels = _batch(4000, b=1, t=256)
    peaks = {}
    for name, budget in (("own", None), ("min", "min")):
        m = copy.deepcopy(base)
        if budget is not None:
            remat.checkpoint(m, budget=budget, profile=PROFILE)

        def step(m=m):
            _step(m, ids, labels)

        peaks[name] = peak_memory(step, held=list(m.parameters())).peak_bytes
    # the model's own head holds 12 bytes a logit at its backward's start: 256 x 4000 x 12 = 11.7 MiB
    assert peaks["min"] < 0.35 * peaks["own"], peaks


def test_num_items_in_batch_divides_as_transformers_does():
    base = _llama()
    ids, labels = _batch()
    ref = _step(base, ids, labels, num_items_in_batch=torch.tensor(57))
    want = _grads(base.parameters())
    m = remat.checkpoint(copy.deepcopy(base), budget="min", profile=PROFILE)
    out = _step(m, ids, labels, num_items_in_batch=torch.tensor(57))
    assert torch.allclose(out.loss, ref.loss, rtol=1e-6)
    assert _max_err(want, _grads(m.parameters())) < 1e-6


def test_gpt2_and_gemma2_run_their_own_head_code_per_chunk():
    from transformers import Gemma2Config, Gemma2ForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    models = [GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
              Gemma2ForCausalLM(Gemma2Config(vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=8, final_logit_softcapping=2.0, use_cache=False))]
    ids, labels = _batch(300)
    for base in models:
        base.train()
        ref = _step(base, ids, labels)
        want = _grads(base.parameters())
        m = remat.checkpoint(copy.deepcopy(base), budget="min", profile=PROFILE)
        out = _step(m, ids, labels)
        assert m._remat_planner.head.last_chunk is not None, type(base).__name__
        assert torch.allclose(out.loss, ref.loss, rtol=1e-5), type(base).__name__
        assert _max_err(want, _grads(m.parameters())) < 1e-5, type(base).__name__


def test_an_moe_adds_its_load_balancing_loss_once():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    base = MixtralForCausalLM(MixtralConfig(vocab_size=300, hidden_size=32, intermediate_size=48,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                                            router_aux_loss_coef=0.5, use_cache=False)).train()
    ids, labels = _batch(300)
    ref = _step(base, ids, labels)
    want = _grads(base.parameters())
    m = remat.checkpoint(copy.deepcopy(base), budget="min", profile=PROFILE)
    out = _step(m, ids, labels)
    assert m._remat_planner.head.last_chunk is not None
    assert out.aux_loss is not None and torch.allclose(out.aux_loss, ref.aux_loss)
    assert torch.allclose(out.loss, ref.loss, rtol=1e-5)
    assert _max_err(want, _grads(m.parameters())) < 1e-5


def test_a_loss_that_is_not_the_cross_entropy_of_the_logits_keeps_the_models_head():
    from transformers import LlamaForCausalLM

    class ZLoss(LlamaForCausalLM):  # a z-loss on the logits: not a cross-entropy the chunks may sum
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if out.loss is not None:
                out.loss = out.loss + 1e-3 * out.logits.float().logsumexp(-1).pow(2).mean()
            return out

    base = _llama(cls=ZLoss)
    ids, labels = _batch()
    ref = _step(base, ids, labels)
    want = _grads(base.parameters())
    m = remat.checkpoint(copy.deepcopy(base), budget="min", profile=PROFILE)
    with pytest.warns(remat.RematFallbackWarning, match="own head and loss"):
        out = _step(m, ids, labels)
    assert out.logits is not None and m._remat_planner.head.last_chunk is None
    assert torch.allclose(out.loss, ref.loss, rtol=1e-6)
    assert _max_err(want, _grads(m.parameters())) < 1e-6


def test_no_budget_and_head_false_keep_the_models_head():
    base = _llama()
    ids, labels = _batch()
    for kw in ({"budget": None}, {"budget": "min", "head": False}):
        m = remat.checkpoint(copy.deepcopy(base), profile=PROFILE, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = _step(m, ids, labels)
        assert out.logits is not None, kw
    with pytest.raises(remat.OptionError, match="head must be"):
        remat.checkpoint(copy.deepcopy(base), head="yes")


def test_the_summary_shows_the_head_and_its_share_of_the_budget():
    m = remat.checkpoint(_llama(vocab=2000), budget="min", profile=PROFILE)
    ids, labels = _batch(2000)
    _step(m, ids, labels)
    s = m.remat_summary()
    assert s.head is not None and not s.head[0].unwrapped
    assert "head and loss (LlamaForCausalLM): split along the tokens" in str(s)
    # the step's prediction counts the head: the model's own head alone holds more than min's step
    assert s.peak < s.head[1].live


def test_the_step_is_planned_once_and_an_out_of_reach_budget_warned_once(monkeypatch):
    from remat.eager.policy import Planner

    calls = []
    replan = Planner.replan
    monkeypatch.setattr(Planner, "replan", lambda self: (calls.append(1), replan(self))[1])
    m = remat.checkpoint(_llama(vocab=2000), budget=0.05, profile=PROFILE)
    ids, labels = _batch(2000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _step(m, ids, labels)
        first = len(calls)
        for _ in range(2):
            _step(m, ids, labels)
    assert first > 0 and len(calls) == first  # the same step again: no new plan
    assert len([w for w in seen if issubclass(w.category, remat.RematBudgetWarning)]) == 1


def test_policy_plans_the_head_on_transformers_route():
    from remat.eager.blocks import enable_transformers_checkpointing

    base = _llama()
    ids, labels = _batch()
    ref = _step(base, ids, labels)
    want = _grads(base.parameters())
    m = copy.deepcopy(base)
    fn = remat.policy(m, budget="min", profile=PROFILE)
    enable_transformers_checkpointing(m, use_reentrant=False, context_fn=fn)
    out = _step(m, ids, labels)
    assert fn.planner.head.last_chunk is not None and out.logits is None
    assert torch.allclose(out.loss, ref.loss, rtol=1e-6)
    assert _max_err(want, _grads(m.parameters())) < 1e-6
