"""transformers' ``Trainer`` trains a module ``remat.compile`` returns, with default arguments
(issue 30): the compiled module shows the model's own ``forward`` signature, so Trainer keeps
the dataset's columns, and its steps give the weights plain training gives."""

from __future__ import annotations

import inspect

import pytest
import torch

import remat

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=32))


def _train(model, tmp_path) -> dict[str, torch.Tensor]:
    from transformers import Trainer, TrainingArguments

    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(0, 128, (16,), generator=g),
             "labels": torch.randint(0, 128, (16,), generator=g)} for _ in range(6)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             seed=0, dataloader_num_workers=0)
    Trainer(model=model, args=args, train_dataset=data).train()
    return {k: v.detach().clone() for k, v in getattr(model, "_orig_mod", model).state_dict().items()}


def test_trainer_trains_a_remat_compiled_model_with_default_arguments(tmp_path):
    plain = _train(_llama(), tmp_path / "plain")
    torch._dynamo.reset()
    plans = []
    model = _llama()
    compiled = remat.compile(model, budget=0.8, compiler="eager", outputs="dropped", cache=False,
                             on_plan=lambda g, p: plans.append(p))
    assert inspect.signature(compiled.forward) == inspect.signature(model.forward)
    ours = _train(compiled, tmp_path / "remat")
    torch._dynamo.reset()
    assert plans and all(p.feasible for p in plans)
    assert plans[0].graph.meta.get("outputs") == "dropped"
    for name, value in plain.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(v, p) for v, p in zip(_llama().state_dict().values(), ours.values()))


def test_a_workspace_probe_takes_inputs_whose_strides_overlap():
    """Found by the Trainer test: a Llama with one key-value head expands it over the query
    heads (stride 0), and measuring an op's workspace on such an input raised, so remat fell
    back to PyTorch's partitioner for the whole graph."""
    from remat.capture.workspace import _real

    t = _real(("T", (2, 4, 3), (3, 0, 1), torch.float32, "cpu"))
    assert t.shape == (2, 4, 3) and t.stride() == (3, 0, 1) and torch.isfinite(t).all()
    assert _real(("T", (0, 3), (3, 1), torch.float32, "cpu")).shape == (0, 3)
