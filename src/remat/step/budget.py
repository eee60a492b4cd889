"""A budget for the whole training step when the step is several graphs (no torch).

A graph break, DDP's buckets (DDPOptimizer) and FSDP2's blocks split one training step into
graphs that run in order: the forwards ``1..N``, then the backwards ``N..1``. While graph
``k`` runs, every earlier graph holds the activations it saved for its backward, and no
later graph holds anything yet. So the step's activation memory is, at its peak,
``max_k (sum_{j<k} saved_j + act_k)``, where ``act_k`` is graph ``k``'s own peak above what
it holds anyway. :class:`StepBudget` shares a budget among the graphs in that order, as
they are planned (the order PyTorch compiles them in, which is the order they run in):

- a **fraction** ``f``: graph ``k`` may use ``f * (sum_{j<k} ref_saved_j + ref_act_k)`` (the
  same prefix of the step without recomputation) less what the graphs before it saved. A
  graph that saves less than its share leaves the rest to the graphs after it; when every
  graph keeps to its share, the step keeps to ``f`` of its activation memory;
- **bytes** ``B``: graph ``k`` may peak at ``B`` less what the graphs before it saved and
  less the parameters of the model that are not its own (``outside_bytes``, with their
  gradients), so that the whole step stays within ``B``. Gradients a training loop keeps
  between steps (``zero_grad(set_to_none=False)``) are resident beside the new ones the
  backward allocates: :meth:`StepBudget.held_gradients` takes them off too once seen;
- ``"min"``: every graph at its least memory.

A graph alone in its step gets exactly the budget it would get on its own. When a graph
cannot meet its share, it gets its least-memory plan, a
:class:`~remat.errors.RematBudgetWarning` says by how much it is over, and the graphs after
it get less; it is refused (:class:`~remat.errors.InfeasibleBudgetError`) only when the step
as a whole cannot meet the budget either:

- a byte budget: the first graph's peak is part of the step's, so a first graph that cannot
  fit is refused at once;
- a fraction: a graph's share is of the step's activation memory *so far*, but the step's
  may be larger (a graph break: later graphs peak higher). When ``remat.compile`` wraps a
  module, it decides after the step's forward, when every graph of the step is planned
  (:meth:`StepBudget.verdict`): if the step, with the graphs that could not meet their shares
  at their least memory, peaks within the fraction of its whole activation memory, it runs
  (one warning); if not, the step is refused. With a plain function, a first graph that
  cannot meet its share is refused at once, the others warn. DDP's bucket graphs are known
  to come in numbers (``submod`` in their names).

>>> from remat.graph.examples import cos_cos_graph
>>> from remat.plans.budget import Budget
>>> step = StepBudget(Budget.parse(0.5))
>>> g = cos_cos_graph()
>>> step.share(g) == Budget.parse(0.5).bytes_for(g)  # alone: the graph's own budget
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..cost.model import storage
from ..errors import InfeasibleBudgetError
from ..graph.graph import Graph
from ..plans.budget import Budget, activation_bytes, format_bytes, reference_saved, resident_bytes
from ..plans.saved_set import required_forward


@dataclass
class _Planned:
    name: str
    ref_saved: int  # bytes the graph saves for its backward without recomputation
    saved: int  # bytes its plan saves
    ref_act: int = 0  # its activation memory without recomputation
    act: int = 0  # its plan's peak above its inputs and parameters


@dataclass
class StepBudget:
    """The budget of one training step, shared among its graphs as they are planned.
    ``model_bytes``: the model's parameter bytes (for byte budgets: the part a graph's own
    accounting does not see, and its gradients, is taken off its share; 0 when unknown)."""

    budget: Budget | None
    model_bytes: int = 0
    graphs: list[_Planned] = field(default_factory=list)
    kept_gradients: int = 0  # bytes of gradients held from the step before, taken off a byte budget
    defer: bool = False  # a fraction's missed shares wait for verdict() (remat.compile on a module)
    pending: Exception | None = None  # the first graph's refusal, waiting for verdict()
    over: bool = False  # a graph could not meet its share since the last verdict()
    strict: bool = False  # a fraction no plan reaches is an error (else the least memory, a warning)
    floors: list[str] = field(default_factory=list)  # why graphs that missed their shares cannot go lower
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (graph, reason) run by PyTorch's partitioner

    def fell_back(self, name: str, reason: str) -> bool:
        """Note that graph ``name`` runs PyTorch's partition because remat could not plan it
        (``reason``); True the first time for that graph and reason (warn then)."""
        if (name, reason) in self.fallbacks:
            return False
        self.fallbacks.append((name, reason))
        return True

    def held_gradients(self, nbytes: int) -> str | None:
        """Note that ``nbytes`` of gradients are held as a step starts. Returns a warning's
        text when a byte budget's plans were made without them: the step may then exceed the
        budget by up to that much (graphs planned from now on take them off their share)."""
        if nbytes <= self.kept_gradients:
            return None
        self.kept_gradients = int(nbytes)
        if not self.graphs or self.budget is None or self.budget.kind != "bytes":
            return None
        return (f"the step starts with {format_bytes(nbytes)} of gradients kept from the step "
                f"before (zero_grad(set_to_none=False)), which the backward's new gradients add "
                f"to: the plans for budget {self.budget.text!r} were made without them and the "
                f"step may exceed it by that much. Use zero_grad(set_to_none=True) (PyTorch's "
                f"default), or torch._dynamo.reset() to plan again with them counted")

    @property
    def first(self) -> bool:
        return not self.graphs

    def share(self, g: Graph, own_param_bytes: int = 0) -> int | None:
        """The bytes graph ``g`` may peak at (its own accounting: its inputs, parameters and
        kept values included); None without a budget; 0 for ``"min"``. A graph that comes
        at or before a graph already planned (a recompile: new shapes, or a new step) starts
        the step again from its place."""
        key = _position(g.name)
        self.graphs = [p for p in self.graphs if _position(p.name) < key]
        b = self.budget
        if b is None:
            return None
        if b.kind == "min":
            return 0
        held = sum(p.saved for p in self.graphs)
        if b.kind == "fraction":
            ref = sum(p.ref_saved for p in self.graphs) + activation_bytes(g)
            return int(resident_bytes(g) + max(0.0, b.value * ref - held))
        outside = max(0, self.model_bytes - own_param_bytes) * 2  # parameters and gradients
        return int(b.value) - held - outside - self.kept_gradients

    def excess_saved(self, g: Graph, saved_bytes: int) -> int:
        """For a fraction: how many bytes more than its share of the reference's saved bytes
        ``g``'s plan would leave the graphs after it holding (``f * sum_{j<=k} ref_saved_j``
        less what the graphs before it saved); 0 or less when it leaves them their shares. A
        plan may peak within its share yet save more than plain torch.compile's partition
        does (the conservative min cut saves what it need not recompute), which takes memory
        from every later graph of the step."""
        if self.budget is None or self.budget.kind != "fraction":
            return 0
        held = sum(p.saved for p in self.graphs)
        ref = sum(p.ref_saved for p in self.graphs) + reference_saved_bytes(g)
        return int(saved_bytes - (self.budget.value * ref - held))

    def followed(self, g: Graph) -> bool:
        """Whether other graphs of the step are known to follow ``g`` or precede it (so that
        what it saves matters to them): a DDP bucket, or a graph after the step's first."""
        return bool(self.graphs) or _is_bucket(g.name)

    def planned(self, g: Graph, saved_bytes: int, peak_bytes: int | None = None) -> None:
        """Record that ``g``'s plan saves ``saved_bytes`` for its backward and peaks at
        ``peak_bytes`` (its own accounting)."""
        act = max(0, int(peak_bytes) - resident_bytes(g)) if peak_bytes is not None else 0
        if self.budget is None or self.budget.kind != "fraction":
            # only a fraction is a share of the reference: no reference is simulated for the others
            self.graphs.append(_Planned(g.name, 0, int(saved_bytes), 0, act))
            return
        self.graphs.append(_Planned(g.name, reference_saved_bytes(g), int(saved_bytes),
                                    activation_bytes(g), act))

    @property
    def deferred(self) -> bool:
        """Whether missed shares are judged by :meth:`verdict` after the step's forward."""
        return self.defer and self.budget is not None and self.budget.kind == "fraction"

    def may_refuse(self, g: Graph) -> bool:
        """Whether an infeasible share of ``g`` is an error now (see the module docstring): a
        byte budget's first graph; a fraction's only under ``strict``."""
        if self.budget is not None and self.budget.kind == "fraction" and not self.strict:
            return False
        return self.first and not _is_bucket(g.name) and not self.deferred

    def missed(self, g: Graph, plan) -> str:
        """Note that ``g`` runs at its least memory, ``plan``, having missed its share of a
        fraction; returns the warning's text: the fraction of its own activation memory under
        plain torch.compile it reaches, and why it cannot go lower (:func:`floor`)."""
        why = floor(g, plan)
        reached = max(0, plan.peak_bytes - resident_bytes(g)) / activation_bytes(g)
        return (f"budget {self.budget.text!r} is out of reach for {g.name!r}: the least memory remat "
                f"finds for it is {reached:.2f} of its activation memory under plain torch.compile "
                f"({format_bytes(max(0, plan.peak_bytes - resident_bytes(g)))} of "
                f"{format_bytes(activation_bytes(g))} above its inputs and parameters), and it runs "
                f"at that. {why} A fraction is a target: pass strict=True to make this an error")

    def refuse_later(self, g: Graph, error: Exception) -> bool:
        """Note that ``g`` could not meet its share and runs at its least memory. Returns
        False when that is an error now (a byte budget's first graph, or refusals not
        deferred); with a fraction and deferred refusals, :meth:`verdict` decides after the
        step's forward (``error`` is kept for it when ``g`` is the first graph), and so does a
        warning for any other graph."""
        if self.deferred:
            self.over = True
            if self.first and not _is_bucket(g.name):
                self.pending = error
        return self.deferred

    def step_activation(self, planned: bool = False) -> int:
        """The step's activation memory from the graphs planned,
        ``max_k (sum_{j<k} saved_j + act_k)``: without recomputation (their reference saved
        bytes and activation memory), or with their plans (``planned``)."""
        best = held = 0
        for p in self.graphs:
            best = max(best, held + (p.act if planned else p.ref_act))
            held += p.saved if planned else p.ref_saved
        return best

    def verdict(self) -> tuple[Exception | None, str | None]:
        """After the step's forward, when every graph of it is planned, for a fraction some of
        whose graphs could not meet their shares: ``(error, None)`` when the step, its graphs
        at the plans they got (those at their least memory included), peaks above the fraction
        of its whole activation memory; else ``(None, warning text)``. ``(None, None)`` when
        every graph met its share."""
        error, over, self.pending, self.over = self.pending, self.over, None, False
        if not over or not self.graphs:
            return None, None
        reference, planned = self.step_activation(), self.step_activation(planned=True)
        allowed = self.budget.value * reference
        names = ", ".join(repr(p.name) for p in self.graphs)
        reached = planned / max(1, reference)
        if planned > allowed:
            who = (repr(self.graphs[0].name) if len(self.graphs) == 1
                   else f"the step's {len(self.graphs)} graphs ({names}) together")
            text = (f"budget {self.budget.text!r} is out of reach for {who}: at the least memory remat "
                    f"finds for the graphs that could not meet their shares, the step peaks "
                    f"{format_bytes(planned)} above its inputs and parameters, {reached:.2f} of its "
                    f"activation memory under plain torch.compile ({format_bytes(reference)}); the "
                    f"budget allows {format_bytes(allowed)}.")
            floors, self.floors = " ".join(dict.fromkeys(self.floors)), []
            if self.strict:
                if error is not None and len(self.graphs) == 1:
                    return error, None  # a graph alone: its own error says it best
                return InfeasibleBudgetError(f"{text} Ask for {reached:.2f} or more, or 'min' "
                                             "(strict=True: a fraction out of reach is an error)",
                                             plan=getattr(error, "plan", None)), None
            return None, (f"{text} The step runs at that, {reached:.2f}. {floors} A fraction is a "
                          "target: pass strict=True to make this an error")
        self.floors = []
        return None, (f"some graphs of the step ({names}) could not meet their shares of "
                      f"{self.budget.text!r} and run at their least memory, but the step as a whole "
                      f"fits: it peaks {format_bytes(planned)} above its inputs and parameters, within "
                      f"{self.budget.text!r} of its activation memory ({format_bytes(allowed)})")


def floor(g: Graph, plan) -> str:
    """Why ``plan`` (a graph's least-memory plan) cannot go lower, and what would lower it:
    where its peak falls, what the step's gradients take, its largest tensor."""
    a = g._arrays
    nodes = g.nodes
    where = ""
    statements = plan.statements or []
    peak_at = getattr(plan.sim, "peak_statement", -1) if plan.sim is not None else -1
    if 0 <= peak_at < len(statements):
        node = (plan.graph or g)[statements[peak_at].node]  # a plan with fissions: the split graph's
        where = f" in the {'forward' if node.is_forward else 'backward'} (at {node.name})"
    grads = int(sum(int(a.bytes[i]) for i in range(a.n) if a.is_output[i] and not a.forward[i]))
    big = max((n for n in nodes if not n.is_primal and n.role != "tangent"), key=lambda n: n.bytes, default=None)
    largest = f"; its largest tensor, {big.name}, takes {format_bytes(big.bytes)}" if big is not None else ""
    dropped = (g.meta or {}).get("outputs") == "dropped"
    hint = "" if dropped else " outputs='dropped' where the caller drops the model's outputs as the forward returns,"
    return (f"Its floor: at its least memory it peaks{where} at {format_bytes(max(0, plan.peak_bytes - resident_bytes(g)))} "
            f"above its inputs and parameters; the gradients it returns take {format_bytes(grads)}{largest}. "
            f"What would lower it:{hint} a smaller batch or sequence, or computing its largest "
            f"tensors in chunks (a chunked loss for a language model's logits).")


def _is_bucket(name: str) -> bool:
    """A DDP bucket's graph (``..._submodK``, :func:`remat.lower.backend._graph_name`): one of
    several known to come."""
    return "_submod" in name


def _position(name: str) -> tuple[int, int]:
    """Where a graph runs in its step, from its name ``{label}_{frame}_{recompile}[_submodK]``
    (dynamo's frame number, DDP's bucket); unknown names come last."""
    m = re.search(r"_(\d+)_\d+(?:_submod_?(\d+))?$", name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (1 << 30, 0)


def reference_saved_bytes(g: Graph) -> int:
    """Bytes ``g``'s reference saves for its backward: what plain ``torch.compile``'s
    partition saves where capture recorded it (:func:`~remat.plans.budget.reference_saved`),
    else every value the forward computes that something outside the forward reads (a
    backward node, or a forward node only the backward needs); inputs and parameters are
    resident anyway, each storage counts once."""
    saved = reference_saved(g)
    if saved is not None:  # counted as a plan counts what it saves (Plan.saved_activation_bytes)
        from ..plans.plan import Plan

        return int(g._derived(("reference_saved_bytes", tuple(saved)),
                              lambda g: Plan.from_saved_set(g, list(saved), solver="torch-mincut").saved_activation_bytes))
    a = g._arrays
    owner, sizes = storage(g)
    req = required_forward(g)
    ptr, users = a.user_lists
    held = {owner[i] for i in range(a.n) if req[i] and not a.primal[i]
            and any(not req[u] for u in users[ptr[i]:ptr[i + 1]])}
    return int(sum(sizes[o] for o in held))
