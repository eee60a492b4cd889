"""remat's partitioner: the hook inductor calls to split a joint graph into forward and backward.

:class:`RematPartitioner` captures the joint graph, plans it with a remat solver and builds
the forward/backward modules from the chosen saved set. If anything in that fails it warns
once and falls back to PyTorch's own partitioner, unless ``strict=True``, where it raises an
error that names the node and the reason. Training never crashes because remat could not plan.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from ..capture import joint as tc
from ..capture.to_graph import graph_from_joint
from ..errors import InfeasibleBudgetError
from ..errors import RematError, UnsupportedGraphError
from ..graph.graph import Graph
from ..plans.plan import Plan
from ..solvers import SOLVERS, solve

TORCH_PARTITIONERS: dict[str, Callable] = {"torch-mincut": tc.torch_mincut, "no-recompute": tc.no_recompute}
ALL_SOLVERS = tuple(SOLVERS) + tuple(TORCH_PARTITIONERS)


class RematFallbackWarning(UserWarning):
    """remat could not plan a graph and used PyTorch's own partitioner instead."""


_warned: set[str] = set()


def _source_hash() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


class RematPartitioner(CustomPartitionerFn):
    """Inductor's ``custom_partitioner_fn`` running a remat solver.

    ``on_plan(graph, plan)`` is called for every graph planned (for inspection and tests).
    """

    def __init__(self, solver: str = "mincut", mode: str = "conservative", strict: bool = False,
                 param_indices: Collection[int] = (), on_plan: Callable[[Graph, Plan], Any] | None = None,
                 solver_options: dict | None = None, budget: str | float | None = None,
                 time_limit: float | None = 60.0) -> None:
        if budget is not None:
            from ..solvers.auto import budget_solvers
            from ..plans.budget import parse_budget

            parse_budget(budget)  # a clear error now for a malformed budget
            if solver == "mincut":
                solver = "auto"
            names = ("auto", *budget_solvers())
            if solver not in names:
                raise ValueError(f"solver {solver!r} does not take a memory budget; choose one of {names}")
        elif solver not in ALL_SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {ALL_SOLVERS} "
                             "(or pass budget= for the budgeted solvers)")
        if mode not in ("conservative", "aggressive"):
            raise ValueError(f"unknown mode {mode!r}; choose 'conservative' or 'aggressive'")
        self.solver = solver
        self.mode = mode
        self.strict = strict
        self.param_indices = frozenset(param_indices)
        self.on_plan = on_plan
        self.solver_options = dict(solver_options or {})
        self.fell_back: list[str] = []
        self.budget = budget
        self.time_limit = time_limit

    def uuid(self) -> str:
        opts = sorted(self.solver_options.items())
        return (f"remat-{_source_hash()}-{self.solver}-{self.mode}-{self.strict}-{opts}"
                f"-{self.budget}-{self.time_limit}")

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices")
        backup = tc.copy_joint(gm)
        try:
            if self.solver in TORCH_PARTITIONERS:
                return self._torch_baseline(gm, joint_inputs, backup, **kwargs)
            joint = tc.prepare_joint(gm, num_fwd_outputs, static)
            graph = graph_from_joint(joint, self.param_indices)
            if self.budget is not None:
                return self._budgeted(joint, graph)
            options = {"mode": self.mode, **self.solver_options}
            plan = solve(graph, self.solver, **options)
            by_name = {n.name: n for n in joint.gm.graph.nodes}
            fw, bw = tc.partition_with_saved(joint, [by_name[s] for s in plan.saved_names])
            plan.graph = graph
            if self.on_plan is not None:
                self.on_plan(graph, plan)
            return fw, bw
        except InfeasibleBudgetError:
            raise  # the user asked for a bound remat cannot meet: say so, do not ignore it
        except Exception as e:  # noqa: BLE001 - every failure has the same safe answer
            reason = f"{type(e).__name__}: {e}"
            if self.strict:
                if isinstance(e, RematError):
                    raise
                raise UnsupportedGraphError(f"remat could not plan this graph: {reason}") from e
            self.fell_back.append(reason)
            if reason not in _warned:
                _warned.add(reason)
                warnings.warn(
                    f"remat could not plan a graph ({reason}); using PyTorch's own partitioner for "
                    "it. Pass strict=True to raise instead.", RematFallbackWarning, stacklevel=2)
            return tc.torch_mincut(backup, joint_inputs, **kwargs)

    def _budgeted(self, joint, graph):
        from ..plans.budget import TORCH_HEADROOM, resolve_budget
        from ..solvers.auto import plan_within
        from .fx import lower

        result = plan_within(graph, self.budget, self.solver, time_limit=self.time_limit,
                             headroom=TORCH_HEADROOM, **self.solver_options)
        fw, bw, saved = lower(joint, result.schedule)
        plan = Plan.from_saved_set(
            graph, saved, solver=result.solver,
            options={"budget": self.budget, "budget_bytes": resolve_budget(graph, self.budget),
                     "planned_bytes": int(result.budget), **self.solver_options},
            cost=result.cost, solve_seconds=result.solve_seconds,
            stats={"peak_bytes": result.peak_bytes, "status": result.status, "gap": result.gap,
                   "schedule_recomputes": result.sim.recomputes if result.sim else None})
        plan.graph = graph
        plan.schedule = result.schedule
        if self.on_plan is not None:
            self.on_plan(graph, plan)
        return fw, bw

    def _torch_baseline(self, gm, joint_inputs, backup, **kwargs):
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        fw, bw = TORCH_PARTITIONERS[self.solver](gm, joint_inputs, **kwargs)
        if self.on_plan is not None:
            joint = tc.prepare_joint(backup, num_fwd_outputs, kwargs.get("static_lifetime_input_indices"))
            graph = graph_from_joint(joint, self.param_indices)
            saved = [s for s in tc.saved_from_backward(bw) if s in graph]
            from ..solvers.mincut.mincut import cut_cost

            plan = Plan.from_saved_set(graph, saved, solver=self.solver, options={},
                                       cost=float(cut_cost(graph, saved, self.mode)))
            plan.graph = graph
            self.on_plan(graph, plan)
        return fw, bw

