"""Lowering a plan's schedule to the forward and backward fx modules."""

import pytest
import torch

from remat.capture import joint as tc
from remat.capture.to_graph import graph_from_joint
from remat.lower.backend import _eager_compile
from remat.lower.fx import lower
from remat.lower.options import Options
from remat.lower.partitioner import RematPartitioner
from remat.plans.phases import split_schedule
from remat.plans.plan import Plan
from remat.solvers import solve
from remat.zoo.cnn import ConvBN
from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny


def _captured_joint(model, *inputs):
    """The joint graph (and partitioner arguments) inductor hands the partitioner."""
    grabbed = {}

    class Grab(RematPartitioner):
        def __call__(self, gm, joint_inputs, **kwargs):
            grabbed["gm"], grabbed["kwargs"] = tc.copy_joint(gm), dict(kwargs)
            return tc.torch_mincut(gm, joint_inputs, **kwargs)

    grab = Grab(Options.create(solver="torch-mincut"))
    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, ex: _eager_compile(gm, ex, grab))(*inputs)
    kwargs = grabbed["kwargs"]
    return tc.prepare_joint(grabbed["gm"], kwargs["num_fwd_outputs"],
                            kwargs.get("static_lifetime_input_indices"))


def _body(gm):
    return [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


@pytest.mark.parametrize("solver", ["mincut-conservative", "mincut-aggressive"])
@pytest.mark.parametrize("case", ["gpt2", "cnn-batchnorm"])
def test_saved_set_schedule_runs_the_backward_in_pytorchs_order(case, solver):
    """A saved-set plan's schedule orders the backward as PyTorch's partitioner does (the
    autograd-engine order), so lowering runs what the simulator priced without moving nodes."""
    torch.manual_seed(0)
    if case == "gpt2":
        model, inputs = GPT2Loss(gpt2_tiny()), (torch.randint(0, 256, (2, 16)),)
    else:
        model, inputs = ConvBN(), (torch.randn(4, 3, 16, 16),)
    joint = _captured_joint(model, *inputs)
    plan = solve(graph_from_joint(joint), solver)
    by_name = {n.name: n for n in joint.gm.graph.nodes}
    _, torch_bw = tc.partition_with_saved(joint, [by_name[s] for s in plan.saved_names])
    fw, bw = lower(joint, plan)
    assert _body(bw) == _body(torch_bw)
    scheduled = [s.node for s in split_schedule(plan.schedule()).backward if s.op == "compute"]
    body = set(_body(bw))
    assert [c for c in scheduled if c in body] == _body(bw)
    received = [p.name for p in bw.graph.find_nodes(op="placeholder") if not tc.is_tangent_like(p)]
    assert set(received) == set(plan.saved_names)


class _TanhHead(torch.nn.Module):
    """Returns a value its backward reads (tanh's gradient reads its output) and a loss."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 32)

    def forward(self, x):
        y = self.lin(x).tanh()
        return y, y.sum()


def test_the_backward_reads_an_output_the_plan_leaves_unsaved_instead_of_computing_it_again():
    """A schedule keeps the step's outputs to the end, so its backward reads ``tanh`` from the
    forward. The lowered backward must receive it too: computed again, the matmul and the tanh
    would run twice and the copy would sit beside the caller's (an OPT's logits: 0.7% above
    the plan's prediction)."""
    torch.manual_seed(0)
    joint = _captured_joint(_TanhHead(), torch.randn(8, 16))
    g = graph_from_joint(joint)
    plan = Plan.from_saved_set(g, ["primals_1", "primals_2", "primals_3"], solver="test")
    assert "tanh" not in plan.saved_names and g["tanh"].is_output
    scheduled = [s.node for s in split_schedule(plan.schedule()).backward if s.op == "compute"]
    assert "tanh" not in scheduled and "addmm" not in scheduled  # the schedule reads it
    _, bw = lower(joint, plan)
    received = {p.name for p in bw.graph.find_nodes(op="placeholder")}
    assert "tanh" in received
    assert not {"addmm", "tanh"} & set(_body(bw))
