"""Planning a model that is never allocated: built on the meta device or under FakeTensorMode,
its inputs given as shapes, planned for a GPU that is not here (remat.capture.abstract and
remat.capture.target). The plan must be the one a real capture of the same shapes and dtypes
gives: the same graph, the same predicted peak to the byte."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import remat
from remat.capture.target import Target
from remat.cost.model import DeviceProfile
from remat.cost.profiles import memory_bytes, resolve_profile

transformers = pytest.importorskip("transformers")

BATCH, SEQ = 2, 64


def _config():
    return transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=128,
                                    max_position_embeddings=SEQ)


def _llama(device):
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(_config())


def _shapes():
    return remat.shapes(input_ids=((BATCH, SEQ), torch.long), labels=((BATCH, SEQ), torch.long))


@pytest.fixture(scope="module")
def plans():
    """The same tiny Llama planned from real CPU tensors, from the meta device (inputs as
    shapes), and from the meta device for an H100."""
    real = _llama("cpu")
    ids, labels = torch.zeros(BATCH, SEQ, dtype=torch.long), torch.zeros(BATCH, SEQ, dtype=torch.long)
    meta = _llama("meta")
    return {
        "real": remat.plan(real, input_ids=ids, labels=labels, use_cache=False, strict=True, cache=False),
        "meta": remat.plan(meta, inputs=_shapes(), strict=True, cache=False),
        "h100": remat.plan(meta, inputs=_shapes(), device="H100", strict=True, cache=False),
        "model": meta,
    }


def test_meta_llama_plans_as_the_real_capture(plans):
    real, meta = plans["real"], plans["meta"]
    assert len(meta.graph) == len(real.graph)
    assert meta.peak_bytes == real.peak_bytes
    assert sorted(s.name for s in meta.saved) == sorted(s.name for s in real.saved)
    assert meta.predicted_seconds == real.predicted_seconds
    assert meta.graph.meta["device"] == real.graph.meta["device"] == {"type": "cpu", "dtype": "float32"}
    # the attention is CPU flash attention (what a real capture gets), not the math path
    # PyTorch takes on the meta device, which materializes the attention matrix
    assert any("flash_attention" in n.op for n in meta.graph.nodes)
    # the model's own tensors are back on the meta device
    assert all(p.device.type == "meta" for p in plans["model"].parameters())


def test_fake_tensor_mode_model_plans_as_the_real_capture(plans):
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _llama("cpu")
        ids, labels = torch.zeros(BATCH, SEQ, dtype=torch.long), torch.zeros(BATCH, SEQ, dtype=torch.long)
    fake = remat.plan(model, input_ids=ids, labels=labels, strict=True, cache=False)
    assert fake.peak_bytes == plans["real"].peak_bytes
    assert len(fake.graph) == len(plans["real"].graph)


def test_target_records_the_gpu_and_prices_with_its_profile(plans):
    cpu, h100 = plans["meta"], plans["h100"]
    device = h100.graph.meta["device"]
    assert device["type"] == "cuda" and device["name"] == "H100" and device["target"] is True
    assert device["dtype"] == "float32"
    assert device["profile"]["name"] == resolve_profile("H100", dtype="float32").name
    assert device["memory_bytes"] == memory_bytes(resolve_profile("H100"))
    assert h100.peak_bytes == cpu.peak_bytes  # memory does not depend on the device here
    assert h100.predicted_seconds < cpu.predicted_seconds / 1.5  # an H100 is faster than this CPU


def test_profile_object_is_recorded():
    """A measured profile (an object or a file ``remat profile`` wrote) is what the graph
    records, with the captured step's dtype (no capture needed: the same record the
    partitioner writes into every captured graph's meta)."""
    profile = DeviceProfile("my-gpu (measured)", 100e12, 2e12, 5e-6)
    device = Target.create(profile=profile).device_meta({"type": "cpu", "dtype": "bfloat16"})
    assert device["type"] == "cuda" and device["target"] is True and device["dtype"] == "bfloat16"
    assert device["profile"]["peak_flops"] == 100e12 and device["profile"]["bandwidth"] == 2e12
    cpu = Target.create(device="cpu").device_meta({"type": "cpu", "dtype": "float32"})
    assert cpu["type"] == "cpu" and cpu["profile"]["name"] == "cpu"
    # a GPU is priced in the step's dtype unless its name says another; CUDA's names are read
    bf16 = {"type": "cpu", "dtype": "bfloat16"}
    assert Target.create(device="H100").device_meta(bf16)["profile"]["name"] == "h100-bf16"
    assert Target.create(device="H100-fp32").device_meta(bf16)["profile"]["name"] == "h100-fp32"
    assert Target.create(device="NVIDIA A100-SXM4-40GB").device_meta(bf16)["memory_bytes"] == 40 * 2**30


def test_function_of_shapes_plans_as_real():
    """seeds/003's f(a, b, c, d) = cos(cos(a + b + c + d)), its inputs given as shapes."""
    def f1(a, b, c, d):
        return (a + b + c + d).cos().cos()

    spec = ((1024,), torch.float32, True)
    abstract = remat.plan(f1, inputs=remat.shapes(spec, spec, spec, spec), cache=False)
    real = remat.plan(f1, *[torch.randn(1024, requires_grad=True) for _ in range(4)], cache=False)
    assert [s.name for s in abstract.saved_activations] == [s.name for s in real.saved_activations] == ["add_2"]
    assert abstract.peak_bytes == real.peak_bytes


def test_random_ops_plan_on_fake_tensors():
    """seeds/003's dropout-like mask: a random op's seed is fake when the step is (the forward
    runs once to capture, and draws no numbers then), and the plan is the real capture's."""
    def masked(x):
        return torch.nn.functional.dropout(x.cos(), 0.5, training=True).cos()

    abstract = remat.plan(masked, inputs=remat.shapes(((4096,), torch.float32, True)), cache=False, strict=True)
    real = remat.plan(masked, torch.randn(4096, requires_grad=True), cache=False, strict=True)
    assert any(n.category == "random" for n in abstract.graph.nodes)
    assert abstract.peak_bytes == real.peak_bytes
    assert sorted(abstract.saved_names) == sorted(real.saved_names)


def test_what_cannot_work_says_why(plans):
    model = plans["model"]
    with pytest.raises(remat.OptionError, match="meta device or fake.*remat.plan"):
        remat.compile(model)
    with pytest.raises(remat.OptionError, match="not a shape"):
        remat.shapes(input_ids=((8, 4096), "long"))
    with pytest.raises(remat.OptionError, match="cannot require grad"):
        remat.shapes(((8,), torch.long, True))
    with pytest.raises(remat.OptionError, match="Z80"):
        remat.plan(model, inputs=_shapes(), device="Z80")
    with pytest.raises(remat.OptionError, match="remat.shapes"):
        remat.plan(model, inputs={"input_ids": (BATCH, SEQ)})
    with pytest.raises(remat.OptionError, match="given twice"):
        remat.plan(model, torch.zeros(1), inputs=_shapes(), labels=torch.zeros(1))


def test_cli_captures_on_meta_and_plans_for_a_gpu(tmp_path, capsys):
    """``remat capture --abstract meta --device H100`` writes the graph a real capture writes,
    planned for the H100; ``remat plan --device H100`` plans the real one for it alike."""
    import json

    from remat.cli.main import main

    meta, real = tmp_path / "meta.json", tmp_path / "real.json"
    assert main(["capture", "--model", "mlp", "--abstract", "meta", "--device", "H100", "--out", str(meta)]) == 0
    assert main(["capture", "--model", "mlp", "--out", str(real)]) == 0
    capsys.readouterr()
    out = {}
    for name, argv in (("meta", [str(meta)]), ("real-h100", [str(real), "--device", "H100"]), ("real", [str(real)])):
        assert main(["plan", *argv, "--json"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
    assert remat.load_graph(meta).meta["device"]["name"] == "H100"
    assert out["meta"]["peak_bytes"] == out["real-h100"]["peak_bytes"] == out["real"]["peak_bytes"]
    assert out["meta"]["predicted_seconds"] == out["real-h100"]["predicted_seconds"]
    assert out["meta"]["predicted_seconds"] != out["real"]["predicted_seconds"]


def test_a_measured_profile_is_priced_with():
    """A profile given as an object (or a file) prices the plan, not the datasheet GPU its name
    might match: a GPU a hundred times slower predicts a slower step at the same peak."""
    import dataclasses

    fast = resolve_profile("H100-fp32")
    slow = dataclasses.replace(fast, name="slow-gpu (measured)", peak_flops=fast.peak_flops / 100,
                               bandwidth=fast.bandwidth / 100, launch_seconds=fast.launch_seconds * 100,
                               matmul_curve=(), bandwidth_curve=())
    xs = [torch.randn(256, 256, requires_grad=True) for _ in range(2)]
    p_fast, p_slow = (remat.plan(lambda a, b: (a @ b).relu().sum(), *xs, profile=p, cache=False)
                      for p in (fast, slow))
    assert p_slow.graph.meta["device"]["profile"]["name"] == "slow-gpu (measured)"
    assert p_slow.peak_bytes == p_fast.peak_bytes
    assert p_slow.predicted_seconds > 20 * p_fast.predicted_seconds
