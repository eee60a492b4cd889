"""remat's partitioner: the hook inductor calls to split a joint graph into forward and backward.

One path for every remat solver: capture the joint graph (:mod:`remat.capture`), plan it
(:func:`remat.solvers.solve`), lower the plan's schedule to the forward and backward modules
(:func:`remat.lower.fx.lower`). PyTorch's own partitioners (``torch-mincut``,
``no-recompute``) run as they are, for comparison, and what they save is reported as a Plan.
If remat cannot plan a graph it warns once and falls back to PyTorch's partitioner, unless
``strict=True``, where it raises an error that names the node and the reason; a budget no
plan meets always raises :class:`~remat.errors.InfeasibleBudgetError`. Training never runs
a plan remat could not check.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import torch.fx as fx
from torch._functorch import config as functorch_config
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from ..capture import joint as tc
from . import torch_offload
from ..capture.to_graph import graph_from_joint
from ..errors import (InfeasibleBudgetError, PlanError, RematBudgetWarning, RematError,
                      RematFallbackWarning, RematOffloadWarning, UnsupportedGraphError)
from ..cost.model import constant_bytes, default_cost_model
from ..plans.budget import REFERENCE_SAVED, TORCH_HEADROOM, Budget, format_bytes
from ..plans.cache import source_hash
from ..plans.step import StepBudget, floor
from ..solvers.cached import cached_solve
from ..solvers.request import Request
from ..plans.plan import Plan
from ..solvers import info
from ..solvers.feasible import staged_schedules_run_as_planned
from ..solvers.auto import MIN_OVERHEAD
from ..solvers.magis.search import reference_seconds
from ..solvers.portfolio import bounded_seconds
from ..solvers.progress import delayed, shown  # delayed: stages on stderr once planning takes > 2 s
from ..solvers.mincut import cut_cost
from ..plans.schedule import Schedule
from ..capture.link import link_for_device
from ..cost.transfer import offload_allowed
from .fallback import fall_back
from .fission import fission_joint
from .fx import lower
from .offload import offload_support
from .options import Options

TORCH_PARTITIONERS: dict[str, Callable] = {"torch-mincut": tc.torch_mincut, "no-recompute": tc.no_recompute,
                                            "torch-offload": torch_offload.torch_offload}

_warned: set[str] = set()


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
        self.param_indices = frozenset(param_indices)
        self.graph_name = graph_name
        self.keeps_order = False  # remat's own plan: compile in its order (remat.lower.plan_order)
        self.channels_last = False  # and the backward's convolutions channels-last, as planned

    def uuid(self) -> str:
        """Everything that decides the partition (the callback does not), so that inductor's
        and AOTAutograd's caches hit only for the same plan."""
        return f"remat-{_source_hash()}-{self.options.key()}"

    def __reduce__(self):
        # inductor pickles its config, this partitioner included, into its cache key: the
        # uuid stands for it (a callback such as on_plan cannot be pickled, nor need it be)
        return (_CacheKey, (self.uuid(),))

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any):
        o = self.options
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices")
        backup = tc.copy_joint(gm)
        try:
            if not info(o.solver).runs_on_graphs:
                return self._torch_baseline(gm, joint_inputs, backup, **kwargs)
            reference = self._reference_saved(backup, joint_inputs, kwargs)
            joint = tc.prepare_joint(gm, num_fwd_outputs, static)
            graph = self._capture(joint, reference)
            joint, plan = self._plan(graph, lambda p: self._split(joint, p, reference, num_fwd_outputs,
                                                                   static), joint)
            fw, bw = lower(joint, plan)
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
                _warn_once(f"remat plans without offloading here: {how}. Pass offload=False to "
                           "plan without it and silence this.", RematOffloadWarning)
        if o.bandwidth is not None:
            device["link"] = {"bandwidth": o.bandwidth, "source": "given"}
        elif kind == "cuda" and works:
            link = _measured_link(kind)
            if link is not None:
                device["link"] = link

    def _plan(self, graph, split=None, joint=None):
        """Plan ``graph`` within its share of the step's budget (:mod:`remat.plans.step`).
        Returns the joint graph to lower and the plan: a plan with fissions is ``split(plan)``
        (:meth:`_split`); where that fails, the graph is planned again without fission, with a
        warning (strict mode raises)."""
        o = self.options
        step = self.step
        share = step.share(graph, constant_bytes(graph)) if o.budget is not None else None
        if share is None:
            budget, headroom = None, 0.0
        elif o.budget.kind == "min":
            budget, headroom = Budget.least(), 0.0
        else:
            budget, headroom = Budget.of_bytes(max(1, share)), TORCH_HEADROOM if o.budget.kind == "bytes" else 0.0

        req = self._solver_for(graph, o.request)  # the request made once at the API

        def solve_within(budget, headroom, on_infeasible=None):
            title = f"remat: planning {graph.name} ({len(graph)} nodes)"
            with shown(title) if o.verbose else delayed(title):
                return cached_solve(graph, req.within(budget, headroom), cache=o.cache,
                                    on_infeasible=on_infeasible)

        def no_plan(e: InfeasibleBudgetError):
            """The solver found no plan at any budget (its time limit ran out first): remat
            cannot plan this graph, so it falls back, a fraction or "min" being a target."""
            raise UnsupportedGraphError(f"{req.solver} found no plan of {graph.name!r} at any "
                                        f"budget ({e.args[0]})") from e

        def least_instead(e: InfeasibleBudgetError) -> Plan:
            """What runs where the share is out of reach (stored in the plan cache with it)."""
            if step.may_refuse(graph):
                raise e  # a byte budget's first graph (or a fraction under strict=True)
            try:
                least = solve_within(Budget.least(), 0.0)
            except InfeasibleBudgetError as again:
                no_plan(again)
            return _out_of_reach(_least_found(e), least)

        on_infeasible = None if budget is None else no_plan if o.budget.kind == "min" else least_instead
        plan = solve_within(budget, headroom, on_infeasible)
        reach = plan.details.get("out_of_reach")
        if reach is not None:
            e = InfeasibleBudgetError(reach["message"], reach.get("smallest_feasible"), plan)
            if step.may_refuse(graph):
                raise e  # stored when this step did not refuse it (strict=False then)
            slower = _slowdown(graph, plan)
            if step.refuse_later(graph, e):  # the step's forward decides (StepBudget.verdict)
                step.floors.append(f"{floor(graph, plan)} {slower}")
            elif o.budget.kind == "fraction" and len(step.graphs) == 0:
                _warn_once(f"{step.missed(graph, plan)}. {slower}", RematBudgetWarning)
            else:
                warnings.warn(
                    f"graph {graph.name!r} (graph {len(step.graphs) + 1} of its step) cannot meet its "
                    f"share of the step's budget {o.budget.text!r} ({format_bytes(share)}); it runs at "
                    f"its least memory, {format_bytes(plan.peak_bytes)}, and the graphs after it get "
                    f"{format_bytes(max(0, plan.peak_bytes - share))} less ({e.args[0][:200]})",
                    RematBudgetWarning, stacklevel=2)
        if o.budget is not None and o.budget.kind == "fraction" and plan.feasible and step.followed(graph):
            plan = self._leave_shares(graph, plan, share, solve_within)
        if split is not None and plan.fissions:
            try:
                joint, plan = split(plan)
            except RematError as e:  # the plan without fission is as safe as any other
                if o.strict or "fission" not in info(o.solver).options:
                    raise
                _warn_once(f"remat could not split {graph.name!r} as planned ({e}); planning it "
                           "without fission")
                req = req.using(options={**req.options, "fission": False})
                plan = solve_within(budget if plan.feasible or budget is None else Budget.least(), headroom,
                                    least_instead if budget is not None else None)
        if o.budget is not None:
            # the budget asked for the step; budget_bytes is this graph's share of it
            plan = plan.updated(options={"budget": o.budget.text, "step_graph": len(step.graphs) + 1})
        step.planned(graph, plan.saved_activation_bytes, plan.peak_bytes)
        self._warn_if_staged(graph)
        return joint, plan

    def _leave_shares(self, graph, plan: Plan, share: int, solve_within) -> Plan:
        """A graph of a step of several, planned within its share of a fraction, whose plan
        saves more than its share of the reference's saved bytes (what the graphs after it
        hold: :meth:`~remat.plans.step.StepBudget.excess_saved`): planned again within its
        share less that excess, which leads the solvers to save less, at most twice; the plan
        that leaves the later graphs most is kept. A DDP step's second bucket at budget 1.0
        had saved 526 KB where PyTorch's partition saves 364 KB, and the step reached 1.08."""
        step = self.step
        for _ in range(2):
            over = step.excess_saved(graph, plan.saved_activation_bytes)
            if over <= 0:
                break
            try:
                tighter = solve_within(Budget.of_bytes(max(1, share - over)), 0.0)
            except InfeasibleBudgetError:
                break
            if step.excess_saved(graph, tighter.saved_activation_bytes) >= over:
                break
            plan = tighter
        return plan

    def _solver_for(self, graph, req: Request) -> Request:
        """The request asked for, or one for ``auto`` where its solver offloads by design and
        plans of ``graph`` may not offload (with one warning; strict mode raises instead)."""
        solver = req.solver
        allowed, why = offload_allowed(graph)
        if allowed or solver not in OFFLOADING_SOLVERS:
            return req
        if self.options.strict:
            raise RematError(f"solver {solver!r} offloads, and this step may not: {why} "
                             "(strict=True: no fallback; use another solver or offload=True)")
        _warn_once(f"solver {solver!r} offloads, and this step may not ({why}); remat plans it "
                   "with 'auto', without offloading, instead", RematOffloadWarning)
        return req.using("auto", {k: v for k, v in req.options.items() if k in info("auto").options})

    def _split(self, joint, plan: Plan, reference, num_fwd_outputs: int, static):
        """The joint graph with the plan's fissions unrolled (:mod:`remat.lower.fission`),
        captured again, and the plan on that capture: its schedule names the parts. The
        simulator judges it there again; a schedule that does not replay raises (and remat
        falls back, or in strict mode reports it)."""
        fissions = list(plan.fissions)
        with functorch_config.patch(cse=False):  # CSE would merge parts that read only shared inputs
            split = tc.prepare_joint(fission_joint(joint.gm, fissions), num_fwd_outputs, static)
        graph = self._capture(split, reference)
        again = Plan.from_schedule(Schedule(graph, list(plan.statements)), solver=plan.solver,
                                   options=dict(plan.options), solve_seconds=plan.solve_seconds,
                                   fissions=plan.fissions, swaps=plan.swaps, link=plan.link,
                                   details=dict(plan.details)).judge(plan.budget, default_cost_model(graph)).sealed()
        if again.status == "invalid":
            raise PlanError(f"the plan's fissions do not replay on the captured graph: {again.message}")
        if plan.budget is not None and not again.feasible:
            raise PlanError(f"with its fissions unrolled, {graph.name!r} peaks at "
                            f"{format_bytes(again.peak_bytes)}, over its budget of {format_bytes(plan.budget)}")
        return split, again

    def _warn_if_staged(self, graph) -> None:
        """A staged solver asked for by name under inductor: its schedule does not run as
        planned (:func:`remat.solvers.feasible.staged_schedules_run_as_planned`), so say so
        once; ``auto`` never picks one there."""
        solver = self.options.solver
        if info(solver).family not in ("checkmate", "baselines") or \
                staged_schedules_run_as_planned(default_cost_model(graph)) or solver in _warned:
            return
        _warned.add(solver)
        warnings.warn(
            f"solver {solver!r} recomputes values several times in the backward; inductor fuses "
            "those copies and runs them early, so the step can peak above the plan (a CNN under "
            "checkmate measured 4.90 MiB against a budget of 4.20 MiB). Use solver='auto', which "
            "keeps to saved sets under inductor, or compiler='eager'.", RematBudgetWarning, stacklevel=2)

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
                                       cost=float(cut_cost(graph, saved))).judge()
            plan.details["transfers"] = torch_offload.offload_transfers(fw)  # torch-offload's copies
            self._report(plan)
        return fw, bw


def _out_of_reach(found: Plan | None, least: Plan) -> Plan:
    """What a graph runs when its share of a budget is out of reach: the smaller of ``found``
    (the least peak the budgeted solve reached, memory first whatever the time) and ``least``
    (``"min"``'s plan, the least memory within :data:`~remat.solvers.auto.MIN_OVERHEAD`), so
    that asking for less never gives more memory than a fraction that is met (Mamba quick:
    0.8 met at 0.70 of plain torch.compile's, 0.6 fell back to min's 0.91 when bounded). The
    warning says how much slower its step is predicted (:func:`_slowdown`)."""
    if found is None or least.peak_bytes is None or found.peak_bytes >= least.peak_bytes:
        return least
    return found


def _slowdown(graph, plan: Plan) -> str:
    """How much slower than plain torch.compile's ``plan``'s step is predicted (a staged
    schedule's time counted :data:`~remat.solvers.portfolio.STAGED_PENALTY` times, its
    prediction the least reliable), and, past ``min``'s bound, what to ask for instead."""
    try:
        ratio = bounded_seconds(plan) / reference_seconds(graph, default_cost_model(graph))
    except Exception:  # noqa: BLE001 - a figure for the warning only
        return ""
    if ratio <= 1.0 + MIN_OVERHEAD:
        return f"Its step is predicted {ratio:.2f}x plain torch.compile's."
    return (f"Its step is predicted {ratio:.1f}x plain torch.compile's: budget='min' keeps the "
            f"step within {1 + MIN_OVERHEAD:g}x for more memory.")


def _least_found(e: InfeasibleBudgetError) -> Plan | None:
    """The plan of least peak the solve that missed the budget found, as a plan to run
    (feasible at its own peak), or None where it has no valid schedule
    (:func:`_out_of_reach` decides)."""
    p = e.plan
    if p is None or p.statements is None or p.peak_bytes is None or p.status == "invalid" \
            or p.sim is None or not p.sim.valid:
        return None
    return p.updated(status="feasible", feasible=True, budget=p.peak_bytes, message="",
                     options={"budget_bytes": p.peak_bytes, "planned_bytes": p.peak_bytes},
                     details={"solver_status": p.status, "missed_budget": p.budget})


def _warn_once(text: str, category: type[Warning] = RematFallbackWarning) -> None:
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, category, stacklevel=3)


OFFLOADING_SOLVERS = ("swap", "swap-recompute")
"""Solvers that offload by design (auto and magis offload only where plans may)."""


@functools.cache
def _measured_link(kind: str) -> dict | None:
    """The link of this process's current ``kind`` device, measured once per process (and
    once per device and torch version across runs: :func:`remat.capture.link.link_for_device`);
    None where it cannot be measured."""
    try:
        return link_for_device(kind)
    except Exception as e:  # noqa: BLE001 - planning goes on with the assumed link
        _warn_once(f"remat could not measure the host link of {kind} ({type(e).__name__}: {e}); "
                   "offloading plans assume one", RematOffloadWarning)
        return None


class _CacheKey(str):
    """What a pickled :class:`RematPartitioner` becomes: its uuid (cache keys only)."""
