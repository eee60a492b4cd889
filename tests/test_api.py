"""The public API as a new user meets it: errors caught by their class around a training step,
keyword inputs, every option checked, budgets read strictly, plans that print usefully and
round-trip through JSON with their schedule, and compile caches left on."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import remat
from remat.graph.examples import cos_cos_graph
from remat.plans import Decision, Plan, simulate
from remat.plans.budget import Budget
from remat.zoo.mlp import MLP
from remat.zoo.patterns import f1
from remat.zoo.transformers_models import gpt2_tiny


def test_an_infeasible_budget_is_caught_by_its_class_around_the_training_step():
    step = remat.compile(MLP(), budget="1KiB", compiler="eager")
    with pytest.raises(remat.InfeasibleBudgetError) as e:
        step(torch.randn(16, 32)).sum().backward()
    assert isinstance(e.value, remat.RematError)
    assert "smallest feasible budget found is" in str(e.value)
    assert "functools.partial" not in str(e.value) and "BackendCompilerFailed" not in str(e.value)
    assert e.value.smallest_feasible > 1024
    assert e.value.plan is not None and not e.value.plan.feasible


def test_strict_errors_are_caught_by_their_class():
    def with_cond(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)) * 2

    with pytest.raises(remat.UnsupportedGraphError, match="higher-order op 'cond'"):
        remat.compile(with_cond, compiler="eager", strict=True)(torch.randn(8, requires_grad=True))


class KeywordModel(nn.Module):
    """A model whose second input is keyword-only: positional binding cannot reach it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, scale=None, shift=None):
        y = self.lin(x)
        if scale is not None:
            y = y * scale
        return y + shift if shift is not None else y


def test_plan_passes_keyword_inputs_to_the_model():
    x = torch.randn(4, 8)
    plain = remat.plan(KeywordModel(), x).graph
    keyed = remat.plan(KeywordModel(), x, scale=torch.randn(4, 8), shift=torch.randn(4, 8)).graph
    assert sum(n.role == "input" for n in keyed) == sum(n.role == "input" for n in plain) + 2
    lm = gpt2_tiny()
    ids = torch.randint(0, 256, (2, 16))
    p = remat.plan(lm, input_ids=ids, labels=ids)  # Hugging Face's calling convention
    outputs = [n for n in p.graph if n.is_output and n.is_forward]
    assert any(n.shape == () for n in outputs), "the loss (labels given by keyword) is an output"


def test_unknown_options_raise_and_name_the_valid_ones():
    with pytest.raises(remat.OptionError, match="unknown option 'foo'.*remat's options: solver, budget"):
        remat.compile(MLP(), foo=1)
    with pytest.raises(TypeError):  # OptionError is a ValueError, and remat.compile's TypeError stays Python's
        remat.compile(MLP(), "auto")
    with pytest.raises(remat.OptionError, match="has no option .warp.; its options: mip_gap, threads"):
        remat.compile(MLP(), solver="checkmate", budget=0.8, solver_options={"warp": 9})
    with pytest.raises(remat.OptionError, match="unknown torch.compile mode"):
        remat.compile(MLP(), mode="ludicrous")
    with pytest.raises(remat.OptionError, match="solver='mincut-aggressive'"):
        remat.compile(MLP(), mode="aggressive")  # remat's old mode option
    with pytest.raises(remat.OptionError, match="neither one of remat's"):
        remat.compile(MLP(), options={"not_an_inductor_option": 1})
    with pytest.raises(remat.OptionError, match="time_limit -1 must be"):
        remat.compile(MLP(), time_limit=-1)
    with pytest.raises(remat.OptionError, match="unknown solver 'mincut' \\(did you mean"):
        remat.compile(MLP(), solver="mincut")
    x = torch.randn(16, 32)
    with pytest.raises(remat.OptionError, match="unknown option 'solvr'"):
        torch.compile(MLP(), backend="remat", options={"solvr": "auto", "compiler": "eager"})(x)
    with pytest.raises(remat.OptionError, match="offload, bandwidth, max_overhead; torch") as e:
        remat.compile(MLP(), max_overheads=0.1)  # the documented options, not internal fields
    assert "plans_for" not in str(e.value)


def test_one_compile_reads_the_budget_and_checks_the_options_once(monkeypatch):
    """One request object (remat.solvers.request.Request), made at the API and passed down:
    the partitioner, the plan cache's key and the registry's solve do not read the budget or
    check the options again (issue 29: 4 and 3 times before)."""
    from remat.solvers import registry

    counts = {"parse": 0, "check": 0}
    parse, check = Budget.parse.__func__, registry.check_options

    def counted_parse(cls, budget):
        counts["parse"] += not isinstance(budget, Budget)
        return parse(cls, budget)

    def counted_check(*args, **kwargs):
        counts["check"] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(Budget, "parse", classmethod(counted_parse))
    monkeypatch.setattr(registry, "check_options", counted_check)
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    remat.plan(f1, *[torch.randn(64, requires_grad=True) for _ in range(4)], budget=0.9,
               solver="mincut-aggressive")
    assert counts == {"parse": 1, "check": 1}
    counts.update(parse=0, check=0)
    remat.solve(cos_cos_graph(), "checkmate", budget="90%")
    assert counts == {"parse": 1, "check": 1}


def test_compile_forwards_solver_options_and_torch_compile_arguments():
    plans = []
    torch.manual_seed(0)
    xs = [torch.randn(64, requires_grad=True) for _ in range(4)]
    step = remat.compile(f1, solver="checkmate", budget=1.0, solver_options={"threads": 1, "mip_gap": 0.0},
                         compiler="eager", fullgraph=True, dynamic=False,
                         on_plan=lambda g, p: plans.append(p))
    step(*xs).sum().backward()
    (p,) = plans
    assert p.solver == "checkmate" and p.feasible and p.options["budget"] == "1.0"
    # torch.compile's own mode reaches inductor, not remat
    step = remat.compile(f1, mode="max-autotune-no-cudagraphs", compiler="eager", on_plan=lambda g, p: plans.append(p))
    step(*xs).sum().backward()
    # no budget: the min cut, or a frontier plan no larger and clearly faster
    assert "budget" not in plans[-1].options and plans[-1].solver in ("mincut-conservative", "frontier")


@pytest.mark.parametrize("budget", [1.5, "1.5", "abc", -1, 0, True, "150%", float("nan")])
def test_budgets_that_are_neither_a_fraction_nor_bytes_are_refused(budget):
    with pytest.raises(remat.BudgetError):
        Budget.parse(budget)
    with pytest.raises(ValueError):
        remat.compile(MLP(), budget=budget)


def test_budgets_read_as_users_write_them():
    assert (Budget.parse(0.6).kind, Budget.parse(0.6).value) == ("fraction", 0.6)
    assert Budget.parse("60%").value == pytest.approx(0.6)
    assert Budget.parse(1).kind == "fraction"
    assert (Budget.parse("6GiB").kind, Budget.parse("6GiB").value) == ("bytes", 6 * 2**30)
    assert Budget.parse(6e9).value == 6e9 and Budget.parse("1e9").kind == "bytes"
    assert Budget.parse("1.5GiB").value == 1.5 * 2**30


def test_print_plan_on_a_real_model_names_modules_and_keeps_params_apart():
    lm = gpt2_tiny()
    ids = torch.randint(0, 256, (2, 16))
    p = remat.plan(lm, input_ids=ids, labels=ids)
    text = str(p)
    assert p.graph_name.startswith("GPT2LMHeadModel_")
    assert "transformer.h.1.mlp.c_fc" in text and "saved for the backward:" in text
    assert "inputs and parameters, held anyway" in text
    listed = {line.split()[0] for line in text.splitlines() if line.startswith("    ")}
    params = {s.name for s in p.saved if s.role != "activation"}
    assert params and not listed & params
    assert {s.module for s in p.saved_activations if s.module} >= {"transformer.h.0.attn", "lm_head"}


def test_each_graph_of_a_step_has_a_distinct_name():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            x = self.a(x).relu()
            torch._dynamo.graph_break()
            return self.b(x).tanh()

    plans = remat.plan_all(Broken(), torch.randn(4, 8))
    names = [p.graph_name for p in plans]
    assert len(names) == 2 and len(set(names)) == 2 and all(n.startswith("Broken_") for n in names)


def test_plan_round_trips_through_json_with_its_schedule():
    g = cos_cos_graph()
    for plan in (remat.solve(g), remat.solve(g, "checkmate", budget=0.9), remat.solve(g, "chen-greedy", budget=1.0)):
        d = json.loads(plan.to_json())
        back = Plan.from_dict(d, graph=g)
        assert back.to_dict() == plan.to_dict()
        assert back.statements == plan.statements and back.decisions == plan.decisions
        assert simulate(back.schedule()).peak_bytes == plan.peak_bytes
    with pytest.raises(remat.PlanError, match="version"):
        Plan.from_dict({**d, "version": 1})
    with pytest.raises(remat.PlanError, match="needs the graph|load the graph"):
        Plan.from_dict(d).schedule()


def test_a_plan_is_frozen_and_reported_on_a_copy():
    """A plan, judged or not, is frozen once made: assigning a field or editing its options or
    details raises; Plan.updated and Plan.judge make new plans."""
    import dataclasses

    unjudged = Plan.from_saved_set(cos_cos_graph(), ["add_2"], solver="example")
    with pytest.raises(dataclasses.FrozenInstanceError):
        unjudged.budget = 1
    with pytest.raises(TypeError, match="read-only"):
        unjudged.decisions["add_2"] = Decision.RECOMPUTE
    plan = remat.solve(cos_cos_graph(), "checkmate", budget=0.9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.status = "optimal"
    judged = plan.judge(1)  # a new plan, over a budget of 1 byte; this one as it was
    assert judged is not plan and judged.status == remat.PlanStatus.OVER_BUDGET
    with pytest.raises(dataclasses.FrozenInstanceError):
        judged.feasible = True
    assert plan.feasible and plan.status in ("optimal", "feasible")
    with pytest.raises(TypeError, match="read-only"):
        plan.details["note"] = "hit"
    with pytest.raises(TypeError, match="read-only"):
        plan.options.update(budget="1.0")
    again = plan.updated(options={"step_graph": 1}, details={"note": "hit"})
    assert again is not plan
    with pytest.raises(TypeError, match="read-only"):
        again.details["note"] = "miss"
    assert again.options == {**plan.options, "step_graph": 1} and "step_graph" not in plan.options
    assert "note" not in plan.details and again.statements == plan.statements
    assert json.loads(again.to_json())["details"]["note"] == "hit"
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.cache = "hit"


def test_what_the_layers_around_a_solver_report_is_typed_not_in_details():
    """The plan cache, the fallback and PyTorch's offloading report in fields of their own
    (version 5); a version-4 plan that kept them in ``details`` reads them into the fields, and
    a key of ``details`` that is now a field sets the field, not the bag."""
    plan = remat.solve(cos_cos_graph(), "mincut-aggressive")
    assert (plan.cache, plan.cache_file, plan.fallback, plan.transfers) == (None, None, None, None)
    d = plan.to_dict()
    assert d["version"] == 5
    d.update(version=4, details={**d["details"], "cache": "hit", "cache_file": "/x.json",
                                 "fallback": "PlanError: no", "transfers": 3})
    for k in ("cache", "cache_file", "fallback", "transfers"):
        d.pop(k)
    old = Plan.from_dict(d)
    assert (old.cache, old.cache_file, old.fallback, old.transfers) == ("hit", "/x.json", "PlanError: no", 3)
    assert not set(old.details) & {"cache", "cache_file", "fallback", "transfers"}
    assert "fell back to PyTorch's partitioner: remat could not plan this graph (PlanError: no)" in old.summary()
    hit = old.updated(details={"cache": "miss", "note": 1})
    assert hit.cache == "miss" and dict(hit.details) == {**old.details, "note": 1}
    with pytest.raises(ValueError, match="'hit', 'miss', 'off'"):
        plan.updated(cache="warm")


def test_plans_of_versions_2_and_3_read_their_typed_fields_from_details():
    """Before version 3 a plan's fissions, swaps and link rode in ``details``, before version 4
    its attempts, out_of_reach, instead_of and time bound: such plans read back with them as the typed
    fields, and write version 4."""
    from remat.cost.transfer import Link
    from remat.plans.outcome import Attempt, OutOfReach, TimeBound

    d = remat.solve(cos_cos_graph(), "mincut-aggressive").to_dict()
    link = {"bandwidth": 2e9, "asynchronous": True, "latency": 1e-6, "source": "given"}
    typed = ("fissions", "swaps", "link", "tried", "out_of_reach", "instead_of")
    old = {k: v for k, v in d.items() if k not in typed}
    old.update(version=2, details={**d["details"], "swaps": 3, "link": link, "fissions": []})
    back = Plan.from_dict(old, graph=cos_cos_graph())
    assert (back.swaps, back.link, back.fissions) == (3, Link(2e9, True, 1e-6, "given"), ())
    assert not {"swaps", "link", "fissions"} & set(back.details)
    out = back.to_dict()
    assert out["version"] == 5 and out["swaps"] == 3 and out["link"] == link
    tried = [{"solver": "descent", "status": "over_budget", "peak_bytes": 600, "predicted_seconds": 9.0,
              "compute_cost": 9.0, "message": "over"}]
    reach = {"message": "out of reach", "smallest_feasible": 500}
    bound = {"max_overhead": 1.0, "seconds": 2.5, "default_peak_bytes": 700}
    v3 = {**old, "version": 3, "details": {**d["details"], "tried": tried, "out_of_reach": reach,
                                           "instead_of": "griewank", "overhead": bound,
                                           "within_overhead": False}}
    back = Plan.from_dict(v3, graph=cos_cos_graph())
    assert back.tried == (Attempt("descent", "over_budget", 600, 9.0, 9.0, "over"),)
    assert back.out_of_reach == OutOfReach("out of reach", 500) and back.instead_of == "griewank"
    assert back.time_bound == TimeBound(1.0, 2.5, False, 700)
    assert not set(typed) & set(back.details) and not {"overhead", "within_overhead"} & set(back.details)
    again = Plan.from_dict(back.to_dict(), graph=cos_cos_graph())
    assert (again.tried, again.out_of_reach, again.instead_of, again.time_bound) == \
        (back.tried, back.out_of_reach, "griewank", back.time_bound)


def test_decisions_mirror_the_schedule():
    """Every forward value the backward uses is saved or recomputed; the schedule says the same:
    a saved value is computed once, before the backward; a recomputed one again after."""
    g = cos_cos_graph()
    for plan in (remat.solve(g), remat.solve(g, "mincut-aggressive"), remat.solve(g, "checkmate", budget=0.9)):
        saved = {s.name for s in plan.saved_activations}
        assert {n for n, d in plan.decisions.items() if d is Decision.SAVE} == saved
        assert {n for n, d in plan.decisions.items() if d is Decision.RECOMPUTE} == \
            set(plan.recomputed) | set(plan.moved_to_backward)
        counts = plan.schedule().compute_counts()
        assert all(counts[n] == 1 for n in saved)
        assert all(counts[n] == 2 for n in plan.recomputed)


def test_every_solver_s_plan_is_judged_by_the_simulator():
    g = cos_cos_graph()
    for name in remat.solvers.names(graphs=True):
        budget = None if remat.solvers.info(name).budget == "none" else 1.0
        p = remat.solve(g, name, budget=budget)
        sim = simulate(p.schedule())
        assert sim.valid and p.peak_bytes == sim.peak_bytes and p.feasible, name
        if budget is not None:
            assert p.peak_bytes <= p.budget, name


@pytest.mark.inductor
@pytest.mark.inductor
def test_planning_with_a_callback_keeps_the_compile_caches(tmp_path):
    """on_plan no longer stops inductor and AOTAutograd from caching: the first process saves
    the compiled step, the second loads it (and, planning nothing, calls no callback)."""
    code = ("import torch, remat\n"
            "from torch._dynamo.utils import counters\n"
            "plans = []\n"
            "f = remat.compile(lambda x: x.cos().cos(), on_plan=lambda g, p: plans.append(p))\n"
            "f(torch.randn(64, requires_grad=True)).sum().backward()\n"
            "print(len(plans), dict(counters['aot_autograd']))\n")
    env = {k: v for k, v in os.environ.items() if k not in (
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert "Failed to pickle cache key" not in r.stderr
    first, second = (r.stdout.strip().splitlines()[-1] for r in runs)
    assert first.startswith("1 ") and "autograd_cache_saved" in first
    assert second.startswith("0 ") and "autograd_cache_hit" in second


def test_outputs_dropped_reaches_the_memory_model_and_a_wrong_value_is_refused():
    """``outputs="dropped"`` marks every graph remat plans (its memory model frees the step's
    outputs as the forward returns); anything but kept or dropped names both."""
    with pytest.raises(remat.errors.OptionError, match="'kept'.*'dropped'"):
        remat.compile(torch.nn.Linear(4, 4), outputs="held")
    plans = []
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    fn = remat.compile(model, compiler="eager", cache=False, outputs="dropped",
                       on_plan=lambda g, p: plans.append(p))
    fn(torch.randn(4, 8)).sum().backward()
    assert plans and plans[0].graph.meta.get("outputs") == "dropped"


def test_the_unknown_option_error_lists_exactly_the_documented_options():
    """Issue 30: the list an unknown keyword gets is the docstring's (``- ``name``: ...``
    items, and torch.compile's own), and is compile's signature less ``model``."""
    import inspect
    import re

    documented = re.findall(r"^    - ``(\w+)[`(]", remat.compile.__doc__, flags=re.M)
    with pytest.raises(remat.OptionError) as e:
        remat.compile(MLP(), not_an_option=1)
    m = re.search(r"remat's options: ([\w, ]+); torch.compile's: ([\w, ]+)$", str(e.value))
    ours, theirs = m.group(1).split(", "), m.group(2).split(", ")
    assert sorted(ours) == sorted(documented)
    params = [p for p in inspect.signature(remat.compile).parameters if p not in ("model", "unknown")]
    assert sorted(ours + theirs) == sorted(params)


def test_a_plan_s_status_is_a_closed_set_and_its_verdict_one_value():
    """A plan's status is a PlanStatus (strings name one; an unknown one is refused, naming the
    statuses); the simulator's verdict and the solver's report are typed values, and survive
    the JSON round trip."""
    from remat.errors import PlanError
    from remat.plans import Plan, PlanStatus, Verdict

    g = cos_cos_graph()
    raw = Plan.from_saved_set(g, ["add_2"], solver="example")
    assert raw.verdict is None and raw.status is PlanStatus.FEASIBLE
    p = raw.judge(100)
    assert raw.verdict is None  # judging made a new plan
    assert p.status is PlanStatus.OVER_BUDGET and not p.feasible and f"{p.status}" == "over_budget"
    assert p.verdict == Verdict(True, False, p.peak_bytes, p.compute_cost, p.predicted_seconds, p.recomputes, 100)
    fits = p.judge(p.peak_bytes)
    assert fits.verdict.feasible and fits.status is PlanStatus.FEASIBLE and fits.report.solver == "example"
    back = Plan.from_dict(json.loads(fits.to_json()), g)
    assert back.status is PlanStatus.FEASIBLE and json.loads(fits.to_json())["status"] == "feasible"
    with pytest.raises(PlanError, match="unknown plan status 'done'; statuses: optimal, feasible"):
        Plan.without_schedule(g, solver="example", status="done")
