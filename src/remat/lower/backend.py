"""The ``"remat"`` dynamo backend: inductor (or no codegen) with remat's partitioner."""

from __future__ import annotations

from typing import Callable

import torch

from .partitioner import RematPartitioner


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


def _eager_compile(gm, example_inputs, partitioner: RematPartitioner):
    """AOTAutograd with inductor's decompositions and joint passes, but no kernel codegen."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    def nop(fx_g, _inputs):
        # interpret the graph with the boxed convention, freeing each value (inputs included)
        # after its last use, as inductor's code does: memory then follows the plan
        def run(args):
            return torch.fx.Interpreter(fx_g, garbage_collect_values=True).boxed_run(args)

        run._boxed_call = True
        return run

    def partition(joint, joint_inputs, **kwargs):
        # inductor's joint passes (random-op rewriting) read V.fake_mode, as under compile_fx
        with V.set_fake_mode(detect_fake_mode(joint_inputs)):
            return partition_fn(joint, joint_inputs, partitioner_fn_override=partitioner, **kwargs)

    return aot_autograd(
        fw_compiler=nop, bw_compiler=nop, inference_compiler=nop, partition_fn=partition,
        decompositions=select_decomp_table(), keep_inference_input_mutations=True,
    )(gm, example_inputs)


def remat_backend(gm: torch.fx.GraphModule, example_inputs, *, solver: str = "mincut",
                  mode: str = "conservative", strict: bool = False, compiler: str = "inductor",
                  on_plan: Callable | None = None, options: dict | None = None,
                  solver_options: dict | None = None, budget: str | float | None = None,
                  time_limit: float | None = 60.0, **_ignored):
    """A dynamo backend: inductor (or, with ``compiler="eager"``, no codegen) with remat's
    partitioner. Registered as ``torch.compile(model, backend="remat")``; options for remat
    go in ``options={"solver": ..., "mode": ..., "strict": ...}`` there."""
    options = dict(options or {})
    solver = options.pop("solver", solver)
    mode = options.pop("remat_mode", options.pop("mode", mode))
    strict = options.pop("strict", strict)
    compiler = options.pop("compiler", compiler)
    on_plan = options.pop("on_plan", on_plan)
    budget = options.pop("budget", budget)
    time_limit = options.pop("time_limit", time_limit)
    part = RematPartitioner(solver, mode, strict, param_indices=_param_indices(gm), on_plan=on_plan,
                            solver_options=solver_options, budget=budget, time_limit=time_limit)
    if compiler == "eager":
        return _eager_compile(gm, example_inputs, part)
    if compiler != "inductor":
        raise ValueError(f"unknown compiler {compiler!r}; use 'inductor' or 'eager'")
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches={"custom_partitioner_fn": part, **options})


def register_backend() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend as reg

    if "remat" not in _BACKENDS:
        reg(name="remat")(remat_backend)
