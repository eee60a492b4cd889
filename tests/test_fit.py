"""``remat fit``: the largest batch a step fits on a GPU, per method (Checkmate's paper's
maximum-batch experiment, Section 6.4 / Figure 6, on its graphs; captured PyTorch steps)."""

from __future__ import annotations

import json

import pytest

from remat.cli.main import main
from remat.cost.model import CostModel
from remat.cost.profiles import resolve_profile
from remat.errors import GraphError, OptionError
from remat.fit import fit, model_states
from remat.fit.entry import CHECKMATE_PUBLISHED, _retarget
from remat.fit.family import GraphFamily
from remat.fit.fitting import fit_checkmate, fit_family, without_input_bytes
from remat.fit.result import FitResult
from remat.graph.graph import Graph, Node

# ---- Checkmate's maximum batch (their paper's Figure 6, the artifact's VGG19) --------------------

def test_checkmate_vgg19_reaches_the_papers_maximum_batch():
    """The artifact's VGG19 on a 16 GB V100, cost at most one extra forward pass: the MILP's
    published (proved optimal) maximum batch is 289. remat's LP rounding reaches it, and 290 is
    refused (no schedule fits: the search is exact)."""
    r = fit("checkmate:VGG19", methods="griewank,checkmate-lp")
    lp = r.method("checkmate-lp")
    assert lp.size == CHECKMATE_PUBLISHED["VGG19"]["checkmate"] == 289
    assert lp.exact and lp.overhead <= 1.5855
    assert lp.peak_bytes <= 16e9  # activations + the fixed 2 x params x 4 bytes
    assert r.method("griewank").size == 289  # warm start for the LP: the best baseline's


def test_more_memory_never_fits_a_smaller_batch_on_checkmate_graphs():
    from remat.data import checkmate_path
    from remat.graph.io import load_graph

    g = without_input_bytes(load_graph(checkmate_path("VGG16")))
    sizes = {m: [] for m in ("checkpoint-all", "chen-sqrtn")}
    for cap in (6e9, 10e9, 16e9):
        for f in fit_checkmate(g, cap, 2 * 4 * 138_357_544, methods=tuple(sizes)):
            sizes[f.method].append(f.size)
    for m, s in sizes.items():
        assert s == sorted(s) and s[0] < s[-1], (m, s)
    assert all(a <= b for a, b in zip(sizes["checkpoint-all"], sizes["chen-sqrtn"]))


# ---- model states ---------------------------------------------------------------------------------

def test_adamw_mixed_precision_is_16_bytes_per_parameter():
    s = model_states(1000, optimizer="AdamW", dtype="bf16")
    assert (s.param_bytes, s.grad_bytes, s.master_bytes, s.optimizer_bytes) == (2000, 2000, 4000, 8000)
    assert s.bytes_per_param == 16 and s.held_by_graph == 4000 and s.beside_graph == 12000


@pytest.mark.parametrize("kw, per_param", [
    ({"optimizer": "adamw", "dtype": "fp32"}, 16),  # weights, grads, two moments; no master copy
    ({"optimizer": "sgd", "dtype": "bf16"}, 8),  # 2 + 2 + 4 master
    ({"optimizer": "sgd-momentum", "dtype": "fp32"}, 12),
    ({"optimizer": "adamw", "dtype": "bf16", "master_weights": False}, 8),  # pure bf16: 2 + 2 + 2 x 2
])
def test_optimizer_state_bytes(kw, per_param):
    assert model_states(10, **kw).bytes_per_param == per_param


def test_fsdp_shards_every_state():
    one, eight = model_states(1001, shards=1), model_states(1001, shards=8)
    assert eight.param_bytes == -(-2002 // 8) and eight.optimizer_bytes == -(-8008 // 8)
    assert eight.total * 8 >= one.total > (eight.total - 4) * 8


def test_fsdp_takes_the_other_shards_of_the_parameters_off_the_graph_and_adds_the_gathered_blocks():
    from remat.fit.fitting import outside_graph

    one, four = model_states(1000, shards=1), model_states(1000, shards=4)
    assert outside_graph(one, 2000, gather_bytes=300) == 12000  # master + AdamW's moments; no gathering
    # the graph holds 2000 bytes of bf16 weights; a GPU keeps 500 of them, 3000 of fp32 state
    assert outside_graph(four, 2000, gather_bytes=300) == 3000 - 1500 + 300


def test_states_refuse_unknown_names():
    with pytest.raises(OptionError, match="unknown optimizer 'lion'"):
        model_states(10, optimizer="lion")
    with pytest.raises(OptionError, match="unknown training dtype 'int8'"):
        model_states(10, dtype="int8")


# ---- the graph at any size ------------------------------------------------------------------------

def _step(s: int, sequence: bool = False) -> Graph:
    """A step whose ``h`` is linear in the size and whose ``scores`` quadratic (sequence)."""
    b, t = (2, s) if sequence else (s, 8)
    return Graph([
        Node("x", "placeholder", role="input", bytes=4 * b * t, shape=(b, t), dtype="float32"),
        Node("w", "placeholder", role="param", bytes=4 * 64, shape=(8, 8), dtype="float32"),
        Node("h", "mm", ("x", "w"), bytes=4 * b * t * 8, shape=(b, t, 8), dtype="float32",
             category="compute", flops=2 * b * t * 64),
        Node("scores", "bmm", ("h", "h"), bytes=4 * b * t * t, shape=(b, t, t), dtype="float32",
             category="compute", flops=2 * b * t * t * 8),
        Node("loss", "sum", ("scores",), bytes=4, shape=(), dtype="float32", category="reduction",
             is_output=True),
    ], name="step")


@pytest.mark.parametrize("sequence", [False, True])
def test_family_builds_the_graph_a_capture_at_that_size_gives(sequence):
    fam = GraphFamily((2, 3, 4), [_step(s, sequence) for s in (2, 3, 4)], "sequence" if sequence else "batch")
    for size in (1, 7, 1000):
        want, got = _step(size, sequence), fam.at(size)
        assert [(n.bytes, n.shape, n.flops) for n in got.nodes] == [(n.bytes, n.shape, n.flops) for n in want.nodes]


def test_family_refuses_captures_of_different_programs():
    other = Graph([n.replace(op="addmm") if n.name == "h" else n for n in _step(4).nodes], name="step")
    with pytest.raises(GraphError, match="node 'h' differs"):
        GraphFamily((2, 3, 4), [_step(2), _step(3), other])


# ---- a captured PyTorch step ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_family():
    from remat.fit.workload import capture_step, workload

    w = workload("mlp", size="tiny", dtype="float32", abstract=True)
    profile = resolve_profile("A100-40GB", dtype="fp32")
    steps = [w.step(b, None) for b in (2, 3, 4)]
    graphs = [_retarget(capture_step(s, "mlp"), profile, "float32") for s in steps]
    return GraphFamily((2, 3, 4), graphs), CostModel(profile, fused_memory=True), steps[0]


def test_more_memory_never_fits_a_smaller_batch_and_min_fits_at_least_full(mlp_family):
    fam, cm, step = mlp_family
    n = sum(p.numel() for p in step.model.parameters())
    states = model_states(n, optimizer="adamw", dtype="fp32")
    methods = ("none", "full", "remat-min")
    got = {m: [] for m in methods}
    for cap in (8 << 20, 32 << 20):
        for f in fit_family(fam, cm, cap, states, methods=methods, blocks=step.blocks,
                            full_param_bytes=4 * n, time_limit=20):
            got[f.method].append(f)
            assert f.exact and f.peak_bytes <= cap  # the batch found fits, the next does not
    for m, fs in got.items():
        assert fs[0].size < fs[1].size, m
    for small, big in zip(got["full"], got["remat-min"]):
        assert big.size >= small.size
    assert got["none"][1].size <= got["full"][1].size


def test_the_peak_at_the_batch_found_is_the_plan_of_the_graph_at_that_batch(mlp_family):
    from remat.fit.methods import plan_step

    fam, cm, step = mlp_family
    n = sum(p.numel() for p in step.model.parameters())
    states = model_states(n, optimizer="sgd", dtype="fp32")
    (f,) = fit_family(fam, cm, 16 << 20, states, methods=("none",), blocks=step.blocks, full_param_bytes=4 * n)
    plan = plan_step("none", fam.at(f.size), cm)
    assert f.peak_bytes == plan.peak_bytes + states.beside_graph
    assert plan_step("none", fam.at(f.size + 1), cm).peak_bytes + states.beside_graph > 16 << 20


# ---- the command line -----------------------------------------------------------------------------

def test_json_parses_and_reads_back(capsys):
    assert main(["fit", "--checkmate", "VGG19", "--methods", "checkpoint-all", "--json", "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    r = FitResult.from_dict(d)
    assert d["format"] == "remat-fit" and r.method("checkpoint-all").size == 222
    assert r.capacity_bytes == 16 * 1000**3


@pytest.mark.parametrize("argv, says", [
    (["fit", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    (["fit", "gpt2", "--gpu", "H999"], "does not know the device 'H999'"),
    (["fit", "--checkmate", "VGG19", "--methods", "magic"], "unknown method 'magic'"),
    (["fit", "gpt2", "--optimizer", "lion"], "unknown optimizer 'lion'"),
    (["fit", "--checkmate", "NoSuchNet"], "NoSuchNet"),
])
def test_bad_names_are_one_clear_error(capsys, argv, says):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
