"""A graph remat cannot plan falls back to PyTorch's partitioner with a warning; strict raises."""

import warnings

import pytest
import torch

import remat
from remat.errors import RematFallbackWarning


def with_cond(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)) * 2


def test_unplannable_graph_falls_back_with_warning_and_right_gradients():
    torch.manual_seed(0)
    x = torch.randn(64, requires_grad=True)
    with pytest.warns(RematFallbackWarning, match="higher-order op 'cond'"):
        out = remat.compile(with_cond, compiler="eager")(x)
    out.sum().backward()
    ref = torch.autograd.grad(with_cond(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, ref)


def test_strict_mode_names_the_node_and_reason():
    x = torch.randn(64, requires_grad=True)
    with pytest.raises(Exception, match="node 'cond' calls the higher-order op 'cond'") as info:
        remat.compile(with_cond, compiler="eager", strict=True)(x)
    assert "UnsupportedGraphError" in str(info.value) or isinstance(info.value, remat.UnsupportedGraphError)


# -- a bound is never dropped ----------------------------------------------------------------------
class CondNet(torch.nn.Module):
    """A model remat cannot plan (torch.cond): every graph of it falls back."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.a = torch.nn.Linear(width, width)
        self.b = torch.nn.Linear(width, width)

    def forward(self, x):
        y = self.a(x).relu()
        y = torch.cond(y.sum() > 0, lambda t: t.cos() * 2, lambda t: t.sin(), (y,))
        return self.b(y).tanh().sum()


def _step(model, compiled, x):
    model.zero_grad(set_to_none=True)
    compiled(x).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_a_byte_budget_under_a_fallback_holds_or_is_refused():
    """Before, a byte budget was dropped without a word where remat fell back: '1KiB' ran."""
    from remat.bench.measure import peak_memory

    torch.manual_seed(0)
    model, x = CondNet(), torch.randn(256, 128)
    with pytest.raises(remat.InfeasibleBudgetError, match="could not plan graph .*higher-order op 'cond'") as e:
        remat.compile(model, budget="1KiB", compiler="eager")(x)
    assert "PyTorch's partition" in str(e.value) and e.value.smallest_feasible > 1024
    plans = []
    compiled = remat.compile(model, budget="64MiB", compiler="eager", on_plan=lambda g, p: plans.append(p))
    with pytest.warns(RematFallbackWarning, match="budget '64MiB' holds: PyTorch's partition is predicted"):
        grads = _step(model, compiled, x)
    ref = _step(model, model, x)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r)
    (plan,) = plans
    assert plan.fallback.startswith("UnsupportedGraphError") and plan.solver == "torch-mincut"
    resident = sum(p.numel() * 4 for p in model.parameters()) + x.numel() * 4
    measured = peak_memory(lambda: _step(model, compiled, x)).peak_bytes
    assert resident + measured <= plan.peak_bytes <= 64 * 2**20  # the prediction bounds the step


def test_a_fraction_under_a_fallback_warns_that_it_is_not_applied():
    model, x = CondNet(), torch.randn(64, 128)
    with pytest.warns(RematFallbackWarning, match="Budget '0.5' is not applied to it"):
        remat.compile(model, budget=0.5, compiler="eager")(x).backward()


def test_every_fallback_warns_once_per_graph_and_reason():
    """Before, the warning was issued once per reason text per process: a second model, or
    another budget, fell back without a word."""
    x = torch.randn(64, requires_grad=True)

    def another(x):
        return torch.cond(x.mean() > 0, lambda x: x.exp(), lambda x: x.cos(), (x,)).sum()

    for fn, budget in [(with_cond, None), (with_cond, 0.8), (another, None)]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            compiled = remat.compile(fn, budget=budget, compiler="eager")
            compiled(x).sum().backward()
            compiled(x).sum().backward()  # the same graph again: not warned again
        fallbacks = [w for w in seen if issubclass(w.category, RematFallbackWarning)]
        assert len(fallbacks) == 1, (fn.__name__, budget, [str(w.message) for w in seen])


def test_the_plan_of_a_graph_that_fell_back_says_so():
    model, x = CondNet(), torch.randn(64, 128)
    with pytest.warns(RematFallbackWarning):
        (plan,) = remat.plan_all(model, x, for_compiler="eager")
    text = plan.summary()
    assert "fell back to PyTorch's partitioner" in text and "higher-order op 'cond'" in text
    assert plan.peak_bytes is not None and plan.saved_activations


# -- a solver that finds no plan at any budget ------------------------------------------------------
class Mlp(torch.nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).tanh()
        return x.sum()


@pytest.mark.parametrize("budget, solver_options, reason", [
    (0.5, {"max_columns": 10}, "checkmate-lp cannot plan"),  # too large for the solver at any budget
    ("min", {"max_columns": 10}, "checkmate-lp cannot plan"),
    (0.5, {}, "found no plan of .* at any budget"),  # its time limit runs out before any plan
    ("min", {}, "found no plan of .* at any budget"),
])
def test_a_target_the_asked_solver_cannot_plan_falls_back_instead_of_crashing(budget, solver_options, reason):
    """A fraction or "min" is a target: where the solver the user named finds no plan at any
    budget (a Starcoder2 with ``solver="checkmate-lp", budget=0.5`` raised InfeasibleBudgetError
    "fits the budget of 0 B" from its first step), remat falls back with a warning that says
    why, and the gradients are PyTorch's; strict mode raises."""
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(32, 64)
    expected = _step(model, model, x)
    time_limit = 60 if solver_options else 0
    with pytest.warns(RematFallbackWarning, match=reason):
        compiled = remat.compile(model, solver="checkmate-lp", budget=budget, compiler="eager", cache=False,
                                 time_limit=time_limit, solver_options=solver_options)
        got = _step(model, compiled, x)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch._dynamo.reset()
    with pytest.raises(remat.UnsupportedGraphError, match=reason):
        remat.compile(model, solver="checkmate-lp", budget=budget, compiler="eager", cache=False,
                      time_limit=time_limit, solver_options=solver_options, strict=True)(x)
