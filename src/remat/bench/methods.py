"""The methods a benchmark compares, each turned into a training step on a zoo case.

A method is ``eager`` (plain autograd), ``torch-checkpoint`` (every block of ``case.blocks``
wrapped in ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, then compiled with
PyTorch's partitioner; no plans are captured), or the name of a solver, as everywhere in
remat (``remat.solvers.names()``), run through ``remat.compile``: ``torch-mincut``
(torch.compile's own partitioner), ``no-recompute`` (``default_partition``: saves what
autograd would), ``mincut-conservative``, ``mincut-aggressive``, ``auto``, ``checkmate``, ...
Options follow a colon: ``auto:budget=0.6``, ``checkmate:budget=0.5,time_limit=20,threads=1``;
``budget`` and ``time_limit`` go to ``remat.compile``, the others are the solver's own
options, checked against it.

Every method works on its own deep copy of the case's model and inputs, so methods share no
state (BatchNorm statistics, gradients). ``compiler="eager"`` makes every compiled method
codegen-free (AOTAutograd with inductor's decompositions and partitioner hook, no kernels):
fast to compile, for tests. ``compiler="inductor"`` compiles real kernels.

>>> from remat import zoo
>>> p = prepare("mincut-aggressive", zoo.build("cos-cos"), compiler="eager")
>>> loss = p.step()
>>> [s.name for s in p.plans[0].saved_activations]
['add_2']
"""

from __future__ import annotations

import ast
import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import zoo
from ..api import compile as remat_compile
from ..lower.options import COMPILERS, Options
from ..solvers import names as solver_names

METHODS = ["eager", "torch-mincut", "no-recompute", "torch-checkpoint", "mincut-conservative",
           "mincut-aggressive"]
"""What ``--methods all`` runs: the baselines of DESIGN.md's tables and remat's two min cuts."""

CHECKPOINT = "torch-checkpoint"
_COMPILE_KEYS = ("budget", "time_limit")


@dataclass
class Prepared:
    method: str
    step: Callable[[], torch.Tensor]  # zero grads (None), forward, loss, backward; returns the loss, detached
    plans: list  # remat Plans captured, one per compiled graph (empty for eager and torch-checkpoint)
    graphs: list  # the remat Graphs of those plans, same order
    compile_seconds: float | None  # wall time of the first step() of a compiled method (compile + one step)
    planner_seconds: float | None  # sum of plan.solve_seconds (None without plans)
    model: nn.Module | None = None  # this method's copy of the model (torch-checkpoint: wrapped)
    inputs: tuple = ()  # this method's copy of the inputs
    solver: str | None = None
    options: dict = field(default_factory=dict)

    def params_and_inputs(self) -> list[torch.Tensor]:
        """This method's tensors that receive gradients, in the order of
        ``case.params_and_inputs()`` (parameters, then inputs with requires_grad)."""
        params = list(self.model.parameters()) if self.model is not None else []
        return params + [x for x in self.inputs if isinstance(x, torch.Tensor) and x.requires_grad]


@dataclass(frozen=True)
class MethodSpec:
    kind: str  # "eager", "checkpoint" or "remat"
    solver: str | None = None
    options: dict = field(default_factory=dict)  # remat.compile's (budget, time_limit)
    solver_options: dict = field(default_factory=dict)

    def compile_options(self, **extra: Any) -> dict:
        """Keyword arguments of ``remat.compile`` for this method. The plan cache is off
        (planning time is measured), unless the method's options turn it on."""
        return {"solver": self.solver, "solver_options": dict(self.solver_options), "cache": False,
                **self.options, **extra}


def parse_method(method: str) -> MethodSpec:
    """``"mincut-aggressive"`` -> ``MethodSpec("remat", "mincut-aggressive")``;
    ``"checkmate:budget=0.6,threads=1"`` -> ``MethodSpec("remat", "checkmate", {"budget": 0.6},
    {"threads": 1})``. Raises ValueError for unknown methods, solvers or options, with the
    valid names."""
    if not isinstance(method, str):
        raise ValueError(f"a method is a string; got {method!r}")
    if method == "eager":
        return MethodSpec("eager")
    if method == CHECKPOINT:
        return MethodSpec("checkpoint", "torch-mincut")
    solver, sep, rest = method.partition(":")
    if solver not in solver_names():
        raise ValueError(f"unknown method {method!r}; methods: eager, {CHECKPOINT}, or a solver "
                         f"({', '.join(solver_names())}) with options as solver:key=value,...")
    options, solver_options = {}, {}
    for item in filter(None, rest.split(",")) if sep else ():
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"bad option {item!r} in method {method!r}; write solver:key=value,...")
        key = key.strip()
        (options if key in _COMPILE_KEYS else solver_options)[key] = _parse_value(value.strip())
    spec = MethodSpec("remat", solver, options, solver_options)
    try:  # the same checks as remat.compile
        Options.create(**spec.compile_options())
    except ValueError as e:
        raise ValueError(f"method {method!r}: {e}") from None
    return spec


def split_methods(text: str) -> list[str]:
    """The methods of a comma-separated list, where a method's options are comma-separated too:
    a part with ``=`` and no ``:`` continues the method before it.

    >>> split_methods("eager,auto:budget=0.6,checkmate:budget=0.5,threads=1")
    ['eager', 'auto:budget=0.6', 'checkmate:budget=0.5,threads=1']
    """
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if out and "=" in part and ":" not in part and ":" in out[-1]:
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out


def _parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lower() == "none":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def prepare(method: str, case: zoo.Case, *, compiler: str = "inductor", strict: bool = False) -> Prepared:
    """Turn ``method`` into a training step on a fresh copy of ``case``. Nothing is compiled
    until the first ``step()``. ``strict=True`` makes remat raise instead of falling back to
    PyTorch's partitioner when it cannot plan a graph (see ``remat.compile``)."""
    spec = parse_method(method)
    if compiler not in COMPILERS:
        raise ValueError(f"unknown compiler {compiler!r}; use one of {', '.join(COMPILERS)}")
    model = copy.deepcopy(case.model)
    inputs = tuple(_copy_input(x) for x in case.inputs)
    plans: list = []
    graphs: list = []
    if spec.kind == "eager":
        fn: Callable = model
    elif spec.kind == "checkpoint":
        model = checkpoint_blocks(model, case.blocks)
        fn = _remat_compile(model, spec, compiler, strict, on_plan=None)
    else:
        def on_plan(graph, plan):
            graphs.append(graph)
            plans.append(plan)

        fn = _remat_compile(model, spec, compiler, strict, on_plan)

    prepared = Prepared(method=method, step=None, plans=plans, graphs=graphs,  # type: ignore[arg-type]
                        compile_seconds=None, planner_seconds=None, model=model, inputs=inputs,
                        solver=spec.solver, options={**spec.options, **spec.solver_options})
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
    return remat_compile(model, dynamic=False, **spec.compile_options(compiler=compiler, strict=strict,
                                                                       on_plan=on_plan))


# -- full checkpointing --------------------------------------------------------------------------

class Checkpointed(nn.Module):
    """Runs ``module`` under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: the
    forward saves only the block's inputs; the backward reruns the block."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
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


__all__ = ["METHODS", "CHECKPOINT", "Prepared", "MethodSpec", "prepare", "parse_method", "checkpoint_blocks",
           "Checkpointed"]
