"""The planner behind :func:`remat.checkpoint` and :func:`remat.policy`, and ``remat.policy``.

A :class:`Planner` owns the blocks of one model. A forward pre-hook on each block computes the
call's signature (block class, the shapes, dtypes and devices of its tensor arguments, the
autocast state, train/eval); a signature seen for the first time is captured
(:mod:`remat.eager.capture`) and costed (:mod:`remat.eager.plan`), and the step is planned
again: one frontier point per block, within the budget. Plans are cached by signature, so new
input shapes plan once more and old ones are reused.

The ``context_fn`` (:meth:`Planner.context_fn`) gives ``torch.utils.checkpoint`` a fresh SAC
policy per checkpointed call. At its first op the policy looks up which block is running (set
by the block's pre-hook) and binds that block's decisions for the whole call: op call
``(func, k)`` (the k-th call of ``func`` in the block, SAC's own numbering) is ``MUST_SAVE``
when the plan saves it, else ``PREFER_RECOMPUTE``. torch asks the policy only in the forward;
the recomputation reads SAC's cache, so a plan that changes between steps never splits a call.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..errors import InfeasibleBudgetError, OptionError, RematBudgetWarning, RematFallbackWarning, RematOffloadWarning
from ..cost.model import DeviceProfile
from ..plans.budget import Budget, format_bytes
from .blocks import find_blocks
from .capture import _autocast_state, capture_block, storage_bytes, storage_key
from .lm_head import HEAD
from .plan import BlockPlan, Choice, Outside, block_plan, choose, step_peak

_profiles: dict = {}


def device_profile(device: str = "cpu"):
    """The measured :class:`~remat.cost.model.DeviceProfile` of ``device`` (once per device and
    torch version, stored beside the plan cache; :func:`remat.cost.calibrate.profile_for` leaves
    the random state as it was)."""
    from ..cost.calibrate import profile_for

    return profile_for("cuda" if str(device).startswith("cuda") else "cpu")


def sac_overhead() -> float:
    """Seconds selective checkpointing adds per op call over plain checkpointing on this machine
    (:func:`remat.cost.calibrate.sac_overhead`: measured once per CPU and torch version, stored
    beside the plan cache; ``_profiles["sac"]`` overrides it)."""
    if "sac" not in _profiles:
        from ..cost.calibrate import sac_overhead as measured

        _profiles["sac"] = measured()
    return _profiles["sac"]


def _sig(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), str(x.dtype), x.device.type, bool(x.requires_grad))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)):
        return tuple(_sig(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((str(k), _sig(v)) for k, v in x.items()))
    return type(x).__name__


def _raw_forward(module: torch.nn.Module):
    """The module's own forward, below transformers' checkpointing wrapper (which would
    checkpoint the capture itself)."""
    fwd = type(module).forward
    # only transformers' own wrapper (functools.wraps keeps the name, not the code's)
    while getattr(getattr(fwd, "__code__", None), "co_name", "") == "forward_with_checkpointing" and \
            getattr(fwd, "__wrapped__", fwd) is not fwd:
        fwd = fwd.__wrapped__
    return fwd.__get__(module)


def _is_hf_layer(module) -> bool:
    return hasattr(module, "gradient_checkpointing") and hasattr(module, "_can_checkpoint_with_cache")


FULL = "full"
"""The eager default budget: full checkpointing's predicted peak, with the least recomputation
that keeps it (``budget=None`` is no budget, as everywhere: the step without checkpointing)."""


def _eager_budget(budget) -> "Budget | str | None":
    """``budget`` as the eager planner reads it: :data:`FULL`, None (no budget) or a
    :class:`~remat.plans.budget.Budget`."""
    if isinstance(budget, str) and budget.strip().lower() == FULL:
        return FULL
    return None if budget is None else Budget.parse(budget)


class Planner:
    """The blocks of one model, their plans (cached by call signature) and the step's choice."""

    def __init__(self, model: torch.nn.Module, *, budget=FULL, blocks=None, strict: bool = False,
                 profile=None, offload: bool = False, single: bool = False,
                 sac_overhead_s: float | None = None, head: bool = False) -> None:
        if not isinstance(model, torch.nn.Module):
            raise OptionError(f"remat plans the blocks of a torch.nn.Module, not {type(model).__name__}")
        if not isinstance(strict, bool):
            raise OptionError(f"strict must be True or False, not {strict!r}")
        if not isinstance(offload, bool):
            raise OptionError(f"offload must be True (offload where it pays) or False, not {offload!r}")
        if profile is not None and not isinstance(profile, DeviceProfile):
            raise OptionError(f"profile must be a remat.cost.model.DeviceProfile (None: measured on the "
                              f"device), not {profile!r}")
        self.model = model
        self.budget = _eager_budget(budget)
        self.strict = strict
        self.profile = profile
        self.offload = offload
        self.single = bool(single)
        self.sac_overhead = sac_overhead_s
        self.blocks = [("", model)] if single else find_blocks(model, blocks)
        if not self.blocks:
            raise OptionError(f"no blocks found in {type(model).__name__}: name them with blocks= (a class, "
                              "a list of module names, or a predicate f(name, module) -> bool)")
        self.order = {name: k for k, (name, _) in enumerate(self.blocks)}
        self._modules = dict(self.blocks)
        self.plans: dict[tuple, BlockPlan] = {}
        self.block_key: dict[str, tuple] = {}
        self.choice: dict[str, object] = {}
        self.last: Choice | None = None
        self.targets: dict = {}
        self.outside = Outside()
        self.outside_measured = False
        self._outside_by_sig: dict = {}
        self._root_sig = None
        self._before = None
        self.hf_route = False
        self._tls = threading.local()
        self._handles: list = []
        self._offloader = None
        self._link = None
        self._warned: set = set()
        self._measure: dict | None = None
        self._input_keys: set = set()
        self.head = None  # remat.eager.lm_head.LMHead when the step's head is planned
        self.head_front: list | None = None
        self.head_why: str | None = None
        if head and not single:
            from .lm_head import find_causal_lm

            self.head = find_causal_lm(model)

    # -- hooks ---------------------------------------------------------------------------------
    def install_hooks(self) -> None:
        """Pre/post hooks on each block (which block runs; plan new signatures) and on the root
        (what autograd saves outside the blocks, measured in steps that planned something)."""
        for name, m in self.blocks:
            self._handles.append(m.register_forward_pre_hook(partial(self._pre_hook, name), with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post_hook, always_call=True))
        if not (len(self.blocks) == 1 and self.blocks[0][1] is self.model):
            self._handles.append(self.model.register_forward_pre_hook(self._root_pre, with_kwargs=True))
            self._handles.append(self.model.register_forward_hook(self._root_post, always_call=True))

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre_hook(self, name, module, args, kwargs):
        self._tls.current = name
        if self._measure is not None and self._before is None:
            self._before = set(self._measure)
        if torch.is_grad_enabled() and module.training and not getattr(self._tls, "inside", False):
            self.prepare(name, module, _raw_forward(module), args, kwargs)
        return None

    def _post_hook(self, module, args, output):
        self._tls.current = None
        return None

    def _root_pre(self, module, args, kwargs):
        if self._measure is not None or not torch.is_grad_enabled() or not module.training:
            return None
        sig = _sig((tuple(args), dict(kwargs)))
        known = self._outside_by_sig.get(sig)
        if known is not None:  # inputs of a shape seen before: their outside is known
            if known != self.outside or not self.outside_measured:
                self.outside, self.outside_measured = known, True
                self.replan()
            return None
        # new input shapes: measure what autograd saves outside the blocks in this forward
        self._root_sig = sig
        self.outside_measured = False
        self._measure = {}
        self._before = None
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        hooks.__enter__()
        self._measure_ctx = hooks
        return None

    def _root_post(self, module, args, output):
        if self._measure is None:
            return None
        try:
            self._measure_ctx.__exit__(None, None, None)
        finally:
            measured, self._measure = self._measure, None
        params = {storage_key(p) for p in self.model.parameters()} | {storage_key(b) for b in self.model.buffers()}
        seen = {k: b for k, b in measured.items() if k not in params and k not in self._input_keys}
        before = set(self._before or ())
        after = [b for k, b in seen.items() if k not in before]
        kept = 0
        from torch.utils._pytree import tree_flatten
        flat = tree_flatten(output if not hasattr(output, "to_tuple") else output.to_tuple())[0]
        planned = getattr(output, "logits", None) if self.head_front else None  # in the head's points
        for t in {storage_key(t): t for t in flat if isinstance(t, torch.Tensor) and t is not planned}.values():
            if storage_key(t) not in seen and t.numel() > 1:
                kept += storage_bytes(t)
        self.outside = Outside(before=sum(b for k, b in seen.items() if k in before),
                               after=sum(after) + 2 * max(after, default=0), kept=kept)
        self.outside_measured = True
        self._outside_by_sig[self._root_sig] = self.outside
        self._input_keys = set()
        self.replan()
        return None

    def _pack(self, t):
        if isinstance(t, torch.Tensor) and getattr(self._tls, "current", None) is None and self._measure is not None:
            self._measure[storage_key(t)] = storage_bytes(t)
        return t

    # -- planning ------------------------------------------------------------------------------
    def signature(self, module, args, kwargs) -> tuple:
        cls = f"{type(module).__module__}.{type(module).__qualname__}"
        return (cls, _sig(tuple(args)), _sig(dict(kwargs)), _autocast_state(), bool(module.training))

    def prepare(self, name: str, module, forward, args, kwargs):
        """The block's plan and chosen point for this call, capturing and planning a new signature."""
        if self._measure is not None:
            for a in args:
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    self._input_keys.add(storage_key(a))
        key = self.signature(module, args, kwargs)
        bp = self.plans.get(key)
        if bp is None:
            self._tls.inside = True
            try:
                cap = capture_block(forward, tuple(args), dict(kwargs), module)
            finally:
                self._tls.inside = False
            device = getattr(cap, "device", "cpu")
            profile = self.profile or device_profile(device)
            overhead = self.sac_overhead if self.sac_overhead is not None else sac_overhead()
            bp = self.plans[key] = block_plan(key, type(module).__name__, cap, profile, overhead,
                                              offload=self._offload_chooser(device))
            if not bp.supported:
                warnings.warn(f"remat leaves {type(module).__name__} blocks ({name or 'the block'}) unwrapped "
                              f"(no checkpointing): {cap.reason}", RematFallbackWarning, stacklevel=3)
            self.block_key[name] = key
            self.replan()
        elif self.block_key.get(name) != key:
            self.block_key[name] = key
            self.replan()
        return bp, self.choice.get(name)

    def _keys(self) -> list:
        """The signature of each block: the one it was last called with, else the last one seen
        for its class (a block not called yet is assumed to run like its siblings)."""
        by_class = {}
        for name, m in self.blocks:
            if name in self.block_key:
                by_class[type(m)] = self.block_key[name]
        return [self.block_key.get(name, by_class.get(type(m))) for name, m in self.blocks]

    def _resident(self) -> int:
        seen = {}
        for p in self.model.parameters():
            seen[storage_key(p)] = storage_bytes(p) * (2 if p.requires_grad else 1)
        for b in self.model.buffers():
            seen[storage_key(b)] = storage_bytes(b)
        return sum(seen.values())

    def replan(self) -> None:
        """Choose one frontier point per block for the whole step, within the budget."""
        keys = self._keys()
        names, fronts, plans = [], [], []
        for (name, m), key in zip(self.blocks, keys):
            bp = self.plans.get(key) if key is not None else None
            if bp is None or not bp.supported:
                continue
            names.append(name)
            # one block alone (remat.policy(block, x)): its budget is of what it holds until its
            # backward, the rest of the step being the caller's
            fronts.append([dataclasses.replace(p, live=0) for p in bp.frontier] if self.single else bp.frontier)
            plans.append(bp)
        fulls = [dataclasses.replace(bp.full, live=0) if self.single else bp.full for bp in plans]
        if self.head_front:  # the head runs after the blocks: its backward first
            names.append(HEAD)
            fronts.append(self.head_front)
            fulls.append(self.head_front[0])  # full checkpointing keeps the model's own head
        eager = step_peak([f[0] for f in fronts], self.outside)
        full = step_peak(fulls, self.outside)
        b = self.budget
        if b == FULL:
            target, asked = full, "full checkpointing's peak"
        elif b is None:  # no budget: the step without checkpointing, no recomputation
            target, asked = eager, "no budget"
        elif b.kind == "min":
            target, asked = None, "min"
        elif b.kind == "fraction":
            target, asked = int(b.value * eager), f"{b.value:g} of the peak without checkpointing"
        else:
            target, asked = max(int(b.value) - self._resident(), 0), f"{format_bytes(int(b.value))} for the step"
        if b == FULL:
            # full checkpointing's peak: the blocks may keep more only where the bytes the
            # prediction is sure of leave room (its gradient estimate is left out, so a
            # pessimistic estimate does not make room that the real step lacks)
            sure = [[dataclasses.replace(p, live=p.live - p.gradients) for p in f] for f in fronts]
            target = step_peak([dataclasses.replace(p, live=p.live - p.gradients) for p in fulls], self.outside)
            c = choose(sure, target, self.outside)
            by_point = [{id(q): p for p, q in zip(f, sf)} for f, sf in zip(fronts, sure)]
            c = Choice([m[id(q)] for m, q in zip(by_point, c.points)], step_peak(
                [m[id(q)] for m, q in zip(by_point, c.points)], self.outside), c.recompute, c.feasible, full)
        else:
            c = choose(fronts, target, self.outside)
        self.last = c
        self.targets = {"eager": eager, "full": full, "target": target, "asked": asked}
        self.choice = dict(zip(names, c.points))
        for name, m in self.blocks:
            if _is_hf_layer(m) and self.hf_route and hasattr(m, "_gradient_checkpointing_func"):
                p = self.choice.get(name)
                m.gradient_checkpointing = p is not None and not p.unwrapped
        # the first forward plans before it has seen the rest of the step: judge the budget once
        # the outside of the blocks is measured (the replan at the end of that forward)
        judged = self.outside_measured or self.single or len(self._handles) <= 2 * len(self.blocks)
        if not c.feasible and target is not None and judged:
            least = c.peak
            msg = (f"remat cannot fit the budget {asked} ({format_bytes(target)} above resident memory, "
                   f"predicted): the least it reaches is {format_bytes(least)}"
                   + (f", {least / eager:.3f} of the peak without checkpointing" if eager else "")
                   + "; it runs at that least")
            if self.strict:
                raise InfeasibleBudgetError(msg, smallest_feasible=least)
            if (target, least) not in self._warned:
                self._warned.add((target, least))
                warnings.warn(msg, RematBudgetWarning, stacklevel=4)

    # -- the head ------------------------------------------------------------------------------
    def plan_head(self, front: list) -> None:
        """The head's points for this call (:meth:`remat.eager.lm_head.LMHead.frontier`): the
        step is planned again when they are new."""
        if front is not self.head_front:
            self.head_front = front
            self.replan()

    def head_unsupported(self, why: str) -> None:
        if self.head_why is None:
            self.head_why = why
            warnings.warn(f"remat keeps {type(self.head.model).__name__}'s own head and loss (not split along "
                          f"the tokens): {why}", RematFallbackWarning, stacklevel=4)
        if self.head_front is not None:
            self.head_front = None
            self.replan()

    def head_profile(self):
        w = self.head.linear.weight
        return self.profile or device_profile(w.device.type)

    def enter_head(self) -> None:
        """The head runs: what autograd saves now is the head's (planned), not the outside's."""
        self._tls.current = HEAD

    def exit_head(self) -> None:
        self._tls.current = None

    # -- SAC -----------------------------------------------------------------------------------
    @staticmethod
    def tables(bp: BlockPlan, point) -> tuple[frozenset, frozenset]:
        """``(kept, offloaded)``: the ``(func, call index)`` pairs SAC saves, and those of them kept
        in host memory."""
        ops = bp.capture.ops
        kept = frozenset((ops[i].func, ops[i].index) for i in point.kept)
        return kept, frozenset((ops[i].func, ops[i].index) for i in point.offloaded)

    def tables_for(self, name: str | None) -> tuple[frozenset, frozenset]:
        """:meth:`tables` of the running block (nothing saved when remat does not know it)."""
        if name is None or name not in self.block_key:
            return frozenset(), frozenset()
        bp = self.plans.get(self.block_key[name])
        if bp is None or not bp.supported:
            return frozenset(), frozenset()
        point = self.choice.get(name)
        if point is None or point.unwrapped:
            # transformers already checkpoints this call: hold what autograd would
            point = bp.least_saved
        return self.tables(bp, point)

    def context_fn(self, tables=None, name: str | None = None):
        """A ``context_fn`` for ``torch.utils.checkpoint`` (non-reentrant): the SAC contexts of one
        checkpointed call, with the running block's decisions (``tables``, else looked up when the
        call starts or at its first op) bound for the whole call."""
        tls = self._tls
        name = getattr(tls, "current", None) if name is None else name
        if tables is None and name in self.block_key:
            tables = self.tables_for(name)  # transformers >= 5 runs the block's hooks first
        state = {"table": None if tables is None else tables[0],
                 "offloaded": None if tables is None else tables[1], "counts": {}, "name": name}
        if tables is not None and not tables[0]:  # saves nothing: plain checkpointing, no dispatch mode
            return self._restoring(torch.utils.checkpoint.noop_context_fn(), state)

        def policy_fn(ctx, func, *args, **kwargs):
            t = state["table"]
            if t is None:
                state["name"] = getattr(tls, "current", None)
                t, state["offloaded"] = self.tables_for(state["name"])
                state["table"] = t
            counts = state["counts"]
            k = counts.get(func, 0)
            counts[func] = k + 1
            return CheckpointPolicy.MUST_SAVE if (func, k) in t else CheckpointPolicy.PREFER_RECOMPUTE

        contexts = self._restoring(create_selective_checkpoint_contexts(policy_fn), state)
        off = self._offload_module()
        if off is None:
            return contexts

        def offloaded(op, k, tensor):  # the values the plan keeps in host memory
            t = state["offloaded"]
            return t is not None and (op, k) in t

        if self._offloader is None:
            self._offloader = off.Offloader()
        return off.wrap_sac_contexts(contexts, offloaded, offloader=self._offloader)

    def _restoring(self, contexts, state):
        """``contexts`` whose recomputation context restores, after the replay, the buffers the
        block's forward writes (capture records them: BatchNorm's running statistics and batch
        count), which the replay would update a second time."""
        modules, planner = self._modules, self

        def written(name):  # the buffers the block's forward writes (capture), else none
            bp = planner.plans.get(planner.block_key.get(name))
            m = modules.get(name)
            if bp is None or m is None:
                return []
            return [m.get_buffer(n) for n in bp.capture.meta.get("written_buffers", ())]

        class Restore:
            def __init__(self, inner):
                self.inner = inner
                self.saved = []

            def __enter__(self):
                self.saved = [(b, b.detach().clone()) for b in written(state.get("name"))]
                return self.inner.__enter__()

            def __exit__(self, *exc):
                try:
                    return self.inner.__exit__(*exc)
                finally:
                    with torch.no_grad():
                        for b, v in self.saved:
                            b.copy_(v)
                    self.saved = []

        forward, recompute = contexts
        return forward, Restore(recompute)

    def _offload_chooser(self, device: str):
        """With ``offload``: ``(candidates, overlap_seconds) -> {index: copy seconds}``, the values
        :func:`remat.eager.offload.choose_offloads` moves to host memory over the measured link
        (:func:`remat.eager.offload.eager_link`) instead of recomputing them; else None."""
        off = self._offload_module()
        if off is None:
            return None
        if self._link is None:
            self._link = off.eager_link(device if device != "cuda" else None)
        link = self._link
        min_bytes = getattr(off, "MIN_BYTES", 0)

        def choose(candidates, overlap_seconds):
            cands = [off.Candidate(i, b, t) for i, b, t in candidates if b >= min_bytes]
            chosen = off.choose_offloads(cands, link, overlap_seconds)
            return {c.key: 2 * link.seconds(c.nbytes) * (0.0 if getattr(link, "asynchronous", False) else 1.0)
                    for c in cands if c.key in chosen}

        return choose

    def _offload_module(self):
        """:mod:`remat.eager.offload` when ``offload`` was asked and it is there, else None."""
        if not self.offload:
            return None
        try:
            from . import offload as _offload
            (_offload.wrap_sac_contexts, _offload.offload_hooks, _offload.choose_offloads, _offload.eager_link,
             _offload.Candidate)
        except (ImportError, AttributeError):
            if "offload" not in self._warned:
                self._warned.add("offload")
                warnings.warn("remat.checkpoint(offload=...) needs remat.eager.offload, which this install "
                              "lacks: the plan runs without offloading", RematOffloadWarning, stacklevel=4)
            return None
        return _offload

    def summary(self):
        from .summary import Summary

        return Summary(self)


class RematPolicy:
    """A ``context_fn`` planned by remat (what :func:`policy` returns): call it to get the SAC
    contexts of one checkpointed call. ``summary()`` reports the plan."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def __call__(self):
        return self.planner.context_fn()

    def summary(self):
        return self.planner.summary()

    def __repr__(self) -> str:
        b = self.planner.budget
        return f"RematPolicy({type(self.planner.model).__name__}, budget={b if b in (FULL, None) else b.text!r})"


def policy(model_or_block: torch.nn.Module, *example_inputs, budget=FULL, blocks=None, strict: bool = False,
           profile=None, head: bool = True, **example_kwargs) -> RematPolicy:
    """A planned ``context_fn`` for ``torch.utils.checkpoint(..., use_reentrant=False, context_fn=fn)``
    and transformers' ``model.activation_checkpointing_enable(activation_checkpointing_kwargs=
    {"use_reentrant": False, "context_fn": fn})``.

    Given a model, it hooks the model's blocks (:func:`remat.eager.blocks.find_blocks`) to know
    which block each checkpointed call runs and with which input shapes; each new shape is
    captured and planned at its first call, within ``budget`` for the whole step (see
    :func:`remat.checkpoint`). On a transformers model it also turns transformers' checkpointing
    off for layers whose plan saves everything (``layer.gradient_checkpointing = False``).
    Given one block and ``example_inputs`` (or keyword inputs), it plans that block now, the
    budget being of that block's own activations; without inputs, at its first call. On a
    transformers causal LM, ``head=True`` (the default) also plans its head and loss, as
    :func:`remat.checkpoint` does (the model's ``forward`` is replaced to run them).
    """
    if not isinstance(head, bool):
        raise OptionError(f"head must be True (plan the head and loss of a causal LM) or False, not {head!r}")
    single = bool(example_inputs or example_kwargs) or (blocks is None and not _has_blocks(model_or_block))
    planner = Planner(model_or_block, budget=budget, blocks=blocks, strict=strict, profile=profile, single=single,
                      head=head)
    planner.hf_route = True
    planner.install_hooks()
    from . import lm_head

    lm_head.install(planner)
    if single and (example_inputs or example_kwargs):
        m = model_or_block
        was = m.training
        m.train()
        try:
            planner.prepare("", m, _raw_forward(m), example_inputs, example_kwargs)
        finally:
            m.train(was)
    return RematPolicy(planner)


def _has_blocks(model) -> bool:
    try:
        return bool(find_blocks(model))
    except OptionError:
        return False
