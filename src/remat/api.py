"""The public entry points: :func:`compile`, :func:`plan`, :func:`plan_all`, :func:`frontier`
and :func:`shapes` (a step's inputs by their shapes)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from typing import Any, Callable, Mapping

import torch

from .capture.abstract import Shapes, abstract_model, fake_step, inputs_for, shapes  # noqa: F401 - remat.shapes
from .capture.target import Target
from .errors import OptionError, RematBudgetWarning
from .lower.backend import RematBackend
from .lower.options import COMPILERS, NAMES, Options
from .plans.plan import Plan
from .solvers import DEFAULT_TIME_LIMIT
from .solvers.magis.search import check_overhead
from .step.tradeoff import FRACTIONS, OVERHEADS, Tradeoffs, tradeoff

_TORCH_COMPILE = ("fullgraph", "dynamic", "mode", "options", "disable")
_REMAT_OPTIONS = (*NAMES, "max_overhead")
"""remat's keywords of :func:`compile`, as documented (an unknown one lists them)."""


def compile(model: Callable, *, solver: str = "auto", budget: str | float | None = None,
            time_limit: float | None = DEFAULT_TIME_LIMIT, strict: bool = False,
            compiler: str = "inductor", solver_options: Mapping[str, Any] | None = None,
            on_plan: Callable | None = None, cache: bool = True, verbose: bool = False,
            outputs: str = "kept", max_overhead: float | None = None, offload: bool = True,
            bandwidth: float | None = None, fullgraph: bool = False,
            dynamic: bool | None = None, mode: str | None = None, options: dict | None = None,
            disable: bool = False, **unknown: Any):
    """``torch.compile`` with remat choosing, for every graph of the training step, what the
    forward saves for the backward and what the backward recomputes.

    >>> import torch, remat
    >>> f = remat.compile(lambda x: x.cos().cos(), compiler="eager")
    >>> x = torch.randn(8, requires_grad=True)
    >>> f(x).sum().backward()

    remat's options:

    - ``solver``: ``"auto"`` (default: the conservative min cut, or with a budget the cheapest
      plan within it), ``"mincut-conservative"`` (recompute only ops that fuse: no slower step),
      ``"mincut-aggressive"`` (recompute all but compute-intensive and random ops: least
      memory), ``"checkmate"``, ``"checkmate-lp"``, the baselines (``"chen-greedy"``, ...),
      or PyTorch's own ``"torch-mincut"`` / ``"no-recompute"`` for comparison
      (``remat.solvers.names()`` lists them all).
    - ``budget``: the peak memory of each step: a fraction of plain ``torch.compile``'s
      activation memory (``0.6``: the step's peak above its inputs and parameters, gradients
      included, within 60% of what PyTorch's own partition peaks at), bytes for the whole step
      (``"6GiB"``, ``6e9``), or ``"min"`` (the least memory remat finds with the step predicted
      at most 2x plain ``torch.compile``'s; ``max_overhead`` sets another bound). Shared among
      the graphs of a step in the order they run (:mod:`remat.step.budget`). A fraction is a
      target: where no plan reaches it, the step runs at the least memory remat found trying
      (whatever the time), with one
      :class:`remat.RematBudgetWarning` naming the fraction reached and why it cannot go lower
      (``strict=True`` raises :class:`remat.InfeasibleBudgetError` instead). A byte budget is a
      guarantee: one nothing fits raises :class:`remat.InfeasibleBudgetError`, naming the
      smallest feasible budget found, from the training step.
    - ``time_limit``: seconds a solver may search per graph (None: no limit).
    - ``strict``: raise instead of falling back to PyTorch's partitioner (with a warning)
      when remat cannot plan a graph.
    - ``compiler``: ``"inductor"``, or ``"eager"`` to run the partitioned graphs without
      kernel codegen (fast to compile; for tests and inspection).
    - ``solver_options``: the solver's own options, e.g. ``{"threads": 1}`` for checkmate.
    - ``on_plan(graph, plan)``: called with every graph remat plans. On a compile-cache hit
      (same graph and options in an earlier process) nothing is planned and it is not called.
    - ``cache``: keep plans across runs (default True): a graph planned before with the same
      options is loaded from remat's plan cache (``$REMAT_CACHE_DIR``, default
      ``~/.cache/remat/plans``; ``REMAT_CACHE_DIR=off`` turns it off) instead of solved again;
      ``plan.cache`` says ``"hit"`` or ``"miss"`` (:mod:`remat.plans.cache`).
    - ``verbose``: show each planning stage on the terminal (a rich status line).
    - ``outputs``: ``"kept"`` (default) when the caller holds the model's outputs (logits,
      caches) until the backward ends (``out = model(x); out.loss.backward()``), ``"dropped"``
      when it drops them as the forward returns (``model(x).loss.backward()``, transformers'
      ``Trainer``). The memory model then frees them there, or after the backward's last read
      of those it reads, so budgets can be tighter. A caller that in fact keeps them peaks
      above the plan's prediction by up to their size.

    - ``max_overhead``: instead of a budget, the least memory within this share of extra step
      time (``0.10``: predicted at most 10% slower than plain ``torch.compile``'s partition,
      :func:`remat.plans.budget.reference_schedule`), and never more memory than the plan
      without a budget, by prediction: remat's least-memory plans within that time, then
      MAGIS's search over fission, recomputation and swapping from them
      (:func:`remat.solvers.magis.search.least_within`; ``solver`` ``"auto"`` or ``"magis"``).
      With ``budget="min"`` it sets the slowdown ``min`` may cost (default: predicted at most
      2x, :data:`remat.solvers.auto.MIN_OVERHEAD`); with a budget in bytes or a fraction it is
      refused.

    - ``offload``: let plans offload saved values to host memory (default True) where the
      copies are known to work on this torch and device (on CUDA: PyTorch's ``ao`` copy ops
      where this torch has them with the schemas remat lowers to, else remat's own async copy
      ops, :mod:`remat.lower.copy_ops`, on torch 2.10-2.12; :func:`remat.lower.offload.offload_support`). Where
      they are not, remat plans without offloading and warns once (``strict=True`` raises if
      the solver asked for can only offload). ``False``: never offload.
    - ``bandwidth``: bytes/s of the host link the plans assume; default: measured once per
      device (pinned buffers, both directions) and cached beside the plan cache.

    ``fullgraph``, ``dynamic``, ``mode``, ``options`` (inductor's config) and ``disable`` are
    ``torch.compile``'s. Any other keyword is an error that lists these.
    """
    if abstract_model(model):
        raise OptionError(f"remat.compile cannot run {type(model).__name__}: its parameters are on the "
                          "meta device or fake, with no data to train. Plan it instead, for the GPU it "
                          "will train on: remat.plan(model, inputs=remat.shapes(input_ids=((8, 4096), "
                          "torch.long)), device='H100'); to train it, materialize it first "
                          "(model.to_empty(device='cuda'), then load or initialize its weights)")
    if unknown:
        raise OptionError(f"remat.compile got unknown option {', '.join(map(repr, sorted(unknown)))}; "
                          f"remat's options: {', '.join(_REMAT_OPTIONS)}; "
                          f"torch.compile's: {', '.join(_TORCH_COMPILE)}")
    settings = Options.create(solver=solver, budget=budget, time_limit=time_limit, strict=strict,
                              compiler=compiler,
                              solver_options=_with_overhead(solver_options, max_overhead, budget),
                              on_plan=on_plan, cache=cache, verbose=verbose, outputs=outputs,
                              offload=offload, bandwidth=bandwidth)
    return _compiled(model, settings, options=options, mode=mode, fullgraph=fullgraph, dynamic=dynamic,
                     disable=disable)


def _compiled(model: Callable, settings: Options, *, options: dict | None = None, mode: str | None = None,
              fullgraph: bool = False, dynamic: bool | None = None, disable: bool = False):
    """``torch.compile(model)`` with remat's backend for checked ``settings``, and the step's
    budget hooks on a module."""
    label = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "graph")
    params = model.parameters() if isinstance(model, torch.nn.Module) else ()
    model_bytes = sum(p.numel() * p.element_size() for p in params)
    backend = RematBackend(settings, options, mode, label=label, model_bytes=model_bytes)  # checks mode and options now
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                             options=options, disable=disable)
    if isinstance(model, torch.nn.Module):
        _show_signature(compiled, model)
    if isinstance(model, torch.nn.Module) and settings.budget is not None:
        checks = _StepChecks(model, backend.step)
        if settings.budget.kind == "bytes":
            compiled.register_forward_pre_hook(checks.before)
        elif settings.budget.kind == "fraction" and not _lightning_module(model):
            # Lightning's Trainer runs the model's training_step under the backend itself, not
            # the compiled module: these hooks would never run, so its graphs warn as they go
            backend.step.defer = True
            compiled.register_forward_hook(checks.after)
    return compiled


def _lightning_module(model: torch.nn.Module) -> bool:
    """A Lightning ``LightningModule`` (Lightning's Trainer unwraps the compiled module and
    compiles the model's own ``training_step`` with its backend:
    ``lightning.pytorch.utilities.compile.from_compiled``)."""
    return any(c.__name__ == "LightningModule" and c.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
               for c in type(model).__mro__)


def _show_signature(compiled: torch.nn.Module, model: torch.nn.Module) -> None:
    """Give the compiled module's ``forward`` the model's own signature (``torch.compile``'s
    is ``(*args, **kwargs)``): code that reads it, such as transformers' ``Trainer``, which
    keeps only the dataset columns ``forward`` names, then sees the model's arguments."""
    forward = getattr(compiled, "forward", None)
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):  # a forward without a signature: nothing to show
        return
    if forward is not None and "forward" in vars(compiled):
        with contextlib.suppress(AttributeError, TypeError):
            forward.__signature__ = signature


class _StepChecks:
    """Hooks around each call of a module compiled with a budget
    (:class:`remat.step.budget.StepBudget`): before it, a byte budget takes off the gradients
    kept from the step before (:meth:`~remat.step.budget.StepBudget.held_gradients`, with a
    warning when plans were made without them); after it, when every graph of the step's
    forward is planned and some missed their shares of a fraction, the whole step is judged
    (:meth:`~remat.step.budget.StepBudget.verdict`): a warning, or InfeasibleBudgetError."""

    def __init__(self, model: torch.nn.Module, step) -> None:
        self.params = list(model.parameters())
        self.step = step

    def before(self, module, args) -> None:
        held = sum(p.grad.numel() * p.grad.element_size() for p in self.params if p.grad is not None)
        if held:
            text = self.step.held_gradients(held)
            if text:
                warnings.warn(text, RematBudgetWarning, stacklevel=3)

    def after(self, module, args, output) -> None:
        if not self.step.over:
            return
        error, text = self.step.verdict()
        if error is not None:
            raise error
        if text:
            warnings.warn(text, RematBudgetWarning, stacklevel=3)


def plan(model: Callable, *args: Any, solver: str = "auto", budget: str | float | None = None,
         time_limit: float | None = DEFAULT_TIME_LIMIT, strict: bool = False,
         solver_options: Mapping[str, Any] | None = None, cache: bool = True,
         for_compiler: str = "inductor", max_overhead: float | None = None,
         inputs: Shapes | None = None, device: Any = None, profile: Any = None, **kwargs: Any) -> Plan:
    """Plan a model's training step without compiling kernels; returns the :class:`Plan` of
    its first graph (:func:`plan_all` returns one per graph).

    The model runs its forward once on ``args`` and ``kwargs`` (keyword inputs such as
    Hugging Face's ``input_ids=..., labels=...`` go to the model), which must involve a tensor
    that requires grad. The graph is the joint forward+backward graph ``torch.compile`` would
    partition. ``solver``, ``budget``, ``time_limit``, ``strict``, ``solver_options``,
    ``max_overhead`` and ``cache`` (plans kept across runs) are remat's, as in :func:`compile`; ``for_compiler`` is
    the ``compiler`` of the :func:`compile` the plan is for (``"inductor"``, the default, whose
    fused kernels keep fusible values out of memory, or ``"eager"``): the plan is the one that
    call would make.

    **A model this machine cannot hold** is planned without allocating it: build it on the meta
    device (``with torch.device("meta"): model = LlamaForCausalLM(config)``) or under
    ``FakeTensorMode``, give its inputs as shapes (``inputs=remat.shapes(input_ids=((8, 4096),
    torch.long), labels=((8, 4096), torch.long))``: :func:`shapes`) or as meta or fake tensors,
    and name the device it will train on: ``device`` (``"cuda"``, ``"cpu"`` or a GPU such as
    ``"H100"``, ``"A100-40GB"``) and/or ``profile`` (a
    :class:`~remat.cost.model.DeviceProfile`, a GPU profile's name such as ``"H100-bf16"``, or
    the path of a profile JSON ``remat profile`` wrote on that GPU;
    :func:`remat.cost.profiles.resolve_profile`). The step is captured on fake CPU tensors (the
    graph a real CPU capture of the same shapes and dtypes gives:
    :mod:`remat.capture.abstract`), ``use_cache=False`` is passed to a model whose ``forward``
    takes it and was not given it (a training step keeps no KV cache), and the graph records
    the target (``plan.graph.meta["device"]``) and is priced with its profile: the predicted
    peak and step time are the target's. ``device`` and ``profile`` plan a real model for
    another device too. Such a plan cannot be run here: ``remat.compile`` refuses a meta model.

    >>> import torch, remat
    >>> with torch.device("meta"):
    ...     mlp = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU(), torch.nn.Linear(16384, 4096))
    >>> p = remat.plan(mlp, inputs=remat.shapes(((64, 4096), torch.float32)), device="H100", cache=False)
    >>> p.graph.meta["device"]["name"], p.graph.meta["device"]["target"]
    ('H100', True)

    >>> def f1(a, b, c, d):
    ...     return (a + b + c + d).cos().cos()
    >>> xs = [torch.randn(1024, requires_grad=True) for _ in range(4)]
    >>> p = remat.plan(f1, *xs)
    >>> [s.name for s in p.saved_activations]
    ['add_2']
    """
    plans = plan_all(model, *args, solver=solver, budget=budget, time_limit=time_limit,
                     strict=strict, solver_options=solver_options, cache=cache,
                     for_compiler=for_compiler, max_overhead=max_overhead, inputs=inputs,
                     device=device, profile=profile, **kwargs)
    if len(plans) > 1:
        warnings.warn(f"the model has {len(plans)} graphs (graph breaks); returning the plan of "
                      "the first. Use remat.plan_all for all of them.", stacklevel=2)
    return plans[0]


def plan_all(model: Callable, *args: Any, solver: str = "auto", budget: str | float | None = None,
             time_limit: float | None = DEFAULT_TIME_LIMIT, strict: bool = False,
             solver_options: Mapping[str, Any] | None = None, cache: bool = True,
             for_compiler: str = "inductor", max_overhead: float | None = None,
             inputs: Shapes | None = None, device: Any = None, profile: Any = None,
             **kwargs: Any) -> list[Plan]:
    """Like :func:`plan`, but one Plan per captured graph (one per graph break + 1); a model on
    the meta device or fake, ``inputs``, ``device`` and ``profile`` as there."""
    plans: list[Plan] = []
    if for_compiler not in COMPILERS:
        raise OptionError(f"unknown compiler {for_compiler!r}; use one of {', '.join(COMPILERS)}")
    target = Target.create(device, profile)
    args, kwargs, abstract = inputs_for(model, args, kwargs, inputs)
    if abstract:
        kwargs = _without_cache(model, kwargs)
    settings = Options.create(solver=solver, budget=budget, time_limit=time_limit, strict=strict,
                              compiler="eager",
                              solver_options=_with_overhead(solver_options, max_overhead, budget), cache=cache,
                              on_plan=lambda g, p: plans.append(p))
    # captured without codegen (eager), planned for the compiler the user will run
    compiled = _compiled(model, dataclasses.replace(settings, plans_for=for_compiler, target=target))
    torch._dynamo.reset()
    try:
        with (fake_step(model, args, kwargs) if abstract else contextlib.nullcontext((args, kwargs))) as (a, k):
            compiled(*a, **k)
    finally:
        torch._dynamo.reset()
    if not plans:
        raise OptionError(
            "no training graph was planned: make sure the model has parameters or an input with "
            "requires_grad=True, that it is not running under torch.no_grad(), and that remat did "
            "not fall back to PyTorch's partitioner (a RematFallbackWarning says why; strict=True "
            "raises instead)")
    return plans


def _without_cache(model: Callable, kwargs: dict) -> dict:
    """``kwargs`` with ``use_cache=False`` where the model's ``forward`` takes ``use_cache`` and
    it was not given (a transformers model would build a KV cache the training step never
    reads, and dynamo stops on it for a meta model)."""
    forward = getattr(model, "forward", model)
    try:
        names = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return kwargs
    return {**kwargs, "use_cache": False} if "use_cache" in names and "use_cache" not in kwargs else kwargs


def frontier(model: Callable, *args: Any, solver: str = "auto", compiler: str = "inductor",
             fractions: tuple = FRACTIONS, overheads: tuple = OVERHEADS,
             time_limit: float | None = DEFAULT_TIME_LIMIT, solver_options: Mapping[str, Any] | None = None,
             **kwargs: Any) -> Tradeoffs:
    """The memory/time frontier of a model's training step, one
    :class:`~remat.solvers.tradeoff.Tradeoff` per captured graph (a list that prints as their
    tables): the (predicted peak, predicted step time) points remat finds, none smaller and
    faster than another, and the point each budget picks (no budget, each of ``fractions``,
    ``"min"``, each ``max_overhead`` of ``overheads``; :func:`remat.solvers.tradeoff.tradeoff`).

    The step is captured as :func:`plan_all` captures it (``args`` and ``kwargs`` go to the
    model; ``inputs``, ``device`` and ``profile`` plan a model on the meta device or fake for a
    target, as there); ``compiler`` is the one the plans are for (``"inductor"`` or ``"eager"``), and
    ``solver``, ``time_limit`` (per solve) and ``solver_options`` are as in :func:`compile`.

    >>> import torch, remat
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    >>> t = remat.frontier(mlp, torch.randn(8, 16), compiler="eager", fractions=(0.8,))
    >>> [k.budget for k in t[0].picks]
    ['none', '0.8', 'min', 'overhead 0.1']
    """
    # captured by plan_all at budget 1.0: a fraction has capture record plain torch.compile's
    # partition on each graph (the reference of fractions and time bounds), and 1.0 always fits
    graphs = [p.graph for p in plan_all(model, *args, budget=1.0, time_limit=time_limit, cache=False,
                                        for_compiler=compiler, **kwargs)]
    return Tradeoffs(tradeoff(g, solver=solver, fractions=fractions, overheads=overheads,
                              time_limit=time_limit, solver_options=solver_options) for g in graphs)


def _with_overhead(solver_options: Mapping[str, Any] | None, max_overhead: float | None,
                   budget: Any) -> Any:
    """The solver's options with ``max_overhead`` among them (checked against the budget: none,
    or ``"min"``; a budget in bytes or a fraction is refused)."""
    if max_overhead is None or not isinstance(solver_options, (Mapping, type(None))):
        return solver_options  # checked where every request is (remat.solvers.registry.request)
    out = dict(solver_options or {})
    if budget is not None and not (isinstance(budget, str) and budget.strip().lower() == "min"
                                   or getattr(budget, "kind", None) == "min"):
        raise OptionError(f"max_overhead={max_overhead!r} bounds the step time of the least memory: "
                          f"it goes with budget='min' or no budget, not with budget={budget!r}. Give "
                          "a memory budget (the fastest plan within it) or max_overhead (the least "
                          "memory within that much more time), not both")
    check_overhead(max_overhead)  # the solvers' own check, the same message
    out["max_overhead"] = float(max_overhead)
    return out
