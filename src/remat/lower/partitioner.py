"""remat's partitioner: the hook inductor calls to split a joint graph into forward and backward.

One path for every remat solver: capture the joint graph (:mod:`remat.capture`), plan it
within its share of the step's budget (:class:`remat.step.planner.StepPlanner`, where every
decision on which plan runs is made), lower the plan's schedule to the forward and backward
modules (:func:`remat.lower.fx.lower`). PyTorch's own partitioners (``torch-mincut``,
``no-recompute``) run as they are, for comparison, and what they save is reported as a Plan.
If remat cannot plan a graph it warns once and falls back to PyTorch's partitioner, unless
``strict=True``, where it raises an error that names the node and the reason; a budget no
plan meets always raises :class:`~remat.errors.InfeasibleBudgetError`. Training never runs
a plan remat could not check.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from ..capture import joint as tc
from ..capture.link import link_for_device
from ..capture.to_graph import graph_from_joint
from ..cost.model import default_cost_model
from ..errors import InfeasibleBudgetError, PlanError, RematError, RematOffloadWarning, UnsupportedGraphError
from ..graph.graph import gc_paused
from ..plans.budget import REFERENCE_OF, REFERENCE_SAVED, format_bytes, reference_figures
from ..plans.cache import source_hash
from ..plans.plan import Plan
from ..solvers import info
from ..solvers.mincut import cut_cost
from ..step.budget import StepBudget
from ..step.planner import OFFLOADING_SOLVERS, StepPlanner, warn_once
from . import torch_offload
from .fallback import fall_back
from .fission import fission_joint
from .fission_loop import loop_key, loop_parts
from .fx import lower
from .offload import offload_support
from .options import Options

TORCH_PARTITIONERS: dict[str, Callable] = {"torch-mincut": tc.torch_mincut, "no-recompute": tc.no_recompute,
                                            "torch-offload": torch_offload.torch_offload}



@functools.cache
def _source_hash() -> str:
    """remat's whole source (lowering and capture too: they decide the compiled modules), by
    the same fingerprint as the plan cache's (:func:`remat.plans.cache.source_hash`)."""
    root = Path(__file__).resolve().parents[1]
    return source_hash(root, sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"))[:16]


class RematPartitioner(CustomPartitionerFn):
    """Inductor's ``custom_partitioner_fn`` running remat on each joint graph.

    ``param_indices``: the joint graph's primal inputs that are parameters; ``graph_name``:
    the name the captured Graph and its Plan carry.
    """

    def __init__(self, options: Options | None = None, param_indices: Collection[int] = (),
                 graph_name: str = "joint", step: StepBudget | None = None) -> None:
        self.options = options or Options.create()
        self.step = step if step is not None else StepBudget(self.options.budget, strict=self.options.strict)
        o = self.options
        self.planner = StepPlanner(o.request, step=self.step, strict=o.strict, cache=o.cache, verbose=o.verbose)
        self.reference = None  # plain torch.compile's saved set for the graph being partitioned
        self.param_indices = frozenset(param_indices)
        self.graph_name = graph_name
        self.keeps_order = False  # remat's own plan: compile in its order (remat.lower.plan_order)
        self.channels_last = False  # and the backward's convolutions channels-last, as planned

    def uuid(self) -> str:
        """Everything that decides the partition (the callback does not), so that inductor's
        and AOTAutograd's caches hit only for the same plan."""
        return f"remat-{_source_hash()}-{self.options.key()}-{loop_key()}"

    def __reduce__(self):
        # inductor pickles its config, this partitioner included, into its cache key: the
        # uuid stands for it (a callback such as on_plan cannot be pickled, nor need it be)
        return (_CacheKey, (self.uuid(),))

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        # The cyclic collector paused while remat partitions: the heap here is the whole
        # compile's, and each full collection scans it (5-6 of them, 3.8-4.3 s, inside a
        # depth-32 Llama's partition). Paused, that partition took 13.0-14.5 s where it took
        # 19.1 s, at 71-75 MB more peak RSS (the garbage waits for the next collection after
        # it): benchmarks/gc_pause.py, BENCHMARKS.md "The collector paused".
        with gc_paused():
            return self._partition(gm, joint_inputs, **kwargs)

    def _partition(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        o = self.options
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices")
        backup = tc.copy_joint(gm)
        self.reference = None
        try:
            if not info(o.solver).runs_on_graphs:
                return self._torch_baseline(gm, joint_inputs, backup, **kwargs)
            # once per graph, and only where it is needed (needs_reference)
            self.reference = reference = (self._reference_saved(backup, joint_inputs, kwargs)
                                          if self.needs_reference() else None)
            joint = tc.prepare_joint(gm, num_fwd_outputs, static)
            graph = self._capture(joint, reference)
            joint, plan = self._plan(graph, lambda p: self._split(joint, p, reference, num_fwd_outputs,
                                                                   static), joint)
            fw, bw = lower(joint, plan)
            if plan.fissions:  # each split region's parts as calls of one subgraph (fission_loop)
                fw, bw = loop_parts(fw, plan.fissions), loop_parts(bw, plan.fissions)
            # a plan's peak holds only in its order: inductor keeps to it (plan_order)
            self.keeps_order = True
            self.channels_last = bool(graph.meta.get("channels_last"))
            self._report(plan)
            return fw, bw
        except InfeasibleBudgetError:
            raise  # the user asked for a bound remat cannot meet: say so, do not ignore it
        except Exception as e:  # noqa: BLE001 - every failure has the same safe answer
            reason = f"{type(e).__name__}: {e}"
            if o.strict:
                if isinstance(e, RematError):
                    raise
                raise UnsupportedGraphError(f"remat could not plan this graph: {reason}") from e
            return fall_back(self, backup, joint_inputs, kwargs, reason)

    def _plan(self, graph, split=None, joint=None):
        """The joint graph to lower and its plan: the step planner's
        (:meth:`~remat.step.planner.StepPlanner.plan`), with its fissions unrolled by
        ``split`` where it has some (``joint`` otherwise)."""
        lowered, plan = self.planner.plan(graph, split)
        return (joint if lowered is None else lowered), plan

    def needs_reference(self) -> bool:
        """Whether the graph's capture records plain torch.compile's partition: where the
        step's budget is a share of it or bounds time by it
        (:meth:`~remat.step.planner.StepPlanner.needs_reference`), and wherever the graph goes
        to the caller (``on_plan``: :func:`remat.plan`, :func:`remat.plan_all`), so that a
        fraction asked of that graph later (``remat.solve(g, budget=0.6)``) means what it means
        in ``remat.compile``."""
        return self.planner.needs_reference() or self.options.on_plan is not None

    @staticmethod
    def _reference_saved(gm: fx.GraphModule, joint_inputs, kwargs) -> list[str] | None:
        """What plain ``torch.compile`` saves: PyTorch's own partition
        (``min_cut_rematerialization_partition`` at its default, ``activation_memory_budget``
        1.0, whatever the user set it to), on a copy of the joint graph: the reference of a
        fractional budget (:func:`remat.plans.budget.reference_peak`). None if it fails; the
        staged reference stands then."""
        try:
            with functorch_config.patch(activation_memory_budget=1.0):
                _, bw = tc.torch_mincut(tc.copy_joint(gm), joint_inputs, **kwargs)
            return tc.saved_from_backward(bw)
        except Exception:  # noqa: BLE001 - a reference only: the planner goes on without it
            return None

    def _capture(self, joint, reference: list[str] | None, opaque: bool = False):
        """The Graph of a prepared joint graph; ``meta["compiler"]`` says how it will run
        (inductor's fused kernels keep fusible values out of memory: the cost model's
        ``fused_memory``), ``meta[REFERENCE_SAVED]`` what plain ``torch.compile`` saves.
        ``opaque``: ops remat cannot plan become opaque nodes (a Graph for judging PyTorch's
        partition where remat falls back: :mod:`remat.lower.fallback`)."""
        graph = graph_from_joint(joint, self.param_indices, name=self.graph_name,
                                 compiler=self.options.planned_compiler, opaque=opaque)
        if self.options.target is not None:  # planned for another device: its record and profile
            graph.meta["device"] = self.options.target.device_meta(graph.meta.get("device") or {})
        if reference is not None:
            graph.meta[REFERENCE_SAVED] = [s for s in reference if s in graph]
        if self.options.outputs == "dropped":
            graph.meta["outputs"] = "dropped"  # the caller drops them as the forward returns
        self._copies(graph)
        return graph

    def _copies(self, graph) -> None:
        """What offloading plans of ``graph`` may do: ``meta["offload"]`` (whether they may
        offload, and why: the ``offload`` option and :func:`remat.lower.offload.offload_support`
        for the graph's device) and the host link they plan with, ``meta["device"]["link"]``:
        the ``bandwidth`` option, else the link measured once for the device
        (:func:`remat.capture.link.link_for_device`)."""
        o = self.options
        device = graph.meta.setdefault("device", {"type": "cpu"})
        kind = device.get("type", "cpu")
        works, how = offload_support(kind)
        if not o.offload:
            graph.meta["offload"] = {"allowed": False, "reason": "offload=False"}
        else:
            graph.meta["offload"] = {"allowed": works, "reason": how}
            if not works and o.solver not in OFFLOADING_SOLVERS:  # those say so in _solver_for
                warn_once(f"remat plans without offloading here: {how}. Pass offload=False to "
                           "plan without it and silence this.", RematOffloadWarning)
        if o.bandwidth is not None:
            device["link"] = {"bandwidth": o.bandwidth, "source": "given"}
        elif kind == "cuda" and works and not device.get("target"):  # a target's link is assumed
            link = _measured_link(kind)
            if link is not None:
                device["link"] = link

    def _split(self, joint, plan: Plan, reference, num_fwd_outputs: int, static):
        """The joint graph with the plan's fissions unrolled (:mod:`remat.lower.fission`),
        captured again, and the plan on that capture: its schedule names the parts. The
        simulator judges it there again; a schedule that does not replay raises (and remat
        falls back, or in strict mode reports it)."""
        fissions = list(plan.fissions)
        with functorch_config.patch(cse=False):  # CSE would merge parts that read only shared inputs
            split = tc.prepare_joint(fission_joint(joint.gm, fissions), num_fwd_outputs, static)
        graph = self._capture(split, reference)
        if plan.graph is not None:  # the step's reference is the unsplit graph's (REFERENCE_OF)
            graph.meta[REFERENCE_OF] = reference_figures(plan.graph)
        again = plan.on_graph(graph).judge(plan.budget, default_cost_model(graph))
        if again.status == "invalid":
            raise PlanError(f"the plan's fissions do not replay on the captured graph: {again.message}")
        if plan.budget is not None and not again.feasible:
            raise PlanError(f"with its fissions unrolled, {graph.name!r} peaks at "
                            f"{format_bytes(again.peak_bytes)}, over its budget of {format_bytes(plan.budget)}")
        return split, again

    def _report(self, plan: Plan) -> None:
        if self.options.on_plan is not None:
            self.options.on_plan(plan.graph, plan)

    def _torch_baseline(self, gm, joint_inputs, backup, **kwargs):
        fw, bw = TORCH_PARTITIONERS[self.options.solver](gm, joint_inputs, **kwargs)
        if self.options.on_plan is not None:
            reference = self._reference_saved(backup, joint_inputs, kwargs)
            joint = tc.prepare_joint(backup, kwargs["num_fwd_outputs"],
                                     kwargs.get("static_lifetime_input_indices"))
            graph = self._capture(joint, reference)
            saved = [s for s in torch_offload.saved_before_offload(bw) if s in graph]
            plan = Plan.from_saved_set(graph, saved, solver=self.options.solver,
                                       cost=float(cut_cost(graph, saved)),
                                       transfers=torch_offload.offload_transfers(fw)).judge()
            self._report(plan)
        return fw, bw


@functools.cache
def _measured_link(kind: str) -> dict | None:
    """The link of this process's current ``kind`` device, measured once per process (and
    once per device and torch version across runs: :func:`remat.capture.link.link_for_device`);
    None where it cannot be measured."""
    try:
        return link_for_device(kind)
    except Exception as e:  # noqa: BLE001 - planning goes on with the assumed link
        warn_once(f"remat could not measure the host link of {kind} ({type(e).__name__}: {e}); "
                   "offloading plans assume one", RematOffloadWarning)
        return None


class _CacheKey(str):
    """What a pickled :class:`RematPartitioner` becomes: its uuid (cache keys only)."""
