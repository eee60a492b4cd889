"""Plans: what a solver decided, in a form people and programs can read.

A saved-set :class:`Plan` lists the values that cross from the forward to the backward pass
(``plan.saved``), what the backward recomputes, the saved bytes, the cut cost, and the solve
time. It renders a summary (``print(plan)``) and round-trips through JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

from ..graph.graph import Graph

PLAN_FORMAT = "remat.plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class SavedValue:
    name: str
    shape: tuple[int, ...] | None
    dtype: str | None
    nbytes: int
    role: str  # "input", "param" or "activation"


@dataclass
class Plan:
    graph_name: str
    solver: str
    options: dict[str, Any]
    saved: list[SavedValue]
    recomputed: list[str]
    moved_to_backward: list[str]
    cost: float | None
    solve_seconds: float
    banned: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    graph = None
    """The :class:`~remat.graph.Graph` the plan was made for, when known (not serialized)."""
    schedule = None
    """The :class:`~remat.plans.schedule.Schedule` a budgeted solver chose (serialized as a list)."""

    @classmethod
    def from_saved_set(cls, g: Graph, saved: Iterable[str], *, solver: str,
                       options: Mapping[str, Any] | None = None, cost: float | None = None,
                       solve_seconds: float = 0.0, banned: Mapping[str, str] | None = None,
                       stats: Mapping[str, Any] | None = None) -> "Plan":
        from .saved_set import backward_work

        saved = list(dict.fromkeys(saved))
        work = backward_work(g, saved)
        nodes, index = g.nodes, g._index  # backward_work has checked every name
        entries = [SavedValue(s, n.shape, n.dtype, n.bytes, n.role if n.is_primal else "activation")
                   for s, n in zip(saved, [nodes[index[s]] for s in saved])]
        recomputed = set(work.recomputed)
        return cls(
            graph_name=g.name, solver=solver, options=dict(options or {}), saved=entries,
            recomputed=list(work.recomputed),
            moved_to_backward=[c for c in work.computed if c not in recomputed],
            cost=cost, solve_seconds=solve_seconds, banned=dict(banned or {}),
            stats={"nodes": len(g), **dict(stats or {})},
        )

    # -- views ---------------------------------------------------------------------------
    @property
    def saved_names(self) -> list[str]:
        return [s.name for s in self.saved]

    @property
    def saved_activation_bytes(self) -> int:
        """Bytes of saved values that are activations (inputs and params are held anyway)."""
        return sum(s.nbytes for s in self.saved if s.role == "activation")

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.saved)

    @property
    def saved_activations(self) -> list[SavedValue]:
        return [s for s in self.saved if s.role == "activation"]

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["saved"] = [{**asdict(s), "shape": list(s.shape) if s.shape is not None else None}
                      for s in self.saved]
        out = {"format": PLAN_FORMAT, "version": PLAN_VERSION,
               "saved_activation_bytes": self.saved_activation_bytes, **d}
        if self.schedule is not None:
            out["schedule"] = self.schedule.to_list()
        return out

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        if d.get("format") != PLAN_FORMAT or d.get("version") != PLAN_VERSION:
            raise ValueError(f"not a remat plan (format {PLAN_FORMAT!r} version {PLAN_VERSION})")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        fields["saved"] = [SavedValue(s["name"], tuple(s["shape"]) if s["shape"] is not None else None,
                                      s["dtype"], s["nbytes"], s["role"]) for s in d["saved"]]
        return cls(**fields)

    # -- rendering -----------------------------------------------------------------------
    def summary(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        lines = [
            f"remat plan for {self.graph_name!r}: solver {self.solver}" + (f" ({opts})" if opts else ""),
            f"  saved: {len(self.saved)} values, {_fmt_bytes(self.saved_activation_bytes)} of activations"
            f" ({_fmt_bytes(self.saved_bytes)} with inputs and params)",
        ]
        if self.cost is not None:
            lines.append(f"  cut cost: {self.cost:.6g}   solve time: {self.solve_seconds * 1e3:.2f} ms")
        else:
            lines.append(f"  solve time: {self.solve_seconds * 1e3:.2f} ms")
        width = max([len(s.name) for s in self.saved] + [4])
        for s in self.saved:
            shape = "x".join(map(str, s.shape)) if s.shape is not None else "?"
            lines.append(f"    {s.name:<{width}}  {s.role:<10} {s.dtype or '?':<9} {shape:<18} {_fmt_bytes(s.nbytes)}")
        lines.append(f"  recomputed in backward: {len(self.recomputed)}"
                     + (f" ({', '.join(self.recomputed[:12])}{', ...' if len(self.recomputed) > 12 else ''})"
                        if self.recomputed else ""))
        if self.moved_to_backward:
            lines.append(f"  computed only in backward: {len(self.moved_to_backward)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
