"""A split region's parts lowered as calls of one subgraph (:mod:`remat.lower.fission_loop`).

MAGIS's fission runs a region as n parts, one after another; unrolled, the lowered modules hold
the region's ops n times and inductor compiles each copy. In loop form the modules call one
subgraph n times: the same gradients as unrolled (the same ops, in the same order), the same
measured peak (the parts still run one at a time), the part's ops held once.

The step-level cases are an LM head + mean cross-entropy (``remat.bench.fission.HeadLoss``,
a quarter of the labels ignored) split in 4 token parts by the benchmark solver that fixes n
(``remat.bench.fission.FIXED_SOLVER``), compiled without codegen; one test compiles it with
inductor, both ways. The graph-level cases unroll the MLP of ``test_fission_lowering`` with
:func:`~remat.lower.fission.fission_joint` and run the loop form of that joint graph.
"""

import copy

import pytest
import torch
from test_fission_lowering import _FORWARD, _MLP, _fission, _inputs, _x
from test_lowering import _captured_joint

import remat
from remat.bench import fission as bench_fission
from remat.bench.harness import copy_inputs, held, measure_peak
from remat.lower import partitioner
from remat.lower.fission import PART_META, fission_joint
from remat.lower.fission_loop import LOOP_ENV, REPORT_META, loop_parts, op_counts
from remat.zoo.trials import make_step

N = 4
_invoke = torch.ops.higher_order.invoke_subgraph


def _head_case():
    torch.manual_seed(0)
    model = bench_fission.HeadLoss(32, 512)
    x = torch.randn(256, 32)
    labels = bench_fission.lm_labels(torch.randint(0, 512, (1, 256)), prompt=0).reshape(-1)
    return model, (x, labels)


def _compiled(monkeypatch, loop: bool, compiler: str = "eager"):
    """The head case compiled with its region in N parts, lowered in loop form or unrolled:
    (the model, its step, the forward and backward modules the partitioner returned)."""
    monkeypatch.setenv(LOOP_ENV, "1" if loop else "0")
    bench_fission.register_fixed_solver()
    modules = []
    original = partitioner.loop_parts

    def spy(gm, fissions):
        out = original(gm, fissions)
        modules.append(out)
        return out

    monkeypatch.setattr(partitioner, "loop_parts", spy)
    torch._dynamo.reset()
    model, inputs = _head_case()
    fn = remat.compile(model, compiler=compiler, cache=False, dynamic=False, strict=True,
                       solver=bench_fission.FIXED_SOLVER, solver_options={"parts": N})
    step = make_step(fn, model, copy_inputs(inputs))
    step()
    assert len(modules) == 2, "the plan has no fission: the head case did not split"
    return model, step, modules


def _part_ops(gm):
    """Op -> how many part nodes run it in ``gm`` (subgraph copies carry part 0's tag)."""
    out = {}
    for n in gm.graph.nodes:
        if PART_META in n.meta:
            out[str(n.target)] = out.get(str(n.target), 0) + 1
    return out


def _factory(op):
    return op.split(".")[1:2] in (["full"], ["scalar_tensor"], ["iota"], ["view"])


def _calls(gm):
    return [n for n in gm.graph.nodes if n.target is _invoke]


@pytest.fixture(scope="module")
def both():
    """The head case compiled without codegen both ways (and eager autograd's gradients)."""
    with pytest.MonkeyPatch.context() as mp:
        loop = _compiled(mp, True)
    with pytest.MonkeyPatch.context() as mp:
        unrolled = _compiled(mp, False)
    model, inputs = _head_case()
    ref = copy.deepcopy(model)
    ref(*inputs).backward()
    return loop, unrolled, [p.grad for p in ref.parameters()]


def test_loop_form_gives_the_unrolled_gradients_and_eager_s(both):
    (loop_model, _, loop_modules), (unrolled_model, _, unrolled_modules), ref = both
    for fw_or_bw in loop_modules:
        assert fw_or_bw.meta[REPORT_META] == [{"fission": 0, "parts": N, "calls": N, "subgraphs": 1,
                                                "unrolled": 0, "reason": None}]
    assert [e["reason"] for m in unrolled_modules for e in m.meta[REPORT_META]] == [f"{LOOP_ENV}=0"] * 2
    for p, q, r in zip(loop_model.parameters(), unrolled_model.parameters(), ref):
        assert torch.equal(p.grad, q.grad)  # the same ops in the same order
        torch.testing.assert_close(p.grad, r, rtol=1e-5, atol=1e-6)


def test_loop_form_holds_the_parts_ops_once(both):
    """Unrolled, every op of the region is in the module N times; in loop form, once, in the
    subgraph the N calls share, and every other op is where it was."""
    (_, _, loop_modules), (_, _, unrolled_modules), _ = both
    for loop, unrolled in zip(loop_modules, unrolled_modules):
        calls = _calls(loop)
        assert len(calls) == N and len({c.args[0].target for c in calls}) == 1
        assert not _calls(unrolled) and not any(PART_META in n.meta for n in loop.graph.nodes)
        sub = getattr(loop, calls[0].args[0].target)
        in_sub, in_unrolled = _part_ops(sub), _part_ops(unrolled)
        assert sum(in_sub.values()) >= 10  # the head's ops, not a stray view
        assert in_unrolled == {k: N * c for k, c in in_sub.items()}
        # the loop form's ops: what was outside the parts, and the subgraph's once (the
        # constants it makes again aside)
        outside = {k: c - in_unrolled.get(k, 0) for k, c in op_counts(unrolled).items()}
        whole, once = op_counts(loop), op_counts(sub)
        for k in set(outside) | set(whole):
            if not _factory(k):
                assert whole.get(k, 0) == outside.get(k, 0) + once.get(k, 0), k
        assert sum(whole.values()) < sum(op_counts(unrolled).values()) / 2
    mm = "aten.mm.default"
    assert op_counts(unrolled_modules[1])[mm] == N * op_counts(loop_modules[1])[mm] == N * 3


def test_loop_form_keeps_the_unrolled_peak(both):
    (loop_model, loop_step, _), (unrolled_model, unrolled_step, _), _ = both
    _, inputs = _head_case()
    loop = measure_peak(loop_step, keep=held(loop_model, inputs))
    unrolled = measure_peak(unrolled_step, keep=held(unrolled_model, inputs))
    assert abs(loop - unrolled) <= 0.03 * unrolled, (loop, unrolled)


@pytest.mark.inductor
@pytest.mark.slow
def test_inductor_compiles_the_loop_form_to_the_unrolled_peak_and_gradients(monkeypatch):
    """Under inductor the subgraph is compiled once and called N times; the step's gradients
    are eager's and its measured peak the unrolled lowering's (the running sums of the weight
    gradient are written after each call, as unrolled, not summed in one kernel at the end)."""
    model, inputs = _head_case()
    ref = copy.deepcopy(model)
    ref(*inputs).backward()
    loop_model, loop_step, modules = _compiled(monkeypatch, True, "inductor")
    assert [len(_calls(m)) for m in modules] == [N, N]
    for p, r in zip(loop_model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)
    loop = measure_peak(loop_step, keep=held(loop_model, inputs))
    unrolled_model, unrolled_step, _ = _compiled(monkeypatch, False, "inductor")
    unrolled = measure_peak(unrolled_step, keep=held(unrolled_model, inputs))
    assert abs(loop - unrolled) <= 0.03 * unrolled, (loop, unrolled)


# -- the joint graph of the MLP ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return _captured_joint(_MLP(), torch.randn(12, 16))


def _run(gm, args):
    torch.manual_seed(0)
    return gm(*args)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None and y is None) or torch.equal(x, y)


def test_joint_graph_parts_become_calls(mlp):
    f = _fission(mlp.gm, _FORWARD, {_x(mlp.gm): 0}, 3, 12)
    unrolled = fission_joint(mlp.gm, [f])
    loop = loop_parts(unrolled, [f])
    assert len(_calls(loop)) == 3 and loop.meta[REPORT_META][0]["subgraphs"] == 1
    args = _inputs(mlp.gm)
    _same(_run(loop, args), _run(unrolled, args))


def test_a_part_unlike_the_others_stays_unrolled(mlp):
    """Part 1 computes something else (its GELU's constant changed): parts 0 and 2 share a
    subgraph, part 1 keeps its own nodes, and the module still computes what it says."""
    f = _fission(mlp.gm, _FORWARD, {_x(mlp.gm): 0}, 3, 12)
    unrolled = fission_joint(mlp.gm, [f])
    odd = next(n for n in unrolled.graph.nodes if n.name == "mul__part1")
    odd.args = (odd.args[0], 0.25)
    unrolled.recompile()
    loop = loop_parts(unrolled, [f])
    entry = loop.meta[REPORT_META][0]
    assert (entry["calls"], entry["unrolled"], entry["subgraphs"]) == (2, 1, 1)
    assert "match no other part" in entry["reason"]
    assert "mul__part1" in {n.name for n in loop.graph.nodes}
    args = _inputs(mlp.gm)
    _same(_run(loop, args), _run(unrolled, args))


def test_a_part_computed_twice_leaves_the_fission_unrolled(mlp):
    f = _fission(mlp.gm, _FORWARD, {_x(mlp.gm): 0}, 2, 12)
    unrolled = fission_joint(mlp.gm, [f])
    again = next(n for n in unrolled.graph.nodes if n.name == "erf__part0")
    with unrolled.graph.inserting_after(again):
        copy_ = unrolled.graph.node_copy(again)
    again.replace_all_uses_with(copy_, delete_user_cb=lambda u: u is not copy_)
    unrolled.recompile()
    loop = loop_parts(unrolled, [f])
    assert not _calls(loop)
    assert loop.meta[REPORT_META][0]["reason"] == "part 0 of 'erf' is computed twice in this module"


def test_the_switch_keeps_every_fission_unrolled(mlp, monkeypatch):
    monkeypatch.setenv(LOOP_ENV, "0")
    f = _fission(mlp.gm, _FORWARD, {_x(mlp.gm): 0}, 2, 12)
    unrolled = fission_joint(mlp.gm, [f])
    loop = loop_parts(unrolled, [f])
    assert loop.code == unrolled.code and loop.meta[REPORT_META][0]["reason"] == f"{LOOP_ENV}=0"


def test_a_tiny_llamas_split_head_runs_in_loop_form_with_eagers_gradients(monkeypatch):
    """``budget="min"`` on a Llama whose logits dominate splits its head and loss (the search's
    plan, the search's n); both modules call one subgraph per fission, and the gradients are
    eager's. Its backward's parts read slices of a zero tensor at their own offsets: those stay
    operands (embedded as constants, they made the parts look different)."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv(LOOP_ENV, "1")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 4096, (2, 64))
    labels = ids.clone()
    labels[0, :20] = -100
    ref = copy.deepcopy(model)
    ref(input_ids=ids, labels=labels).loss.backward()
    modules = []
    original = partitioner.loop_parts
    monkeypatch.setattr(partitioner, "loop_parts", lambda gm, f: modules.append(original(gm, f)) or modules[-1])
    torch._dynamo.reset()
    step = remat.compile(model, budget="min", compiler="eager", cache=False)
    step(input_ids=ids, labels=labels).loss.backward()
    assert len(modules) == 2
    for m in modules:
        assert all(e["calls"] == e["parts"] > 1 and e["unrolled"] == 0 for e in m.meta[REPORT_META]), m.meta
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-6, msg=name)
