"""Fission through a step's loss (issue 31): a mean is the sum of its parts' sums over the
whole count, mean cross-entropy with ``ignore_index`` sums its parts' losses and divides by
one count of valid targets computed whole before the parts, and the backward of every part
reads the scalar loss's gradient whole.

Each test captures a real joint graph, builds the token fission with the torch-free
transform (:func:`remat.transforms.fission.fission` on the dimension graph), lowers it with
:func:`remat.lower.fission.fission_joint` and runs both modules on the same tensors: the
loss and every gradient must be the same. The last test runs a tiny Llama through
``remat.compile`` with the plan's own fission.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from remat.capture.to_graph import graph_from_joint
from remat.graph.dims import label_side
from remat.graph.fission import MEAN, SUM
from remat.lower.fission import fission_joint
from remat.solvers.magis.ftree import ftree
from remat.transforms.fission import apply_fissions, illegal

from test_lowering import _captured_joint

TOKENS = 24  # 2 x 12: n = 2, 3, 4 divide it


class _HeadLoss(nn.Module):
    """A layer, an LM head of ``vocab`` and mean cross-entropy over the tokens."""

    def __init__(self, vocab=40, d=8, smoothing=0.0):
        super().__init__()
        self.lin, self.head, self.smoothing = nn.Linear(d, d), nn.Linear(d, vocab, bias=False), smoothing

    def forward(self, x, labels):
        logits = self.head(torch.tanh(self.lin(x)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               label_smoothing=self.smoothing)


class _MeanSquares(nn.Module):
    """A layer and a mean-of-squares loss over every element (the batch included)."""

    def __init__(self, d=8):
        super().__init__()
        self.lin, self.out = nn.Linear(d, 16), nn.Linear(16, d)

    def forward(self, x, target):
        return ((self.out(torch.relu(self.lin(x))) - target) ** 2).mean()


def _labels(valid_in_first_part: int) -> torch.Tensor:
    """Labels with ignored positions spread unevenly: the first tokens are mostly ignored, so
    the parts hold different counts of valid targets."""
    torch.manual_seed(1)
    labels = torch.randint(0, 40, (2, 12))
    flat = labels.view(-1)
    flat[valid_in_first_part:8] = -100
    flat[17] = -100
    return labels


def _token_fission(joint, n, holds="mm.default"):
    """The largest region the F-Tree offers (every node counted hot) along the tokens that
    holds a forward ``holds`` op."""
    g = graph_from_joint(joint, compiler="eager")
    tree = ftree(g, {v.name for v in g.nodes})
    along = [f for f in tree.candidates if f.length % TOKENS == 0
             and any(g[v].op == holds and g[v].role == "forward" for v in f.nodes)]
    assert along, [(f.label, f.length) for f in tree.candidates]
    return g, max(along, key=lambda f: len(f.nodes)).with_n(n)


def _run(gm, args):
    out = gm(*args)
    return [o for o in out if o is not None]


def _assert_same(joint, new, args):
    want, got = _run(joint.gm, args), _run(new, args)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def _args(joint, x, labels):
    """The joint module's inputs: parameters as captured, then x, labels, the tangent 1."""
    ins = []
    for p in joint.gm.graph.find_nodes(op="placeholder"):
        val = p.meta["val"]
        if tuple(val.shape) == tuple(x.shape) and val.dtype == x.dtype:
            ins.append(x)
        elif tuple(val.shape) == tuple(labels.shape) and val.dtype == labels.dtype:
            ins.append(labels)
        elif val.dim() == 0 and val.dtype.is_floating_point:
            ins.append(torch.ones(()))
        else:
            torch.manual_seed(len(ins))
            ins.append(torch.randn(val.shape, dtype=val.dtype))
    return ins


@pytest.fixture(scope="module")
def head_loss():
    torch.manual_seed(0)
    x, labels = torch.randn(2, 12, 8), _labels(3)
    return _captured_joint(_HeadLoss(), x, labels), x


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("valid", [0, 3])
def test_cross_entropy_with_ignored_labels_splits_along_the_tokens(head_loss, n, valid):
    """The loss and every gradient of the split step equal the whole step's, with parts of
    unequal valid counts (``valid = 0``: the first part has no valid target at all)."""
    joint, x = head_loss
    g, f = _token_fission(joint, n)
    assert illegal(g, f) is None
    head = [v for v in f.nodes if g[v].op == "mm.default" and g[v].role == "forward"]
    assert head, "the head's matmul is in the region: the whole logits never exist"
    backward = [v for v in f.nodes if g[v].role == "backward"]
    assert backward, "the region holds the loss's backward too"
    # the count of valid targets is computed whole, before the parts: label-side, not split
    assert any(g[v].op.startswith("sum") for v in label_side(g))
    assert SUM in f.outputs.values()
    new = fission_joint(joint.gm, [f])
    _assert_same(joint, new, _args(joint, x, _labels(valid)))


def test_the_split_graph_never_holds_the_whole_logits(head_loss):
    """In the torch-free transform every part that is not a view or a partial sum is at
    most 1/n of the logits: the head's matmul runs in parts, and so does its loss's backward."""
    joint, _ = head_loss
    g, f = _token_fission(joint, 4)
    split = apply_fissions(g, [f.with_n(4)])
    logits = max(g[v].bytes for v in f.nodes if g[v].op == "mm.default")
    parts = [n for n in split.nodes if n.meta.get("fission_part") and n.category != "view"
             and f.axis[n.meta["fission_part"][0]] >= 0]  # not a partial sum (a weight's gradient)
    assert parts and max(n.bytes for n in parts) <= logits // 4


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_mean_over_the_split_dimension_is_the_sum_of_part_sums_over_the_count(n):
    torch.manual_seed(0)
    x, target = torch.randn(TOKENS, 8), torch.randn(TOKENS, 8)
    joint = _captured_joint(_MeanSquares(), x, target)
    g, f = _token_fission(joint, n, holds="mean.default")
    assert illegal(g, f) is None
    assert MEAN in f.outputs.values(), f.outputs
    split = apply_fissions(g, [f])
    means = [v for v, d in f.outputs.items() if d == MEAN]
    assert all(split[v].op == "div.Scalar" for v in means)
    _assert_same(joint, fission_joint(joint.gm, [f]), _args(joint, x, target))


def test_label_smoothing_splits_too():
    """Label smoothing adds a mean over the vocabulary and the tokens: it merges as well."""
    torch.manual_seed(0)
    x, labels = torch.randn(2, 12, 8), _labels(3)
    joint = _captured_joint(_HeadLoss(smoothing=0.1), x, labels)
    g, f = _token_fission(joint, 3)
    assert illegal(g, f) is None
    _assert_same(joint, fission_joint(joint.gm, [f]), _args(joint, x, labels))


def test_a_tiny_llama_runs_its_head_and_loss_in_token_parts_through_remat_compile():
    """``budget="min"`` on a Llama whose logits dominate: the plan splits the LM head and
    its loss (along the tokens or the batch, as the search finds), and training with it
    gives eager's loss and gradients."""
    transformers = pytest.importorskip("transformers")
    import remat

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 4096, (2, 64))
    labels = ids.clone()
    labels[0, :20] = -100

    def loss(m):
        return m(input_ids=ids, labels=labels).loss

    want = loss(model)
    want.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    plans = []
    step = remat.compile(model, budget="min", compiler="eager", cache=False,
                         on_plan=lambda g, p: plans.append(p))
    got = loss(step)
    got.backward()
    assert plans and plans[0].fissions, [p.solver for p in plans]
    split = plans[0].graph
    head = [n for n in split.nodes if "__part" in n.name and n.op == "mm.default"
            and n.role == "forward" and n.meta.get("module", "").endswith("lm_head")]
    assert head, f"the LM head's matmul runs in parts: the whole logits never exist\n{plans[0]}"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[k], rtol=1e-4, atol=1e-6, msg=k)
