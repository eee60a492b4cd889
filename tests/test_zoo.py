"""The benchmark zoo and methods: every entry x every method gives eager autograd's gradients
(no-codegen compiler), plus facts about the cases that would fail if the harness were wrong."""

import copy
import math
import warnings

import pytest
import torch

from remat import zoo
from remat.bench.methods import METHODS, Checkpointed, parse_method, prepare

ENTRIES = zoo.names()
COMPILED = [m for m in METHODS if m != "eager"]
# Tracing these through dynamo for 5 compiled methods takes a few seconds each on 2 cores.
SLOW = {"gpt2", "bert", "vit", "resnet18", "resnet50", "mobilenetv2", "densenet121", "unet"}

TOLERANCE = dict(rtol=1e-4, atol=1e-5)
# At tiny sizes the last stages of these CNNs have 1x1 or 2x2 feature maps, so BatchNorm
# normalizes over 2-8 values per channel and its backward amplifies float32 rounding: the
# compiled graph's decomposed BatchNorm differs from eager's kernel by up to 1% of the
# largest gradient (resnet18: 0.8%) in float32, and by 1e-11 in float64. Their gradient
# check runs in float64, where a difference means different math.
FLOAT64 = {"resnet18", "resnet50", "mobilenetv2", "densenet121"}


pytestmark = pytest.mark.usefixtures("one_thread")


def _param_names(case):
    names = [n for n, _ in case.model.named_parameters()]
    return names + [f"input{i}" for i, x in enumerate(case.inputs)
                    if isinstance(x, torch.Tensor) and x.requires_grad]


def _grads(prep):
    return [None if t.grad is None else t.grad.clone() for t in prep.params_and_inputs()]


def _buffers(model):
    return {n: b.clone() for n, b in model.named_buffers() if b.is_floating_point()}


_REFERENCE: dict = {}
_PREPARED: dict = {}


def _prepared(name, method):
    """A method's Prepared on the tiny case after one step, shared by the tests below (the
    gradient test fills it; compiling a model costs seconds)."""
    key = (name, method)
    if key not in _PREPARED:
        prep = prepare(method, zoo.build(name, "tiny"), compiler="eager", strict=True)
        prep.step()
        _PREPARED[key] = prep
    return _PREPARED[key]


def _reference(name):
    """(case, eager Prepared after one step, its loss, its gradients), once per entry."""
    if name not in _REFERENCE:
        case = zoo.build(name, "tiny", dtype=torch.float64 if name in FLOAT64 else torch.float32)
        ref = prepare("eager", case)
        loss = ref.step()
        _REFERENCE[name] = (case, ref, loss, _grads(ref))
    return _REFERENCE[name]


@pytest.mark.parametrize("method", COMPILED)
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else [])
                                  for n in ENTRIES])
def test_every_method_gives_eager_gradients(name, method):
    case, ref, ref_loss, expected = _reference(name)
    labels = _param_names(case)
    assert len(expected) == len(labels) > 0
    assert any(g is not None and g.abs().sum() > 0 for g in expected), "the loss must depend on something"
    tol = TOLERANCE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's notes; remat raises (strict) instead of warning
        prep = prepare(method, case, compiler="eager", strict=True)
        loss = prep.step()
    if name == "dropout-mask":
        _check_dropout_mask(prep, loss, same_mask=method != "torch-checkpoint")
        return
    got = _grads(prep)
    assert len(got) == len(expected)
    torch.testing.assert_close(loss, ref_loss, **tol, msg=f"{name} {method}: loss")
    for label, g, e in zip(labels, got, expected):
        assert (g is None) == (e is None), f"{name} {method}: {label}: gradient {'missing' if g is None else 'extra'}"
        if e is not None:
            torch.testing.assert_close(g, e, **tol, msg=lambda m: f"{name} {method}: {label}: {m}")
    if method != "torch-checkpoint":
        # BatchNorm / EvoNorm-B0 running statistics advance exactly as in eager.
        # (Checkpointing reruns the forward in the backward and may update them twice.)
        for (n, b), (_, e) in zip(_buffers(prep.model).items(), _buffers(ref.model).items()):
            torch.testing.assert_close(b, e, **tol, msg=lambda m: f"{name} {method}: buffer {n}: {m}")
    if name not in FLOAT64:
        _PREPARED[(name, method)] = prep
    if method == "torch-checkpoint":
        assert prep.plans == [] and prep.planner_seconds is None
    else:
        assert prep.plans and len(prep.plans) == len(prep.graphs), f"{name} {method}: no plan captured"
        assert len(prep.plans) == 1, f"{name} {method}: {len(prep.plans)} graphs (graph breaks)"
        assert prep.planner_seconds is not None
    assert prep.compile_seconds is not None and prep.compile_seconds > 0


def _check_dropout_mask(prep, loss, same_mask=True):
    """Compiled random ops do not reproduce eager's random stream (inductor's joint pass turns
    ``rand_like`` into seeded ``inductor_random``; checked: under the same ``manual_seed`` the
    masks differ), so instead check what must hold for any mask: for f2(x) = x * mask and
    loss = sum, x.grad is the mask (0 or 1), and it is the mask the forward used:
    loss == sum(x * x.grad). ``same_mask=False``: see
    test_checkpointed_random_op_with_eager_compiler_redraws."""
    x = prep.inputs[0]
    mask = x.grad
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    assert 0.35 < mask.mean().item() < 0.65
    if same_mask:
        torch.testing.assert_close(loss, (x.detach() * mask).sum(), rtol=1e-5, atol=1e-4)


def test_checkpointed_random_op_with_eager_compiler_reuses_the_forward_mask():
    """The eager compiler runs inductor_random from its seed, as inductor's kernels do, so a
    random op the partition recomputes (inside torch.utils.checkpoint) draws the same mask."""
    prep = prepare("torch-checkpoint", zoo.build("dropout-mask"), compiler="eager")
    loss = prep.step()
    x = prep.inputs[0]
    torch.testing.assert_close(loss, (x.detach() * x.grad).sum(), rtol=1e-5, atol=1e-4)


@pytest.mark.inductor
@pytest.mark.slow
def test_checkpointed_random_op_with_inductor_reuses_the_forward_mask():
    prep = prepare("torch-checkpoint", zoo.build("dropout-mask"), compiler="inductor")
    loss = prep.step()
    x = prep.inputs[0]
    torch.testing.assert_close(loss, (x.detach() * x.grad).sum(), rtol=1e-5, atol=1e-4)


def test_compiled_random_ops_are_reproducible_under_a_seed():
    case = zoo.build("dropout-mask")
    grads = []
    for method in ("torch-mincut", "mincut-conservative", "mincut-conservative"):
        prep = prepare(method, case, compiler="eager", strict=True)
        torch.manual_seed(1)
        prep.step()
        grads.append(prep.inputs[0].grad.clone())
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[1], grads[2])


def test_cos_cos_plan_saves_only_the_sum():
    for method in ("mincut-conservative", "mincut-aggressive"):
        (plan,) = _prepared("cos-cos", method).plans
        acts = plan.saved_activations
        assert [s.name for s in acts] == ["add_2"]
        assert acts[0].shape == (1024,)
        assert acts[0].nbytes == plan.saved_activation_bytes == 1024 * 4
    # PyTorch's no-recompute partition saves what autograd would: the sum and cos(sum)
    assert _prepared("cos-cos", "no-recompute").plans[0].saved_activation_bytes == 2 * 1024 * 4


def test_gelu_erf_plan_saves_no_activation():
    assert _prepared("gelu-erf", "mincut-conservative").plans[0].saved_activations == []


def test_qehvi_big_intermediates_are_not_saved():
    """seeds/000 Table 3: a min cut saves far less than autograd on qEHVI. Here that is the
    aggressive mode: in conservative mode ``prod`` (over the objectives) is not fusible, so its
    big input is "materialized in the backward anyway" and saved (about half of autograd's)."""
    saved = {m: sum(p.saved_activation_bytes for p in _prepared("qehvi", m).plans)
             for m in ("no-recompute", "mincut-conservative", "mincut-aggressive")}
    assert saved["mincut-aggressive"] < 0.1 * saved["no-recompute"]
    assert saved["mincut-conservative"] < saved["no-recompute"]


def test_qehvi_matches_botorch():
    """The plain-torch forward is botorch's model: the GP posterior equals
    ``gp.posterior(X)`` and the value equals ``qExpectedHypervolumeImprovement._compute_qehvi``."""
    from botorch.acquisition.multi_objective import qExpectedHypervolumeImprovement

    from remat.zoo.qehvi import make_botorch

    case = zoo.build("qehvi", "tiny", dtype=torch.float64, seed=3)
    info = case.info
    with torch.random.fork_rng():
        torch.manual_seed(3)
        gp, partitioning, ref_point = make_botorch(info["d"], info["m"], info["n"])
    (X,) = case.inputs
    X = X.detach()
    mean, cov = case.model.posterior(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = gp.posterior(X)
        acq = qExpectedHypervolumeImprovement(gp, ref_point.tolist(), partitioning)
    torch.testing.assert_close(mean.transpose(-1, -2), post.mean)
    q = info["q"]
    full = post.mvn.covariance_matrix  # (b, m*q, m*q), one q x q block per objective
    for j in range(info["m"]):
        torch.testing.assert_close(cov[:, j], full[:, j * q:(j + 1) * q, j * q:(j + 1) * q])
    samples = case.model.samples(X)
    assert samples.shape == (info["mc"], case.batch, q, info["m"])
    torch.testing.assert_close(case.model.hypervolume_improvement(samples), acq._compute_qehvi(samples))
    assert (case.model(X) > 0).all()


@pytest.mark.parametrize("name", ENTRIES)
def test_case_fields(name):
    case = zoo.build(name, "tiny")
    assert case.name == name and case.size == "tiny"
    assert case.kind == ("model" if name in zoo.names("model") else "pattern")
    assert case.description == zoo.describe(name)
    assert case.blocks, "at least one checkpoint block"
    for block in case.blocks:  # every block resolves to a real submodule
        assert isinstance(case.model.get_submodule(block), torch.nn.Module)
    if case.blocks != [""]:
        assert "" not in case.blocks and len(set(case.blocks)) == len(case.blocks)
    tensors = case.params_and_inputs()
    assert tensors and all(isinstance(t, torch.Tensor) for t in tensors)
    assert len(tensors) == len(list(case.model.parameters())) + sum(
        isinstance(x, torch.Tensor) and x.requires_grad for x in case.inputs)
    if case.kind == "model":
        assert case.num_params > 0
        assert not any(x.requires_grad for x in case.inputs if isinstance(x, torch.Tensor))
    else:
        assert all(x.requires_grad for x in case.inputs if x.is_floating_point())
    loss = case.loss(case.model(*case.inputs))
    assert loss.dim() == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("name", [n for n in ENTRIES if zoo.build(n).batch is not None])
def test_batch_override_changes_the_batch_dim(name):
    case = zoo.build(name, "tiny")
    bigger = zoo.build(name, "tiny", batch=case.batch + 3)
    assert bigger.batch == case.batch + 3
    for x, y in zip(case.inputs, bigger.inputs):
        assert y.shape[0] == x.shape[0] + 3 and y.shape[1:] == x.shape[1:]
    assert case.num_params == bigger.num_params
    loss = bigger.loss(bigger.model(*bigger.inputs))
    assert torch.isfinite(loss)
    if name not in ("gpt2", "bert"):  # (their loss is computed inside the model)
        out = bigger.model(*bigger.inputs)
        assert out.shape[0] == bigger.batch


def test_batch_override_rejected_without_batch_dim():
    assert zoo.build("cos-cos").batch is None
    with pytest.raises(ValueError, match="no batch dimension"):
        zoo.build("cos-cos", batch=4)


def test_deterministic_in_seed():
    a, b, c = (zoo.build("resnet18", seed=s) for s in (0, 0, 1))
    for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()):
        assert torch.equal(x, y)
    assert torch.equal(a.inputs[0], b.inputs[0]) and not torch.equal(a.inputs[0], c.inputs[0])
    torch.testing.assert_close(a.loss(a.model(*a.inputs)), b.loss(b.model(*b.inputs)))
    # the global RNG is left alone
    torch.manual_seed(5)
    r1 = torch.rand(3)
    torch.manual_seed(5)
    zoo.build("mlp")
    assert torch.equal(torch.rand(3), r1)


def test_unknown_names_sizes_kinds_raise():
    with pytest.raises(ValueError, match="valid names: cos-cos, dropout-mask"):
        zoo.build("resnet9000")
    with pytest.raises(ValueError, match="valid sizes: tiny, small, full"):
        zoo.build("mlp", "huge")
    with pytest.raises(ValueError, match="kind"):
        zoo.names("layer")


def test_names():
    assert zoo.names("pattern") == ["cos-cos", "dropout-mask", "gelu-erf", "evonorm-b0", "evonorm-s0",
                                    "transformer-encoder", "qehvi"]
    assert zoo.names("model") == ["mlp", "gpt2", "bert", "vit", "resnet18", "resnet50", "mobilenetv2",
                                  "densenet121", "vgg16", "unet"]
    assert zoo.names() == zoo.names("pattern") + zoo.names("model")


def test_dtype_and_device():
    case = zoo.build("evonorm-b0", dtype=torch.float64)
    assert case.inputs[0].dtype == torch.float64 and case.inputs[0].requires_grad
    assert all(p.dtype == torch.float64 for p in case.model.parameters())
    assert case.model.running_var.dtype == torch.float64
    bert = zoo.build("bert", dtype=torch.float64)
    assert bert.inputs[0].dtype == torch.long  # token ids keep their dtype


def test_tiny_cases_are_tiny():
    """A tiny case's step is a few dozen MFLOPs at most (BERT's, the largest, counts 23M), small
    enough for the suite to step every case many times; counted, not timed, the machine being
    shared."""
    from torch.utils.flop_counter import FlopCounterMode

    for name in ENTRIES:
        case = zoo.build(name, "tiny")
        with FlopCounterMode(display=False) as counter:
            case.loss(case.model(*case.inputs)).backward()
        assert counter.get_total_flops() <= 50e6, name
        assert sum(p.numel() for p in case.model.parameters()) <= 250_000, name


# -- methods -----------------------------------------------------------------------------------

def test_methods_use_their_own_copies():
    case = zoo.build("resnet18")
    before = copy.deepcopy(case.model.state_dict())
    a = prepare("eager", case)
    b = prepare("mincut-conservative", case, compiler="eager")
    a.step()
    assert a.model is not case.model and a.model is not b.model
    assert a.inputs[0] is not case.inputs[0]
    assert all(p.grad is None for p in case.model.parameters())
    assert all(p.grad is None for p in b.model.parameters())
    for k, v in case.model.state_dict().items():  # BatchNorm statistics of the case untouched
        assert torch.equal(v, before[k]), k
    # step zeroes the gradients: two steps give one step's gradient, not twice it
    g1 = [p.grad.clone() for p in a.model.parameters()]
    a.step()
    for x, y in zip(g1, a.model.parameters()):
        torch.testing.assert_close(y.grad, x, rtol=1e-3, atol=1e-4)  # (BatchNorm stats moved)


def test_checkpoint_wraps_every_block():
    case = zoo.build("unet")
    prep = prepare("torch-checkpoint", case, compiler="eager")
    for block in case.blocks:
        assert isinstance(prep.model.get_submodule(block), Checkpointed)
    # parameters in the same order as the case's (the wrapper adds a ".module" level)
    names = [n.replace(".module.", ".") for n, _ in prep.model.named_parameters()]
    assert names == [n for n, _ in case.model.named_parameters()]
    whole = prepare("torch-checkpoint", zoo.build("gelu-erf"), compiler="eager")
    assert isinstance(whole.model, Checkpointed)


def _saved_activation_bytes(prep):
    """Bytes the step's forward saves for the backward (autograd's and compiled graphs' saves
    alike), inputs and parameters excluded."""
    held = {t.untyped_storage().data_ptr() for t in prep.params_and_inputs() + list(prep.inputs)}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in held:
            seen[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        prep.step()
    return sum(seen.values())


def test_checkpoint_saves_less_than_no_recompute():
    """Full checkpointing saves only block inputs: less than autograd and no-recompute."""
    case = zoo.build("mlp", "small", batch=64)
    saved = {}
    for method in ("eager", "no-recompute", "torch-checkpoint"):
        prep = prepare(method, case, compiler="eager")
        prep.step()
        saved[method] = _saved_activation_bytes(prep)
    assert saved["torch-checkpoint"] < saved["no-recompute"] <= saved["eager"]


def test_method_strings():
    """A method is eager, torch-checkpoint, or a solver's name with its options: one name per
    method across the API, the command line and the benchmarks."""
    spec = parse_method("mincut-aggressive")
    assert (spec.kind, spec.solver, spec.options, spec.solver_options) == ("remat", "mincut-aggressive", {}, {})
    spec = parse_method("mincut-conservative:tie_break=false")
    assert spec.solver == "mincut-conservative" and spec.solver_options == {"tie_break": False}
    spec = parse_method("checkmate:budget=0.6,time_limit=5,threads=1")
    assert spec.options == {"budget": 0.6, "time_limit": 5} and spec.solver_options == {"threads": 1}
    assert parse_method("torch-mincut").solver == "torch-mincut"
    assert parse_method("torch-checkpoint").kind == "checkpoint"
    with pytest.raises(ValueError, match="mincut-conservative"):
        parse_method("mincut")
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        parse_method("nope")
    with pytest.raises(ValueError, match="no option 'bogus'"):
        parse_method("mincut-aggressive:bogus=0.6")
    with pytest.raises(ValueError, match="needs a memory budget"):
        parse_method("checkmate")
    with pytest.raises(ValueError, match="has no option 'x'"):
        parse_method("torch-mincut:x=1")
    with pytest.raises(ValueError, match="compiler"):
        prepare("torch-mincut", zoo.build("mlp"), compiler="tvm")


def test_solver_options_reach_the_solver():
    case = zoo.build("cos-cos")
    prep = prepare("mincut-aggressive:tie_break=false", case, compiler="eager", strict=True)
    prep.step()
    assert prep.options == {"tie_break": False}
    assert prep.plans[0].options["tie_break"] is False
    assert [s.name for s in prep.plans[0].saved_activations] == ["add_2"]


def test_sizes_are_documented_and_build():
    """small and full build (full: only the cheap ones, it is for a GPU); docstrings name sizes."""
    import remat.zoo.cnn as cnn
    import remat.zoo.patterns as patterns
    import remat.zoo.qehvi as qehvi
    import remat.zoo.transformers_models as tm

    for mod in (cnn, patterns, qehvi, tm):
        assert "tiny" in mod.__doc__ and "full" in mod.__doc__
    assert zoo.build("gelu-erf", "full").inputs[0].numel() == 2 ** 25  # seeds/000 Table 1
    assert zoo.build("qehvi", "full").info["q"] == 8
    small = zoo.build("evonorm-s0", "small")
    assert small.inputs[0].shape == (16, 32, 64, 64)
    assert math.prod(zoo.build("evonorm-b0", "small").inputs[0].shape) == 2 ** 21
