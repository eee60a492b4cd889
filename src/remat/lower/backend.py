"""The ``"remat"`` dynamo backend: inductor (or no codegen) with remat's partitioner.

:class:`RematBackend` is what ``remat.compile`` hands to ``torch.compile``;
:func:`remat_backend` is the same backend registered by name, reading remat's options from
``torch.compile(model, backend="remat", options={...})``. Errors remat raises on purpose
(an infeasible budget, ``strict=True``) reach the caller as themselves: dynamo would wrap
them in ``BackendCompilerFailed``, so they are raised as an instance of their own class that
dynamo lets through (:func:`surfaced`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _BACKENDS
from torch._dynamo.backends.registry import register_backend as reg
from torch._dynamo.exc import ShortenTraceback
from torch._guards import detect_fake_mode
from torch._inductor.compile_fx import compile_fx, compile_fx_inner, partition_fn
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.virtualized import V
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import OptionError, RematError
from .options import NAMES, Options
from ..step.budget import StepBudget
from .partitioner import RematPartitioner
from .plan_order import in_plan_order

_TAKES_OVERRIDE = "partitioner_fn_override" in inspect.signature(partition_fn).parameters
"""torch >= 2.12 takes the partitioner per call; before, it is read from inductor's config."""


class RematBackend:
    """A dynamo backend that plans every graph with remat. ``inductor_options``: inductor
    config patches (``torch.compile``'s ``options``); ``mode``: ``torch.compile``'s mode;
    ``label``: what the graphs are named after (the model's class); ``model_bytes``: the
    model's parameter bytes (a byte budget bounds the whole step: :mod:`remat.step.budget`)."""

    __name__ = "remat"

    def __init__(self, options: Options | None = None, inductor_options: dict | None = None,
                 mode: str | None = None, label: str = "graph", model_bytes: int = 0) -> None:
        self.options = options or Options.create()
        self.label = label
        self.inductor_options = dict(inductor_options or {})
        self.mode = mode
        self.model_bytes = int(model_bytes)
        self.step = StepBudget(self.options.budget, model_bytes, strict=self.options.strict)  # the budget of the whole step
        inductor_patches(mode, self.inductor_options)  # a clear error now, not at the first call

    def __deepcopy__(self, memo) -> "RematBackend":
        """The backend itself: one ``remat.compile`` has one backend, whose step budget the
        graphs of the step share (Lightning deep-copies ``torch.compile``'s arguments to
        compile again with them; the copy must plan as the original does)."""
        return self

    def __reduce__(self):
        """Pickled by its options (a fresh step budget when unpickled). An ``on_plan`` callback
        that cannot be pickled (a lambda) makes this fail, as it would for any object."""
        return (RematBackend, (self.options, self.inductor_options, self.mode, self.label, self.model_bytes))

    def __repr__(self) -> str:
        o = self.options
        budget = f", budget={o.budget.text!r}" if o.budget is not None else ""
        return f"remat(solver={o.solver!r}{budget}, compiler={o.compiler!r})"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                 options: dict | None = None):
        part = RematPartitioner(self.options, param_indices=_param_indices(gm),
                                graph_name=_graph_name(gm, self.label), step=self.step)
        patches = inductor_patches(mode or self.mode, {**self.inductor_options, **(options or {})})
        try:
            if self.options.compiler == "eager":
                return _eager_compile(gm, example_inputs, part)
            return compile_fx(gm, example_inputs, inner_compile=functools.partial(_compile_graph, part),
                              config_patches={**patches, "custom_partitioner_fn": part})
        except RematError as e:
            raise surfaced(e) from e.__cause__


def _compile_graph(part: RematPartitioner, gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """Inductor's compilation of the forward or backward module ``part`` made, kept to the
    plan's order when the plan is remat's own (:mod:`remat.lower.plan_order`), its backward
    channels-last when the forward is (inductor would decide again on the backward alone,
    which holds no convolution: :mod:`remat.capture.workspace`); PyTorch's partitioners and
    the fallback compile as inductor would."""
    if not part.keeps_order:
        return compile_fx_inner(gm, example_inputs, **kwargs)
    layout = inductor_config.patch(force_layout_optimization=True) \
        if part.channels_last and kwargs.get("is_backward") else contextlib.nullcontext()
    with in_plan_order(), layout:
        return compile_fx_inner(gm, example_inputs, **kwargs)


def remat_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                  options: dict | None = None):
    """``torch.compile(model, backend="remat", options={"solver": ..., "budget": ...})``: remat's
    options (:data:`remat.lower.options.NAMES`) and inductor's config in one dict."""
    opts = dict(options or {})
    mine = {k: opts.pop(k) for k in list(opts) if k in NAMES}
    try:
        backend = RematBackend(Options.create(**mine), opts, mode)
    except RematError as e:
        raise surfaced(e) from None
    return backend(gm, example_inputs)


def inductor_patches(mode: str | None, options: dict) -> dict[str, Any]:
    """Inductor config patches for ``torch.compile``'s ``mode`` and ``options``, each checked."""
    known = inductor_config.get_config_copy()
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise OptionError(f"unknown option {', '.join(map(repr, unknown))}: neither one of remat's "
                          f"({', '.join(NAMES)}) nor an inductor config option")
    patches: dict[str, Any] = {}
    if mode not in (None, "default"):
        modes = torch._inductor.list_mode_options()
        if mode not in modes:
            hint = ""
            if mode in ("conservative", "aggressive"):
                hint = f" (remat's min cut takes its mode in the solver's name: solver='mincut-{mode}')"
            raise OptionError(f"unknown torch.compile mode {mode!r}; modes: {', '.join(modes)}{hint}")
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(options)
    return patches


_SURFACED: dict[type, type] = {}


def surfaced(e: RematError) -> RematError:
    """``e`` as an instance of a subclass of its own class that is also a dynamo
    ``ShortenTraceback``, which dynamo re-raises as it is (``except InfeasibleBudgetError``
    around a training step then catches it)."""
    if isinstance(e, ShortenTraceback):
        return e
    cls = type(e)
    through = _SURFACED.get(cls)
    if through is None:
        through = _SURFACED[cls] = type(cls.__name__, (cls, ShortenTraceback),
                                        {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    out = BaseException.__new__(through, *e.args)
    out.__dict__.update(e.__dict__)
    out.first_useful_frame = None
    return out.with_traceback(e.__traceback__)


def _param_indices(gm: torch.fx.GraphModule) -> set[int]:
    """Indices of the dynamo graph's inputs that are parameters (AOT keeps their order)."""
    out = set()
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        val = node.meta.get("example_value")
        grapharg = node.meta.get("grapharg")
        source = str(getattr(grapharg, "source", "")) if grapharg is not None else ""
        if isinstance(val, torch.nn.Parameter) or "_parameters" in source:
            out.add(i)
    return out


def _graph_name(gm: torch.fx.GraphModule, label: str) -> str:
    """``label_0_0``: what is compiled (the model's class or the function's name) and dynamo's
    compile id (frame, recompile), distinct for each graph of a step. Under DDP, dynamo's
    DDPOptimizer splits one graph into a submodule per bucket, all with the same compile id
    (they share one ``meta`` dict) and compiled in order: they are ``label_0_0_submod0``,
    ``label_0_0_submod1``, ... (torch's ``submod_K``)."""
    label = re.sub(r"\W+", "", label) or "graph"
    cid = gm.meta.get("dynamo_compile_id")
    name = f"{label}_{str(cid).replace('/', '_')}" if cid is not None else label
    if "DDPOptimizer" in str(getattr(gm, "compile_subgraph_reason", "")):
        k = gm.meta["remat_ddp_submods"] = gm.meta.get("remat_ddp_submods", -1) + 1
        name = f"{name}_submod{k}"
    return name


def _eager_compile(gm, example_inputs, partitioner: RematPartitioner):
    """AOTAutograd with inductor's decompositions and joint passes, but no kernel codegen."""
    def nop(fx_g, _inputs):
        # run the graph with the boxed convention, freeing each value (inputs included) after
        # its last use, as inductor's code does: memory then follows the plan
        run = _boxed_code(fx_g)
        if run is None:  # copies to host (ao ops), or a torch without boxed codegen: interpreted
            def run(args):
                return _SeededInterpreter(fx_g, garbage_collect_values=True).boxed_run(args)

        run._boxed_call = True
        return run

    def partition(joint, joint_inputs, **kwargs):
        # inductor's joint passes (random-op rewriting) read V.fake_mode, as under compile_fx;
        # its constant folding, run on meta values, folds the whole backward into empty tensors
        # (remat.plan captures a meta model on fake CPU tensors: remat.capture.abstract)
        meta = any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in joint_inputs)
        folding = inductor_config.patch(joint_graph_constant_folding=False) if meta else contextlib.nullcontext()
        with V.set_fake_mode(detect_fake_mode(joint_inputs)), folding:
            if _TAKES_OVERRIDE:
                return partition_fn(joint, joint_inputs, partitioner_fn_override=partitioner, **kwargs)
            with inductor_config.patch(custom_partitioner_fn=partitioner):  # torch < 2.12
                return partition_fn(joint, joint_inputs, **kwargs)

    return aot_autograd(
        fw_compiler=nop, bw_compiler=nop, inference_compiler=nop, partition_fn=partition,
        decompositions=select_decomp_table(), keep_inference_input_mutations=True,
    )(gm, example_inputs)


def _boxed_code(gm: torch.fx.GraphModule):
    """``gm`` as generated Python code with the boxed calling convention (the argument list
    is cleared once unpacked, and fx's code drops each value after its last use, inputs
    included), its random ops drawn from their seeds (:class:`_SeededInterpreter`'s rule);
    None where the graph copies to host (the ``ao`` ops, which tests run on CPU stand-ins
    through the interpreter) or this torch has no boxed codegen. Interpreting the graph op
    by op cost a tiny transformer's step 1.65-1.87x the time of ``aot_eager_decomp_partition``."""
    boxed = getattr(torch.fx.graph, "_BoxedCodeGen", None)
    nodes = list(gm.graph.nodes)
    if boxed is None or any(getattr(n.target, "namespace", None) == "ao" for n in nodes):
        return None
    for n in nodes:
        if n.op == "call_function" and n.target is _INDUCTOR_RANDOM:
            n.target = _seeded_random
        elif n.op == "call_function" and n.target is _INDUCTOR_RANDINT:
            n.target = _seeded_randint
    gm.graph.set_codegen(boxed())
    gm.recompile()
    forward = gm.forward

    def run(args):
        return forward(args)

    return run


def _seeded_random(size, seed, mode):
    if isinstance(seed, FakeTensor):  # a step captured on fake tensors (remat.plan): no numbers
        return getattr(torch, mode)(size, device=seed.device, dtype=torch.float32)
    return getattr(torch, mode)(size, generator=_generator(seed), device=seed.device, dtype=torch.float32)


def _seeded_randint(low, high, size, seed):
    if isinstance(seed, FakeTensor):
        return torch.randint(low, high, size, device=seed.device)
    return torch.randint(low, high, size, generator=_generator(seed), device=seed.device)


class _SeededInterpreter(torch.fx.Interpreter):
    """Runs ``inductor_random`` / ``inductor_randint`` from their seed, as inductor's kernels
    do. Their eager forms ignore the seed and draw from the global generator, so a graph that
    computes one again in the backward (PyTorch's partitioner does, from a saved seed) would
    get different random numbers than the forward did; seeded, it gets the same ones."""

    def call_function(self, target, args, kwargs):
        if target is _INDUCTOR_RANDOM and len(args) == 3:
            return _seeded_random(*args)
        if target is _INDUCTOR_RANDINT and len(args) == 4:
            return _seeded_randint(*args)
        return super().call_function(target, args, kwargs)


_INDUCTOR_RANDOM = torch.ops.prims.inductor_random.default
_INDUCTOR_RANDINT = torch.ops.prims.inductor_randint.default


def _generator(seed: torch.Tensor) -> torch.Generator:
    gen = torch.Generator(device=seed.device)
    gen.manual_seed(int(seed.item()) & (2**63 - 1))
    return gen


def register_backend() -> None:
    """Make ``backend="remat"`` known to ``torch.compile`` (the package's entry point does it too)."""
    if "remat" not in _BACKENDS:
        reg(name="remat")(remat_backend)
