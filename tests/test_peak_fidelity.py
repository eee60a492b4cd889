"""The simulator's peak is never below the measured one, and within 10% of it (issue 30, item 3).

Each case compiles a model with one solver (``solver@budget``) under remat's eager compiler,
runs a training step (gradients zeroed in place) and compares the step's measured peak above
its start (the profiler's allocation records) with the plans' prediction
(``plan.peak_bytes - resident_bytes(graph)``): ``benchmarks/peak_fidelity.py``'s measurement,
in a few seconds per case. Found so far: a tuple's items allocated at their getitems instead
of at the op (:mod:`remat.plans.simulator.tuples`), the eager temporaries of ``fma`` and
``_unsafe_masked_index_put_accumulate`` (:data:`remat.cost.model.EAGER_TEMPORARIES`) and the
loss's gradient, which autograd holds to the step's end.
"""

from __future__ import annotations

import copy

import pytest

import remat
from remat.bench import harness
from remat.plans.budget import resident_bytes
from remat.plans.plan import Plan
from remat.plans.schedule import Schedule, Statement
from remat.plans.simulator import simulate
from remat.zoo import registry
from remat.zoo.trials import loss_case as _case, make_step

TOLERANCE = 0.10
TORCH_TOLERANCE = 0.05
"""PyTorch's own partition (what plain ``torch.compile`` runs) is the reference of fractional
budgets: its prediction within 5%."""


def predicted_and_measured(model, inputs, loss, solver: str, compiler: str = "eager", **kw) -> tuple[int, int]:
    """(predicted, measured) peak bytes above the step's start, the plans' and the profiler's."""
    plans: list = []
    fn = remat.compile(model, solver=solver, compiler=compiler, cache=False, dynamic=False, strict=True,
                       time_limit=10, on_plan=lambda g, p: plans.append(p), **kw)
    step = make_step(lambda *xs: loss(fn(*xs)), model, inputs, "keep")
    step()
    measured = harness.measure_peak(step, keep=harness.held(model, inputs))
    assert plans
    return sum(int(p.peak_bytes) - resident_bytes(p.graph) for p in plans), measured


CASES = [
    ("zoo:mlp", "auto"),
    ("zoo:mlp", "auto@min"),
    ("cnn", "torch-mincut"),
    ("cnn", "mincut-aggressive"),
    ("cnn", "auto@0.8"),
    ("gpt2", "torch-mincut"),
    ("gpt2", "auto@0.8"),
    ("zoo:resnet18", "mincut-aggressive"),
]


@pytest.mark.parametrize("name,plan", CASES, ids=[f"{m}-{p}" for m, p in CASES])
def test_predicted_peak_bounds_the_measured_one(name, plan):
    model, inputs, loss = _case(name)
    solver, _, budget = plan.partition("@")
    kw = {} if not budget else {"budget": budget if budget == "min" else float(budget)}
    predicted, measured = predicted_and_measured(copy.deepcopy(model), inputs, loss, solver, **kw)
    tolerance = TORCH_TOLERANCE if solver == "torch-mincut" else TOLERANCE
    assert measured <= predicted <= (1 + tolerance) * measured, (
        f"{name} {plan}: predicted {predicted} bytes above the step's start, measured {measured}")


@pytest.mark.inductor
def test_torch_partition_predicted_under_inductor():
    """PyTorch's min-cut partition of the zoo's MLP compiled by inductor (a compile of a few
    seconds): within 5% of its measured peak, and not below it."""
    model, inputs, loss = _case("zoo:mlp")
    predicted, measured = predicted_and_measured(copy.deepcopy(model), inputs, loss, "torch-mincut", "inductor")
    assert measured <= predicted <= (1 + TORCH_TOLERANCE) * measured, (predicted, measured)


# -- a tuple's items: allocated by the op, whenever their getitems run ------------------------------

def _late_items(g, *, budget=None, cost_model=None, time_limit=None) -> Plan:
    """The conservative min cut's schedule with the weight gradient of the first convolution
    backward taken from its tuple only at the end of the step (MAGIS's re-ordering moved
    ResNet-18's so, and the plan measured 22% over its prediction)."""
    from remat.solvers import solve

    st = list(solve(g, "mincut-conservative").schedule().statements)
    ops = {s.node: g[s.node] for s in st}
    conv = next(s.node for s in st if s.op == "compute" and ops[s.node].op.startswith("convolution_backward"))
    read = {v for n in g.nodes for v in n.inputs}
    items = [s.node for s in st if s.op == "compute" and tuple(ops[s.node].inputs) == (conv,)
             and s.node not in read]  # the parameter gradients: nothing reads them
    late = max(items, key=lambda v: g[v].bytes)
    moved = [Statement("compute", late), Statement("free", conv)]
    st = [s for s in st if s not in moved] + moved
    return Plan.from_schedule(Schedule(g, st), solver="late-items")


@pytest.fixture
def late_items_solver():
    from remat.solvers import registry as reg

    reg.register("late-items", "baselines", "none", "test: a tuple's item taken at the end", _late_items)
    yield "late-items"
    reg._REGISTRY.pop("late-items", None)


def test_tuple_items_count_from_their_op(late_items_solver):
    """ResNet-18 tiny's step with its first convolution backward's weight gradient taken from
    the tuple only at the step's end: the op allocated it, so it is resident from there on
    (the simulator put this plan at 355,004 bytes, measured 422,820)."""
    model, inputs, loss = _case("zoo:resnet18")
    predicted, measured = predicted_and_measured(copy.deepcopy(model), inputs, loss, late_items_solver)
    assert measured <= predicted <= (1 + TOLERANCE) * measured, f"predicted {predicted}, measured {measured}"


def test_simulators_agree_on_tuple_items():
    """The vectorised simulator (eager graphs) and the replay count a tuple's items alike."""
    from remat.cost.model import default_cost_model
    from remat.cost.transfer import Link
    from remat.plans.simulator.replay import replay
    from remat.plans.simulator.state import Replay

    case = registry.build("resnet18", "tiny")
    g = remat.plan(case.model, *case.inputs, solver="mincut-conservative", cache=False, for_compiler="eager").graph
    s = _late_items(g).schedule()
    fast = simulate(s)
    slow = replay(s, Replay(s, default_cost_model(g), Link(float("inf")), timeline=True, kernel_groups=True,
                            copies=False))
    assert fast.valid and slow.valid
    assert (fast.peak_bytes, fast.timeline, fast.end_bytes) == (slow.peak_bytes, slow.timeline, slow.end_bytes)


# -- PyTorch's partition runs in inductor's order -------------------------------------------------

def test_torch_partition_judged_in_inductor_order():
    """GPT-2 quick ties its embeddings: inductor computes the LM head's weight gradient where it
    is added to the embedding's, at the end of the backward, with the logits' gradient alive
    until then. The simulator judges PyTorch's partition in that order (remat's own plans keep
    theirs, :func:`remat.lower.plan_order.split_late_addmm`)."""
    from remat.plans.simulator.torch_order import in_inductor_order, late_products

    model, inputs, _ = _case("gpt2")
    p = remat.plan(model, *inputs, solver="torch-mincut", for_compiler="inductor", cache=False)
    pairs = late_products(p.graph)
    assert pairs
    moved = in_inductor_order(p.schedule()).statements
    computes = [s.node for s in moved if s.op == "compute"]
    for mm, add in pairs.items():
        assert computes.index(add) == computes.index(mm) + 1
    as_planned = simulate(Schedule(p.graph, list(p.schedule().statements)))  # no solver: the plan's order
    assert p.peak_bytes == simulate(p.schedule()).peak_bytes > as_planned.peak_bytes


@pytest.mark.slow
@pytest.mark.inductor
def test_torch_partition_of_tied_embeddings_under_inductor():
    """The measured side of the test above (a 20 s compile): GPT-2 quick's partition by PyTorch
    was predicted 3.8% under its measured peak before inductor's order was simulated."""
    model, inputs, loss = _case("gpt2")
    predicted, measured = predicted_and_measured(copy.deepcopy(model), inputs, loss, "torch-mincut", "inductor")
    assert measured <= predicted <= (1 + TORCH_TOLERANCE) * measured, (predicted, measured)
