"""``remat fit``'s answer as a plain-text table, a rich table, JSON or a plot."""

from __future__ import annotations

import json

from ..plans.budget import format_bytes
from .result import FitResult

_HEAD = ("method", "largest {what}", "peak", "activations", "step time", "per item", "planning", "")


def _rows(r: FitResult) -> list[tuple[str, ...]]:
    rows = []
    for m in r.methods:
        size = str(m.size) + ("" if m.exact or not m.size else " (lower bound)")
        rows.append((m.method, size,
                     format_bytes(m.peak_bytes) if m.peak_bytes is not None else "-",
                     format_bytes(m.activation_bytes) if m.activation_bytes is not None else "-",
                     _secs(m.seconds) if m.overhead is None else f"{m.overhead:.3f}x (cost)",
                     _secs(m.per_item_seconds), f"{m.plan_seconds:.1f} s", _short(m.note)))
    return rows


def _short(note: str, width: int = 90) -> str:
    """A note's first sentence, cut to ``width`` (the JSON has it whole)."""
    first = note.split(". ")[0]
    return first if len(first) <= width else first[: width - 3] + "..."


def _secs(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} us"


def _title(r: FitResult) -> str:
    st = r.states
    states = (f"model states {format_bytes(st['total'])} ({st['optimizer']}, {st['dtype']}"
              + (", fp32 master weights" if st.get("master_weights") else "")
              + (f", sharded over {st['shards']} GPUs (FSDP2)" if st.get("shards", 1) > 1 else "")
              + f": {st['bytes_per_param']:g} B/param x {st['params']:,})") if "optimizer" in st else \
        f"fixed {format_bytes(st['total'])} ({st.get('why', '')})"
    return (f"{r.model} on {r.gpu} ({format_bytes(r.capacity_bytes)}): the largest {r.what} that fits; "
            f"{states}; captured in {r.capture_seconds:.1f} s, planned in {r.seconds - r.capture_seconds:.1f} s")


def table_text(r: FitResult) -> str:
    """The plain-text table (always available)."""
    head = tuple(h.format(what=r.what) for h in _HEAD)
    rows = [head] + _rows(r)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [_title(r), ""]
    for k, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths).rstrip())
    return "\n".join(lines)


def print_table(r: FitResult, *, rich: bool = True) -> None:
    """Print the table: with rich where it is installed (and ``rich``), else plain text."""
    if rich:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            rich = False
    if not rich:
        print(table_text(r))
        return
    t = Table(title=_title(r), title_justify="left")
    for h in _HEAD:
        t.add_column(h.format(what=r.what), justify="left" if h in ("method", "") else "right",
                     no_wrap=h != "")
    for row in _rows(r):
        t.add_row(*row)
    Console().print(t)


def to_json(r: FitResult) -> str:
    return json.dumps(r.to_dict(), indent=2)


def plot(r: FitResult, path) -> None:
    """Bars of the largest size per method, labelled with the predicted step time (needs
    matplotlib: ``pip install remat[plot]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        from ..errors import OptionError

        raise OptionError("--plot needs matplotlib: pip install matplotlib") from e
    names = [m.method for m in r.methods]
    sizes = [m.size for m in r.methods]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(names) + 2), 4))
    bars = ax.bar(names, sizes, color="tab:blue")
    for b, m in zip(bars, r.methods):
        ax.annotate(_secs(m.seconds) if m.overhead is None else f"{m.overhead:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                    va="bottom", fontsize=8)
    ax.set_ylabel(f"largest {r.what}")
    ax.set_title(f"{r.model} on {r.gpu} ({format_bytes(r.capacity_bytes)})", fontsize=10)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
