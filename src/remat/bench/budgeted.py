"""One budgeted training step, measured: ``remat.compile(model, budget=B)`` against eager.

:func:`budgeted_step` puts the budget at ``where`` between the smallest feasible budget remat
finds cheaply and the no-recomputation peak, compiles a copy of the model with it, runs one
step beside an eager copy, and measures the step's peak memory (profiler allocation records
on CPU, the CUDA allocator on a GPU) next to the simulator's prediction for the plan. Used
by ``tests/test_budget_torch.py`` (assertions) and ``benchmarks/budget_torch.py`` (a table).

>>> import torch
>>> from remat.zoo.cnn import ConvBN
>>> r = budgeted_step(ConvBN(), (torch.randn(4, 3, 16, 16),), "chen-greedy", 0.5)
>>> r.sim.peak_bytes <= r.plan.options["planned_bytes"] < r.budget
True
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ..api import compile as remat_compile
from ..api import plan as remat_plan
from ..errors import RematError
from ..plans.budget import reference_peak
from ..solvers import solve
from ..solvers.feasible import smallest_feasible
from ..plans.simulator import SimResult, simulate
from .measure import gradient_bytes, peak_memory


def scalar_loss(out: torch.Tensor) -> torch.Tensor:
    """The output itself when it is a loss (a scalar), else the sum of its squares."""
    return out if out.dim() == 0 else out.float().pow(2).sum()


@dataclass
class BudgetedStep:
    low: int  # smallest feasible budget found cheaply (bytes)
    high: int  # no-recomputation peak (bytes)
    budget: int
    plan: object  # the remat.plans.Plan of the step's graph
    sim: SimResult = field(repr=False)
    measured_total: int  # resident before the step + the step's measured peak
    measured: int  # the step's measured peak above its start
    predicted: int  # the simulator's peak above the step's start
    grads: list[tuple[str, torch.Tensor, torch.Tensor]] = field(repr=False)  # name, remat, eager

    @property
    def grad_error(self) -> float:
        return max((float((a - b).abs().max()) for _, a, b in self.grads), default=0.0)


def budgeted_step(model: torch.nn.Module, inputs: tuple, solver: str, where: float, *,
                  time_limit: float = 20.0, strict: bool = True, device="cpu",
                  budget: int | None = None, compiler: str = "eager") -> BudgetedStep:
    """Compile a copy of ``model`` with a budget at ``where`` in [smallest feasible,
    no-recomputation peak] (``compiler="eager"``, or ``"inductor"`` for real kernels), run
    one step and measure it. The budget
    is in bytes, so remat plans within it less :data:`remat.plans.budget.TORCH_HEADROOM`: at
    ``where`` near 0 that can be infeasible (``InfeasibleBudgetError``). ``budget`` (bytes)
    replaces ``where``."""
    reference = copy.deepcopy(model)
    scalar_loss(reference(*inputs)).backward()
    g = remat_plan(copy.deepcopy(model), *inputs, for_compiler=compiler).graph
    if solver == "auto":  # what auto reaches for this compiler (under inductor: saved sets)
        low = solve(g, "auto", budget="min", time_limit=time_limit).peak_bytes
    else:
        low, _ = smallest_feasible(g)
    high = reference_peak(g)
    if budget is None:
        budget = int(low + where * (high - low))

    plans = []
    test_model = copy.deepcopy(model)
    compiled = remat_compile(test_model, compiler=compiler, budget=budget, solver=solver,
                                  time_limit=time_limit, strict=strict,
                                  on_plan=lambda g, p: plans.append(p))

    def step():
        for p in test_model.parameters():
            p.grad = None
        scalar_loss(compiled(*inputs)).backward()

    step()
    grads = [(k, p.grad, q.grad) for (k, p), q in zip(test_model.named_parameters(),
                                                      reference.parameters())]
    if len(plans) != 1:
        raise RematError(f"budgeted_step measures a step of one graph that remat planned; {solver} "
                         f"planned {len(plans)} (none: remat fell back to PyTorch's partitioner, "
                         "strict=True says why; several: graph breaks)")
    (plan,) = plans
    sim = simulate(plan.schedule())
    held = list(test_model.parameters()) + [t for t in inputs if isinstance(t, torch.Tensor)]
    measured = peak_memory(step, device, held=held)
    predicted = sim.peak_bytes - sim.constant_bytes - gradient_bytes(plan.graph)
    return BudgetedStep(low, high, budget, plan, sim, measured.resident_before + measured.peak_bytes,
                        measured.peak_bytes, predicted, grads)
