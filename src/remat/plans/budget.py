"""Memory budgets: what a user may write, what it means in bytes for a graph, and how bytes
are shown (no torch).

A budget bounds the simulated peak memory of the training step. It is one of:

- **bytes**, written with a unit (``"6GiB"``, ``"512MB"``) or as a whole number of bytes
  (``6e9``, ``6_000_000_000``): the whole step's peak, inputs and parameters included;
- **a fraction** in ``(0, 1]`` (``0.6``, ``"60%"``) of the step's *activation memory under
  plain torch.compile*: the peak above what is resident before the step
  (:func:`resident_bytes`: its inputs and parameters) of PyTorch's own partition, as
  ``torch.compile(model)`` runs it (:func:`reference_peak`); the gradients and outputs the
  step allocates are part of it. It is what a user measures:
  ``torch.cuda.max_memory_allocated()`` less the memory at the step's start.
  ``budget=0.6`` keeps that part of the peak within 60% of plain torch.compile's: the planned
  peak is ``resident + 0.6 * (reference_peak - resident)``. A fraction is a target: where no
  plan reaches it, remat runs the least memory it finds and warns (``strict=True`` raises);
- ``"min"``: the least peak remat can reach (within a bounded slowdown: :mod:`remat.solvers.auto`).

Anything else (``1.5``, ``"abc"``, ``-1``, ``True``) is refused with a
:class:`~remat.errors.BudgetError` that says what to write instead.

>>> Budget.parse("6GiB").value, Budget.parse(0.6).kind, Budget.parse("60%").value
(6442450944.0, 'fraction', 0.6)
>>> Budget.parse("min").kind
'min'
>>> Budget.parse(1.5)
Traceback (most recent call last):
...
remat.errors.BudgetError: budget 1.5 is neither a fraction in (0, 1] nor a byte count: write a fraction such as 0.6 (of the activation memory under plain torch.compile), bytes with a unit such as '1.5GiB', or 'min'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..cost.model import constant_bytes, default_cost_model
from ..cost.transfer import link_for_graph
from ..errors import BudgetError
from ..graph.graph import Graph
from .saved_set import backward_work
from .schedule import Schedule, schedule_from_saved_set
from .simulator import simulate
from .stages import lifetime_spans, schedule_from_rs, staged

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

TORCH_HEADROOM = 0.01
"""Share of a byte budget that a real training step keeps free for allocations the cost model
does not see (oneDNN's per-thread scratch in a CPU convolution's backward measured 0.55% of
the ConvBN test step; allocator rounding): ``remat.compile`` and ``remat plan --budget`` plan
within ``(1 - TORCH_HEADROOM) * budget``. A fractional budget, being relative to the
simulator's own peak, gets none, so ``budget=1.0`` always fits."""

MAX_BUDGET_BYTES = 1 << 60
"""The largest byte budget remat reads (1 EiB): past it, a budget is a typo, not a device."""

_HOW = ("write a fraction such as 0.6 (of the activation memory under plain torch.compile), bytes "
        "with a unit such as '6GiB', or 'min' (the least memory remat can reach)")


@dataclass(frozen=True)
class Budget:
    """A parsed budget: ``kind`` is ``"bytes"``, ``"fraction"`` or ``"min"``; ``text`` is what was given."""

    kind: str
    value: float
    text: str

    @classmethod
    def parse(cls, budget: "Budget | str | float | int") -> "Budget":
        """The budget ``budget`` stands for; raises :class:`BudgetError` naming the fix."""
        if isinstance(budget, Budget):
            return budget
        if isinstance(budget, bool) or not isinstance(budget, (str, int, float)):
            raise BudgetError(f"budget {_short(budget)} is not understood: {_HOW}")
        text = budget if isinstance(budget, str) else _short(budget)
        if isinstance(budget, str) and budget.strip().lower() == "min":
            return cls("min", 0.0, text)
        if isinstance(budget, str):
            m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(%|[kmgt]i?b|b)?",
                             budget.strip().replace("_", ""), flags=re.I)
            if not m:
                raise BudgetError(f"budget {budget!r} is not understood: {_HOW}")
            value, unit = float(m.group(1)), (m.group(2) or "").lower()
            if unit == "%":
                value, unit = value / 100, "fraction"
            elif unit:
                return cls._bytes(value * _UNITS[unit], text)
        else:
            try:
                value, unit = float(budget), ""
            except OverflowError:  # an int past float's range
                raise BudgetError(f"budget {_short(budget)} is more bytes than any device holds (at most "
                                  f"{MAX_BUDGET_BYTES} bytes, 1 EiB): {_HOW}") from None
        if not math.isfinite(value) or value <= 0:
            raise BudgetError(f"budget {budget!r} must be positive and finite: {_HOW}")
        if value <= 1:
            return cls("fraction", value, text)
        if unit == "fraction":
            raise BudgetError(f"budget {budget!r} is over 100% of plain torch.compile's activation "
                              "memory, which remat's plans always fit: use 100% or less")
        if value != int(value):
            raise BudgetError(f"budget {budget!r} is neither a fraction in (0, 1] nor a byte count: "
                              f"write a fraction such as 0.6 (of the activation memory under plain "
                              f"torch.compile), bytes with a unit such as '{value:g}GiB', or 'min'")
        return cls._bytes(value, text)

    @classmethod
    def of_bytes(cls, n: int) -> "Budget":
        """``n`` bytes, as a layer that already holds them in bytes makes a budget (a graph's
        share of a step's): nothing to read, and 1 is one byte, not a fraction."""
        return cls("bytes", float(int(n)), str(int(n)))

    @classmethod
    def least(cls) -> "Budget":
        """``"min"``: the least memory remat can reach."""
        return cls("min", 0.0, "min")

    @classmethod
    def _bytes(cls, value: float, text: str) -> "Budget":
        if value < 1:
            raise BudgetError(f"budget {text!r} is less than one byte: {_HOW}")
        if not value <= MAX_BUDGET_BYTES:  # infinity ("1e300GiB") included
            raise BudgetError(f"budget {text!r} is more bytes than any device holds (at most "
                              f"{MAX_BUDGET_BYTES} bytes, 1 EiB): {_HOW}")
        return cls("bytes", float(round(value)), text)

    def bytes_for(self, g: Graph) -> int:
        """The budget in bytes for graph ``g``: a fraction is of its activation memory
        (:func:`activation_bytes`) above :func:`resident_bytes`; ``"min"`` is 0 (the
        solvers then return their least peak)."""
        if self.kind == "fraction":
            return int(resident_bytes(g) + self.value * activation_bytes(g))
        return int(self.value)

    def planned_bytes(self, g: Graph, headroom: float = 0.0) -> int:
        """What a solver plans within: :meth:`bytes_for` less ``headroom`` (a share, for byte
        budgets only; see :data:`TORCH_HEADROOM`)."""
        if not 0.0 <= headroom < 1.0:
            raise ValueError(f"headroom must be in [0, 1), not {headroom}")
        asked = self.bytes_for(g)
        return int(asked * (1.0 - headroom)) if self.kind == "bytes" else asked

    def __str__(self) -> str:
        if self.kind == "min":
            return "the least memory remat can reach"
        return f"{self.value:g} of plain torch.compile's activation memory" \
            if self.kind == "fraction" else format_bytes(self.value)


REFERENCE_SAVED = "reference_saved"
"""``graph.meta[REFERENCE_SAVED]``: the saved set of PyTorch's own partition, as plain
``torch.compile`` runs it (``min_cut_rematerialization_partition``), recorded at capture: the
reference of a fractional budget."""


REFERENCE_OF = "reference_of"
"""``graph.meta[REFERENCE_OF]``: the reference of the graph this one was split from
(:func:`remat.transforms.fission.apply_fissions`, or the partitioner's capture with a plan's
fissions unrolled), as :func:`reference_figures` records it. A split graph is the same step:
its reference is the unsplit graph's. Its own would be PyTorch's partition with the split
values' names gone (a LoRA Llama's ``"min"`` plan then read 0.588 of its reference, where it
measured 0.458 of plain torch.compile's peak and its peak was predicted to the byte)."""


def _recorded(g: Graph) -> dict | None:
    """The reference a split graph records (:data:`REFERENCE_OF`), which every reader of the
    reference (peak, name, seconds) takes instead of the graph's own; None on other graphs."""
    return (g.meta or {}).get(REFERENCE_OF)


def reference_figures(g: Graph) -> dict:
    """What a graph split from ``g`` records as its reference (:data:`REFERENCE_OF`): the
    reference's ``peak_bytes``, ``name`` and predicted ``seconds`` (the default cost model and
    the graph's link), ``g``'s own record where it was split itself."""
    recorded = _recorded(g)
    if recorded is not None:
        return dict(recorded)
    saved = reference_saved(g)
    key = ("reference_figures", default_cost_model(g), None if saved is None else tuple(saved))
    return dict(g._derived(key, lambda g: {"peak_bytes": reference_peak(g), "name": reference_name(g),
                                           "seconds": reference_seconds(g)}))


def reference_seconds(g: Graph, cm=None, link=None) -> float:
    """The reference step's predicted seconds (:func:`reference_schedule` simulated with ``cm``,
    the graph's default cost model if None, over ``link``, the graph's if None); the recorded
    figure on a split graph (:data:`REFERENCE_OF`), whatever ``cm``."""
    recorded = _recorded(g)
    if recorded is not None and recorded.get("seconds") is not None:
        return float(recorded["seconds"])
    cm = cm or default_cost_model(g)
    return simulate(reference_schedule(g), cm, link=link or link_for_graph(g, cm), timeline=False).predicted_seconds


def reference_saved(g: Graph) -> list[str] | None:
    """The reference saved set capture recorded for ``g`` (plain torch.compile's; names in
    ``g``), or None.
    A primal input the backward reads that PyTorch's partition did not list is added: PyTorch
    dead-code-eliminated its reader (an unrolled GRU cell's weight, permuted for an input
    gradient nobody asked for), and an input is resident all step, so saving it costs nothing."""
    saved = (g.meta or {}).get(REFERENCE_SAVED)
    if saved is None:
        return None
    saved = tuple(s for s in saved if s in g)
    return list(g._derived(("reference_saved", saved),
                           lambda g: saved + backward_work(g, list(saved)).missing_inputs))


def reference_schedule(g: Graph) -> Schedule:
    """The schedule :func:`reference_peak` simulates: PyTorch's own partition (plain
    ``torch.compile``'s) where capture recorded it, else seeds/001's checkpoint-all in staged
    order."""
    saved = reference_saved(g)
    if saved is not None:
        s = schedule_from_saved_set(g, saved)
        # PyTorch's partition: under inductor judged in inductor's order (simulator.torch_order)
        s.meta = {**(s.meta or {}), "solver": "torch-mincut"}
        if simulate(s, default_cost_model(g), kernel_groups=False, timeline=False).valid:
            return s
    st = staged(g)
    return schedule_from_rs(st, None, lifetime_spans(st))  # computed once each: linear in nodes


def _reference(g: Graph):
    saved = reference_saved(g)
    cm = default_cost_model(g)

    def run(g: Graph):
        # inductor compiles PyTorch's partition in its own order, reusing dead buffers: the
        # CPU kernel groups of remat's plan order do not hold (GPT-NeoX: 10% over its
        # measured peak with them, to the byte without)
        s = reference_schedule(g)
        return simulate(s, cm, kernel_groups=s.meta.get("lowered_from") != "saved_set")

    # keyed by what graph.meta decides (the recorded saved set, the compiler's memory model),
    # which capture and callers may set after other derived values were memoized
    return g._derived(("reference_sim", cm, None if saved is None else tuple(saved)), run)


def reference_name(g: Graph) -> str:
    """The plan :func:`reference_peak` simulates: ``"torch.compile"`` (PyTorch's own
    partition) or ``"checkpoint-all"``."""
    recorded = _recorded(g)
    if recorded is not None:
        return str(recorded["name"])
    return "torch.compile" if reference_saved(g) is not None else "checkpoint-all"


def reference_peak(g: Graph) -> int:
    """Peak of the reference step. For a captured graph, PyTorch's own partition
    (``min_cut_rematerialization_partition`` at its defaults, whose saved set capture records
    in ``g.meta``), as plain ``torch.compile`` runs it: what a user measures without remat.
    Otherwise every value computed once, in the staged order the budgeted solvers schedule
    in, and kept until its last reader (seeds/001's checkpoint-all). A split graph's is the
    unsplit graph's (:data:`REFERENCE_OF`)."""
    recorded = _recorded(g)
    if recorded is not None:
        return int(recorded["peak_bytes"])
    return int(_reference(g).peak_bytes)


def resident_bytes(g: Graph) -> int:
    """What is resident before the step starts: its inputs and parameters (the simulator's
    constant bytes). Everything the step allocates is above it, the gradients it returns
    included: a training loop allocates them during the backward whether it set the previous
    ones to None (PyTorch's default) or keeps them (``zero_grad(set_to_none=False)``, which
    holds both until autograd adds the new ones in), so the peak above the step's start that a
    profiler or the CUDA allocator measures is the same in both cases."""
    return constant_bytes(g)


def activation_bytes(g: Graph) -> int:
    """The step's activation memory, the scale of a fractional budget: the reference's peak
    (plain ``torch.compile``'s, :func:`reference_peak`) above :func:`resident_bytes` (at least
    one byte)."""
    return max(1, reference_peak(g) - resident_bytes(g))


def _short(x: object) -> str:
    """``repr(x)``, cut to 40 characters (a budget of 10**400 is not printed whole)."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10**30:
        return f"{str(x)[:12]}... ({len(str(abs(x)))} digits)"
    text = str(x) if isinstance(x, (int, float)) else repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: bytes for people (B, KiB, MiB, GiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
