"""The public entry points: :func:`compile`, :func:`plan` and the ``"remat"`` dynamo backend."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch

from .lower.backend import remat_backend
from .lower.partitioner import RematPartitioner
from .plans.plan import Plan


def compile(model_or_fn: Callable, solver: str = "mincut", mode: str = "conservative",
            strict: bool = False, *, budget: str | float | None = None,
            time_limit: float | None = 60.0, compiler: str = "inductor",
            options: dict | None = None, on_plan: Callable | None = None,
            **torch_compile_kwargs: Any):
    """``torch.compile`` with remat choosing what the forward saves for the backward.

    >>> import torch, remat
    >>> f = remat.compile(lambda x: x.cos().cos(), compiler="eager")
    >>> x = torch.randn(8, requires_grad=True)
    >>> f(x).sum().backward()

    ``solver``: ``"mincut"`` (remat's fusion-aware min cut), or the baselines
    ``"torch-mincut"`` and ``"no-recompute"``. ``mode``: ``"conservative"`` (recompute only
    fusible ops; best step time) or ``"aggressive"`` (recompute all but compute-intensive and
    random ops; least memory). ``strict=True`` raises instead of falling back to PyTorch's
    partitioner when remat cannot plan a graph. ``compiler="eager"`` skips kernel codegen
    (fast to compile; for tests and inspection). ``options`` go to inductor's config;
    other keyword arguments go to ``torch.compile`` (``fullgraph``, ``dynamic``, ...).

    ``budget`` bounds the peak memory of each training step, inputs and parameters
    included: bytes (``"6GiB"``, ``6e9``) or a fraction of the peak without recomputation
    (``0.6``). remat then schedules with Checkmate's MILP (``solver="checkmate"``, for at
    most ``time_limit`` seconds per graph), its LP rounding (``"checkmate-lp"``), a baseline
    (``"chen-sqrtn"``, ``"chen-greedy"``, ``"griewank"``, ...) or, by default, the cheapest of
    the MILP and the baselines; a budget nothing fits raises
    :class:`remat.InfeasibleBudgetError` naming the smallest feasible budget found.
    """
    # validate the options now, not at the first call
    RematPartitioner(solver, mode, strict, budget=budget, time_limit=time_limit)
    backend = functools.partial(remat_backend, solver=solver, mode=mode, strict=strict,
                                compiler=compiler, on_plan=on_plan, options=options,
                                budget=budget, time_limit=time_limit)
    return torch.compile(model_or_fn, backend=backend, **torch_compile_kwargs)


def plan(model_or_fn: Callable, *example_inputs: Any, solver: str = "mincut",
         mode: str = "conservative", strict: bool = True, **kwargs: Any) -> Plan:
    """Plan a model's training step without compiling kernels; returns the :class:`Plan`.

    For a module this is the joint graph of its forward with a tangent for its output,
    exactly what ``torch.compile`` partitions (inductor's decompositions and joint passes).
    The model runs its forward once on ``example_inputs``. A function's inputs must include
    a tensor that requires grad.

    >>> import torch, remat
    >>> def f1(a, b, c, d):
    ...     return (a + b + c + d).cos().cos()
    >>> xs = [torch.randn(1024, requires_grad=True) for _ in range(4)]
    >>> p = remat.plan(f1, *xs)
    >>> [s.name for s in p.saved_activations]
    ['add_2']
    """
    plans = plan_all(model_or_fn, *example_inputs, solver=solver, mode=mode, strict=strict, **kwargs)
    if not plans:
        raise ValueError(
            "no training graph was captured: make sure the model has parameters or an input "
            "with requires_grad=True, and that it is not running under torch.no_grad()")
    if len(plans) > 1:
        warnings.warn(f"the model has {len(plans)} graphs (graph breaks); returning the plan of "
                      "the first. Use remat.plan_all for all of them.", stacklevel=2)
    return plans[0]


def plan_all(model_or_fn: Callable, *example_inputs: Any, **kwargs: Any) -> list[Plan]:
    """Like :func:`plan`, but one Plan per captured graph (one per graph break + 1)."""
    plans: list[Plan] = []
    kwargs.setdefault("strict", True)
    compiled = compile(model_or_fn, compiler="eager", on_plan=lambda g, p: plans.append(p), **kwargs)
    torch._dynamo.reset()
    try:
        compiled(*example_inputs)
    finally:
        torch._dynamo.reset()
    return plans


