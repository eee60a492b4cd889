"""Views inductor copies out of channels-last storages, and scatters ATen runs into a copy.

On two CPU threads inductor hands a max-pool backward's scatter-add to ATen. ATen reads the
index and the source as ``(N*C, H*W)`` views, which no strides express on the channels-last
storages inductor gave them: inductor writes each value, then copies it. The scatter's output
is a copy of its zeros the kernel before it writes, before that kernel group's frees.
ResNet-18's least-memory plan measured 13.8% above its prediction on two threads until the
simulator counted both (``benchmarks/peak_trace.py --model resnet18 --threads 2``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import remat
from remat.capture.layouts import layouts
from remat.cost.model import CostModel, materialized, storage
from remat.graph.graph import Graph, Node
from remat.plans.schedule import Schedule
from remat.plans.simulator import simulate

W = 1024


def _t(name, op, inputs, category, role="forward", nbytes=W, **kw):
    return Node(name, op, tuple(inputs), role=role, bytes=nbytes, category=category, **kw)


def _conv_view_mm(x):
    """A convolution, a ReLU, and a matmul reading the ReLU as ``(N*C, H*W)``."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    y = torch.relu(conv(x))
    return (y.view(-1, y.shape[2] * y.shape[3]) @ torch.ones(y.shape[2] * y.shape[3], 2)).sum()


@pytest.mark.parametrize("compiler, copied", [("inductor", True), ("eager", False)])
def test_capture_marks_a_view_no_channels_last_strides_express(compiler, copied):
    """Under inductor the ReLU is channels-last, so the matmul's view of it is a copy: a storage
    of its own, beside its base, which inductor writes. Op by op nothing is channels-last."""
    g = remat.plan(_conv_view_mm, torch.randn(2, 3, 8, 8), cache=False, for_compiler=compiler).graph
    (view,) = [n for n in g.nodes if n.op.startswith("view") and n.shape == (8, 64) and n.role == "forward"]
    assert bool(view.meta.get("copied_view")) is copied
    owner, sizes = storage(g)
    i, base = g.index(view.name), g.index(view.inputs[0])
    assert (owner[i] == i) is copied and sizes[i] == (view.bytes if copied else 0)
    assert materialized(g)[i]  # read by a library call
    assert bool(materialized(g)[base]) is copied  # else a view: the storage it shares is written


def test_views_follow_their_base_s_channels_last_strides():
    """Merging the spatial dimensions of a channels-last tensor is a view; merging the batch
    with the channels is not."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1).relu()
        return y.view(2, 4, 64), y.view(8, 64)

    gm = make_fx(f, tracing_mode="fake")(torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))
    copied: set[str] = set()
    out = layouts(list(gm.graph.nodes), copied)
    views = [n.name for n in gm.graph.nodes if n.op == "call_function" and "view" in str(n.target)]
    assert out[views[0]] == (256, 1, 4)  # (N, C, H*W) of strides (256, 1, 32, 4)
    assert copied == {views[1]}


def test_a_copied_view_is_allocated_beside_its_base_and_never_in_place():
    """The copy reads its base in another order than it writes: never into the base's storage,
    even where the base dies there."""
    def graph(copied):
        return Graph([
            _t("x", "placeholder", (), "input", role="input"),
            _t("w", "placeholder", (), "input", role="param"),
            _t("a", "mm", ("x", "w"), "compute"),
            _t("b", "relu", ("a",), "pointwise"),
            _t("v", "view.default", ("b",), "view", meta={"alias_of": "b", **({"copied_view": True} if copied else {})}),
            _t("c", "mm", ("v", "w"), "compute", nbytes=16, is_output=True),
        ], name="copied")
    steps = [("compute", "a"), ("compute", "b"), ("free", "a"), ("compute", "v"), ("free", "b"),
             ("compute", "c"), ("free", "v")]
    peaks = {c: simulate(Schedule.from_list(graph(c), steps), CostModel(fused_memory=True)).peak_bytes
             for c in (False, True)}
    # a view: x, w, b (in a's storage) and c; a copy: x, w, b and v, though b dies at v
    assert peaks == {False: 3 * W + 16, True: 4 * W}


def test_a_scatter_aten_runs_is_allocated_before_the_kernel_group_s_frees():
    """ATen's scatter writes into a copy of its first input that the kernel before it makes,
    so its output is allocated while what died in that kernel group is not yet freed."""
    def graph(into_copy):
        return Graph([
            _t("x", "placeholder", (), "input", role="input"),
            _t("w", "placeholder", (), "input", role="param"),
            _t("i", "placeholder", (), "input", role="input"),
            _t("a", "mm", ("x", "w"), "compute", nbytes=2 * W),
            _t("b", "sin", ("a",), "pointwise"),
            _t("z", "full", (), "pointwise", nbytes=4 * W),
            _t("s", "scatter_add.default", ("z", "i", "b"), "other", nbytes=4 * W, is_output=True,
               meta={"scatters_into_copy": True} if into_copy else {}),
        ], name="scatter", meta={"device": {"type": "cpu"}, "compiler": "inductor"})
    steps = [("compute", "a"), ("compute", "b"), ("free", "a"), ("compute", "z"), ("compute", "s"),
             ("free", "b"), ("free", "z")]
    peaks = {c: simulate(Schedule.from_list(graph(c), steps), CostModel(fused_memory=True)).peak_bytes
             for c in (False, True)}
    # x, w, i and b throughout; a (2 W) until the group's frees; the scatter's output (4 W)
    assert peaks == {False: 8 * W, True: 10 * W}


def test_nothing_is_written_in_place_into_what_aten_scattered_into():
    """Inductor's buffer of a scatter ATen runs in place has a mutation layout, which its
    in-place reuse never takes: a pointwise reader of the scatter's output, the last to read
    it, gets a buffer of its own (a VGG backward's ReLU gradient beside its max-pool gradient;
    the least-memory plan measured 39% above a prediction that wrote it in place)."""
    def graph(into_copy):
        return Graph([
            _t("x", "placeholder", (), "input", role="input"),
            _t("w", "placeholder", (), "input", role="param"),
            _t("i", "placeholder", (), "input", role="input"),
            _t("z", "full", (), "pointwise"),
            _t("s", "scatter_add.default", ("z", "i", "x"), "other",
               meta={"scatters_into_copy": True} if into_copy else {}),
            _t("r", "relu", ("s",), "pointwise"),
            _t("c", "mm", ("r", "w"), "compute", nbytes=16, is_output=True),
        ], name="scatter_read", meta={"device": {"type": "cpu"}, "compiler": "inductor"})
    steps = [("compute", "z"), ("compute", "s"), ("free", "z"), ("compute", "r"), ("free", "s"),
             ("compute", "c"), ("free", "r")]
    peaks = {c: simulate(Schedule.from_list(graph(c), steps), CostModel(fused_memory=True)).peak_bytes
             for c in (False, True)}
    # x, w and i throughout; the scatter's output; the ReLU in its storage, or beside it
    assert peaks == {False: 4 * W + 16, True: 5 * W}


@pytest.mark.parametrize("threads, marked", [(1, False), (2, True)])
def test_capture_marks_a_max_pool_backward_s_scatter_aten_runs(threads, marked):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 2))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = remat.plan(lambda x: model(x).sum(), torch.randn(2, 3, 8, 8), cache=False).graph
    finally:
        torch.set_num_threads(before)
    scatters = [n for n in g.nodes if n.op.startswith("scatter")]
    assert scatters
    assert all(bool(n.meta.get("scatters_into_copy")) is marked for n in scatters)
    views = {g[v].meta["alias_of"]: g[v] for n in scatters for v in n.inputs if g[v].op.startswith("view")}
    # the index, channels-last like the pooled activation, is copied on two threads; the
    # source, the flattened linear layer's gradient, is contiguous: a view even for ATen
    (index,) = [v for base, v in views.items() if "offsets_to_indices" in base]
    (source,) = [v for base, v in views.items() if base.startswith("mm")]
    assert bool(index.meta.get("copied_view")) is marked
    assert not source.meta.get("copied_view")
