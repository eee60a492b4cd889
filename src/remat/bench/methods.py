"""The methods a benchmark compares, each turned into a training step on a zoo case.

================================  ==================================================================
method                            what runs
================================  ==================================================================
``eager``                         plain autograd
``compile``                       torch.compile with PyTorch's own partitioner (min cut), run
                                  as ``remat.compile(solver="torch-mincut")`` so the plan is captured
``no-recompute``                  ``remat.compile(solver="no-recompute")``: saves what autograd would
``checkpoint``                    every block of ``case.blocks`` wrapped in
                                  ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, then
                                  compiled like ``compile`` (no plans are captured)
``remat-conservative``            ``remat.compile(solver="mincut", mode="conservative")``
``remat-aggressive``              ``remat.compile(solver="mincut", mode="aggressive")``
``remat:<solver>[:<mode>][:k=v]`` any solver by name, e.g. ``remat:mincut:aggressive``,
                                  ``remat:checkmate:budget=0.6`` (options: ``k=v,k2=v2``;
                                  keywords of ``remat.compile`` such as ``budget`` and
                                  ``time_limit`` go to it, the others to the solver)
================================  ==================================================================

Every method works on its own deep copy of the case's model and inputs, so methods share no
state (BatchNorm statistics, gradients). ``compiler="eager"`` makes every compiled method
codegen-free (AOTAutograd with inductor's decompositions and partitioner hook, no kernels):
fast to compile, for tests. ``compiler="inductor"`` compiles real kernels.

>>> from remat import zoo
>>> p = prepare("remat-aggressive", zoo.build("cos-cos"), compiler="eager")
>>> loss = p.step()
>>> [s.name for s in p.plans[0].saved_activations]
['add_2']
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from .. import zoo

METHODS = ["eager", "compile", "no-recompute", "checkpoint", "remat-conservative", "remat-aggressive"]

_FIXED = {  # method -> (solver, mode)
    "compile": ("torch-mincut", "conservative"),
    "no-recompute": ("no-recompute", "conservative"),
    "remat-conservative": ("mincut", "conservative"),
    "remat-aggressive": ("mincut", "aggressive"),
}
_MODES = ("conservative", "aggressive")


@dataclass
class Prepared:
    method: str
    step: Callable[[], torch.Tensor]  # zero grads (None), forward, loss, backward; returns the loss, detached
    plans: list  # remat Plans captured, one per compiled graph (empty for eager and checkpoint)
    graphs: list  # the remat Graphs of those plans, same order
    compile_seconds: float | None  # wall time of the first step() of a compiled method (compile + one step)
    planner_seconds: float | None  # sum of plan.solve_seconds (None without plans)
    model: nn.Module | None = None  # this method's copy of the model (checkpoint: wrapped)
    inputs: tuple = ()  # this method's copy of the inputs
    solver: str | None = None
    mode: str | None = None
    solver_options: dict = field(default_factory=dict)

    def params_and_inputs(self) -> list[torch.Tensor]:
        """This method's tensors that receive gradients, in the order of
        ``case.params_and_inputs()`` (parameters, then inputs with requires_grad)."""
        params = list(self.model.parameters()) if self.model is not None else []
        return params + [x for x in self.inputs if isinstance(x, torch.Tensor) and x.requires_grad]


@dataclass(frozen=True)
class MethodSpec:
    kind: str  # "eager", "checkpoint" or "remat"
    solver: str | None = None
    mode: str = "conservative"
    options: dict = field(default_factory=dict)


def parse_method(method: str) -> MethodSpec:
    """``"remat-aggressive"`` -> ``MethodSpec("remat", "mincut", "aggressive")``;
    ``"remat:checkmate:budget=0.6"`` -> ``MethodSpec("remat", "checkmate", "conservative",
    {"budget": 0.6})``. Raises ValueError for unknown methods, solvers, modes or options."""
    if not isinstance(method, str):
        raise ValueError(f"a method is a string; got {method!r}")
    if method in ("eager", "checkpoint"):
        return MethodSpec(method)
    if method in _FIXED:
        solver, mode = _FIXED[method]
        return MethodSpec("remat", solver, mode)
    if not method.startswith("remat:"):
        raise ValueError(f"unknown method {method!r}; use one of {METHODS} or "
                         "'remat:<solver>[:<mode>][:key=value,...]'")
    parts = method.split(":")[1:]
    if not parts or not parts[0]:
        raise ValueError(f"method {method!r} names no solver: 'remat:<solver>[:<mode>][:key=value,...]'")
    solver, mode, options = parts[0], None, {}
    for part in parts[1:]:
        if "=" in part:
            for item in filter(None, part.split(",")):
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"bad solver option {item!r} in {method!r}; write key=value")
                options[key.strip()] = _parse_value(value.strip())
        elif part in _MODES:
            if mode is not None:
                raise ValueError(f"method {method!r} gives two modes")
            mode = part
        else:
            raise ValueError(f"unknown mode {part!r} in {method!r}; use one of {_MODES} or key=value options")
    _check_solver(solver, options, method)
    return MethodSpec("remat", solver, mode or "conservative", options)


def _parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() == "none":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


_COMPILE_STANDARD = {"model_or_fn", "solver", "mode", "strict", "compiler", "options", "on_plan"}
_NOT_OPTIONS = {"g", "graph", "mode", "budget", "limit", "budget_bytes"}


def _compile_keys() -> set[str]:
    """Keyword arguments of ``remat.compile`` beyond the standard ones (``budget``,
    ``time_limit``, ...): method options with these names go to ``remat.compile`` itself."""
    from ..api import compile as remat_compile

    return {n for n, p in inspect.signature(remat_compile).parameters.items()
            if n not in _COMPILE_STANDARD and p.kind is not inspect.Parameter.VAR_KEYWORD}


def _solver_fn(solver: str):
    from ..solvers import SOLVERS

    if solver in SOLVERS:
        return SOLVERS[solver]
    try:
        from ..solvers.auto import budget_solvers
    except ImportError:
        return None
    return budget_solvers().get(solver)


def split_options(spec: MethodSpec) -> tuple[dict, dict]:
    """(keyword arguments of ``remat.compile``, solver options) of a method's options."""
    keys = _compile_keys()
    return ({k: v for k, v in spec.options.items() if k in keys},
            {k: v for k, v in spec.options.items() if k not in keys})


def _check_solver(solver: str, options: dict, method: str) -> None:
    from ..lower.partitioner import TORCH_PARTITIONERS, RematPartitioner

    spec = MethodSpec("remat", solver, "conservative", options)
    compile_kw, solver_opts = split_options(spec)
    try:  # remat's own validation of the solver name (and budget), as remat.compile does it
        RematPartitioner(solver, "conservative", solver_options=solver_opts, **compile_kw)
    except ValueError as e:
        raise ValueError(f"{method!r}: {e}") from None
    if not solver_opts:
        return
    if solver in TORCH_PARTITIONERS:
        raise ValueError(f"solver {solver!r} (PyTorch's partitioner) takes no options; got {sorted(solver_opts)}")
    fn = _solver_fn(solver)
    if fn is None:
        return
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted({n for n, p in params.items()
                       if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n not in _NOT_OPTIONS}
                      | _compile_keys())
    unknown = sorted(set(solver_opts) - set(accepted))
    if unknown:
        raise ValueError(f"solver {solver!r} has no option {', '.join(map(repr, unknown))}; "
                         f"its options: {accepted or 'none'} (and the mode)")


def prepare(method: str, case: zoo.Case, *, compiler: str = "inductor", strict: bool = False) -> Prepared:
    """Turn ``method`` into a training step on a fresh copy of ``case``. Nothing is compiled
    until the first ``step()``. ``strict=True`` makes remat raise instead of falling back to
    PyTorch's partitioner when it cannot plan a graph (see ``remat.compile``)."""
    spec = parse_method(method)
    if compiler not in ("inductor", "eager"):
        raise ValueError(f"unknown compiler {compiler!r}; use 'inductor' or 'eager'")
    model = copy.deepcopy(case.model)
    inputs = tuple(_copy_input(x) for x in case.inputs)
    plans: list = []
    graphs: list = []
    if spec.kind == "eager":
        fn: Callable = model
    elif spec.kind == "checkpoint":
        model = checkpoint_blocks(model, case.blocks)
        fn = _remat_compile(model, MethodSpec("remat", "torch-mincut"), compiler, strict, on_plan=None)
    else:
        def on_plan(graph, plan):
            graphs.append(graph)
            plans.append(plan)

        fn = _remat_compile(model, spec, compiler, strict, on_plan)

    prepared = Prepared(method=method, step=None, plans=plans, graphs=graphs,  # type: ignore[arg-type]
                        compile_seconds=None, planner_seconds=None, model=model, inputs=inputs,
                        solver=spec.solver, mode=spec.mode if spec.kind == "remat" else None,
                        solver_options=dict(spec.options))
    grads = prepared.params_and_inputs()
    loss_fn = case.loss
    compiled = spec.kind != "eager"
    cuda = any(t.is_cuda for t in grads + [x for x in inputs if isinstance(x, torch.Tensor)])

    def step() -> torch.Tensor:
        for t in grads:
            t.grad = None
        first = compiled and prepared.compile_seconds is None
        t0 = time.perf_counter() if first else 0.0
        loss = loss_fn(fn(*inputs))
        loss.backward()
        if first:
            if cuda:
                torch.cuda.synchronize()
            prepared.compile_seconds = time.perf_counter() - t0
        if plans:
            prepared.planner_seconds = float(sum(p.solve_seconds for p in plans))
        return loss.detach()

    prepared.step = step
    return prepared


def _copy_input(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return copy.deepcopy(x)


def _remat_compile(model, spec: MethodSpec, compiler, strict, on_plan):
    """``remat.compile`` for a method. Static shapes (``dynamic=False``): a case is planned at
    its own sizes, and a later batch size is a new graph with its own plan, not a symbolic one."""
    import remat
    from ..lower.backend import remat_backend

    compile_kw, solver_opts = split_options(spec)
    kwargs = dict(solver=spec.solver, mode=spec.mode, strict=strict, compiler=compiler, on_plan=on_plan,
                  **compile_kw)
    if not solver_opts:
        return remat.compile(model, dynamic=False, **kwargs)
    if "solver_options" in inspect.signature(remat.compile).parameters:
        return remat.compile(model, dynamic=False, solver_options=solver_opts, **kwargs)
    # remat.compile takes no solver options: the backend it wraps does
    from ..lower.partitioner import RematPartitioner

    RematPartitioner(spec.solver, spec.mode, strict, solver_options=solver_opts, **compile_kw)  # validate now
    backend = functools.partial(remat_backend, solver_options=solver_opts, **kwargs)
    return torch.compile(model, backend=backend, dynamic=False)


# -- full checkpointing --------------------------------------------------------------------------

class Checkpointed(nn.Module):
    """Runs ``module`` under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: the
    forward saves only the block's inputs; the backward reruns the block."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.module, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module, blocks: list[str]) -> nn.Module:
    """Wrap each named submodule of ``model`` in :class:`Checkpointed`, in place (``""``: the
    whole model; the result is then a new wrapper). Parameter order is unchanged."""
    if "" in blocks:
        if len(blocks) > 1:
            raise ValueError("blocks [''] (the whole model) cannot be combined with other blocks")
        return Checkpointed(model)
    for name in blocks:
        model.get_submodule(name)  # raises AttributeError naming the missing part
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Checkpointed(getattr(parent, child)))
    return model


__all__ = ["METHODS", "Prepared", "MethodSpec", "prepare", "parse_method", "checkpoint_blocks", "Checkpointed"]
