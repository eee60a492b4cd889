"""The benchmark harness: what every script in ``benchmarks/`` shares.

A benchmark is *cases* (a model and its inputs, :class:`Case`; the models live in
:mod:`remat.zoo`) times *variants* (a method at a setting, :class:`Variant`), each measured
into one *row* (a flat dict). The harness owns:

- the entry point: :func:`main` parses the script's arguments (:func:`parser` adds the common
  ones: ``--results``, ``--no-results``, ``--threads``), runs it and writes its rows;
- the rows on disk: :func:`write_rows` writes ``benchmarks/results/<script>.json`` as
  ``{"format", "version", "script", "command", "meta", "rows"}`` (``meta``: the run's
  settings and :func:`environment`), :func:`read_rows` reads them back;
- tables: :func:`rich_table` (console) and :func:`markdown_table` (BENCHMARKS.md), over any
  columns of the rows;
- a training step and what is measured of it: ``make_step``, ``copy_inputs`` (from
  :mod:`remat.zoo.trials`, re-exported),
  :func:`held`, :func:`grad_err`, :func:`gradient_bytes`; peaks and step times come from
  :mod:`remat.bench.measure` (:func:`measure_peak`, :func:`time_ratios`);
- the matrix: :func:`matrix` runs ``measure(case, variant)`` for every pair and collects rows,
  keeping going past a failing pair (its row carries ``status``).

>>> rows = matrix([Case("a", "case a", None, ())], [Variant("x", {"k": 1}), Variant("y")],
...               lambda case, v: {"value": v.options.get("k", 0)})
>>> [(r["case"], r["variant"], r["status"], r["value"]) for r in rows]
[('a', 'x', 'ok', 1), ('a', 'y', 'ok', 0)]
>>> print(markdown_table(rows, ["case", "variant", "value"]))
| case | variant | value |
|---|---|---|
| a | x | 1 |
| a | y | 0 |

A script is a thin entry::

    from remat.bench import harness

    def arguments(ap):
        ap.add_argument("--models", default="gpt2")

    def run(args):
        return [{"model": m, ...} for m in args.models.split(",")]   # rows

    if __name__ == "__main__":
        raise SystemExit(harness.main(__file__, run, arguments, doc=__doc__))
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from remat.zoo.trials import Case, copy_inputs, make_step  # noqa: E402, F401 - re-exported: a case, a training step

RESULTS_FORMAT = "remat.bench.harness"
RESULTS_VERSION = 1
MiB = float(1 << 20)

# -- cases and variants -----------------------------------------------------------------------


@dataclass
class Variant:
    """One method at one setting (``options``: what the script passes on, e.g. a budget)."""

    name: str
    options: dict = field(default_factory=dict)


@dataclass
class Run:
    """One variant of one case once compiled: its row, its step (None when it failed), the
    plans it made and its model."""

    row: Any
    step: Callable[[], Any] | None = None
    plans: list = field(default_factory=list)
    model: Any = None


def as_row(x: Any) -> dict:
    """A row as a plain dict: dataclasses through :func:`dataclasses.asdict`, dicts copied."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    return dict(x)


def error_row(e: BaseException) -> dict:
    """The fields of a row whose measurement raised."""
    from remat.bench.measure import error_status

    return {"status": error_status(e),
            "note": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-1500:]}


def matrix(cases: Iterable[Case], variants: Sequence[Variant],
           measure: Callable[[Case, Variant], Mapping | None], *, on_row: Callable[[dict], None] | None = None
           ) -> list[dict]:
    """``measure(case, variant)`` for every case and variant, one row each, with ``case``,
    ``variant`` and ``status`` (``ok`` unless ``measure`` set it or raised). A pair that raises
    gets an error row and the others go on; ``on_row`` sees each row as it comes."""
    rows = []
    for case in cases:
        for v in variants:
            row: dict = {"case": case.name, "variant": v.name, "status": "ok"}
            try:
                row.update(measure(case, v) or {})
            except Exception as e:  # noqa: BLE001 - recorded; the other pairs go on
                row.update(error_row(e))
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


# -- a training step and what is measured of it ----------------------------------------------------


def held(model, inputs: tuple = ()) -> list:
    """What a step keeps alive outside itself: parameters, buffers and input tensors."""
    import torch

    return list(model.parameters()) + list(model.buffers()) + [x for x in inputs if isinstance(x, torch.Tensor)]


def reference_grads(model, inputs: tuple) -> list:
    """Plain autograd's gradients of ``model(*inputs)`` on a copy of the model."""
    import copy

    ref = copy.deepcopy(model)
    ref(*copy_inputs(inputs)).backward()
    return [None if p.grad is None else p.grad.detach().clone() for p in ref.parameters()]


def grad_err(model, reference: Sequence) -> float | None:
    """Max abs difference between the model's gradients and ``reference`` (inf when one side
    has a gradient the other lacks)."""
    errs = []
    for p, r in zip(model.parameters(), reference):
        if p.grad is None or r is None:
            if (p.grad is None) != (r is None):
                return math.inf
            continue
        errs.append(float((p.grad.double() - r.double()).abs().max()))
    return max(errs, default=0.0)


def gradient_bytes(model) -> int:
    """Bytes of the model's gradients (distinct storages)."""
    seen = {}
    for p in model.parameters():
        if p.grad is not None:
            s = p.grad.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def measure_peak(step: Callable, device="cpu", *, keep: Iterable = (), warmup: int = 1) -> int:
    """The step's peak bytes above what is allocated at its start
    (:func:`remat.bench.measure.peak_memory`; ``keep``: tensors held outside the step)."""
    from remat.bench.measure import peak_memory

    return int(peak_memory(step, device, warmup=warmup, timeline=False, held=list(keep)).peak_bytes)


def time_ratios(steps: dict[str, Callable], base: str, repeats: int = 5, warmup: int = 2, device="cpu") -> dict:
    """Step times of named steps in one alternating loop (:func:`remat.bench.measure.step_time`)
    and each one's ratio to ``base`` taken per round: name -> {``step_ms``, ``ratio``,
    ``ratio_min``, ``ratio_max``, ``first_s``, ``error``}."""
    from remat.bench.measure import step_time

    times = step_time(steps, repeats=repeats, warmup=warmup, device=device)
    b = times[base].samples if base in times else []
    out = {}
    for k, t in times.items():
        r: dict = {"step_ms": None if t.error else t.median_s * 1e3, "first_s": t.first_s, "error": t.error,
                   "ratio": None, "ratio_min": None, "ratio_max": None, "median_s": t.median_s}
        n = min(len(t.samples), len(b))
        if n and not t.error:
            ratios = [x / y for x, y in zip(t.samples[:n], b[:n])]
            r.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
        out[k] = r
    return out


# -- rows on disk ------------------------------------------------------------------------------


def child_row(code: str, base: dict, *, env: Mapping | None = None, timeout: float | None = None,
              failed: str = "crashed") -> dict:
    """Run ``code`` in a fresh interpreter and return the row it prints last (a line ``ROW
    {json}``), or ``base`` with ``status`` saying why none came: timed out, or ``failed`` with the
    last line of its stderr (one process per row: nothing compiled, cached or allocated shared)."""
    try:
        out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                             env=dict(env) if env is not None else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timed out after {timeout:g} s"}
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if out.returncode != 0 or not rows:
        tail = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return {**base, "status": f"{failed}: {tail[:160]}"}
    return json.loads(rows[-1])


def results_dir(script: str | Path | None = None) -> Path:
    """``benchmarks/results`` beside the script (or of the repository the working directory is in)."""
    if script is not None:
        return Path(script).resolve().parent / "results"
    return Path("benchmarks") / "results"


def results_path(script: str | Path) -> Path:
    """``benchmarks/results/<script's stem>.json``."""
    return results_dir(script) / f"{Path(script).stem}.json"


def git_head(cwd: str | Path | None = None) -> str | None:
    """The short commit of the working tree (None outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=cwd or Path(__file__).parent, timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001
        return None


def changed_sources(cwd: str | Path | None = None) -> int | None:
    """How many files under ``src/`` differ from the commit (a run on a work in progress)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True, text=True,
                             cwd=cwd or Path(__file__).resolve().parents[1], timeout=10).stdout
        return sum(1 for line in out.splitlines() if line.strip())
    except Exception:  # noqa: BLE001
        return None


def environment(device: str = "cpu") -> dict:
    """Where a run ran: date, torch, python, machine, commit (and how many files of the
    package differed from it)."""
    import torch

    machine = f"{platform.machine()} {os.cpu_count()} cpus, {torch.get_num_threads()} threads"
    if str(device).startswith("cuda") and torch.cuda.is_available():
        machine += f", {torch.cuda.get_device_name()}"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "python": platform.python_version(), "machine": machine,
            "device": str(device), "remat_commit": git_head(), "remat_changed_files": changed_sources()}


def _jsonable(x: Any):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def _clean(x: Any):
    if isinstance(x, float) and not math.isfinite(x):
        return _jsonable(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_rows(path: str | Path, rows: Iterable[Any], meta: Mapping | None = None, *,
               script: str | None = None, command: str | None = None) -> Path:
    """Write ``rows`` (dicts or dataclasses) to ``path`` as the harness's JSON, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION,
           "script": script or path.stem, "command": command, "meta": _clean(dict(meta or {})),
           "rows": [_clean(as_row(r)) for r in rows]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    os.replace(tmp, path)
    return path


def read_rows(path: str | Path) -> tuple[dict, list[dict]]:
    """``(meta, rows)`` of a results file :func:`write_rows` wrote (meta has ``command``)."""
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path}: not a harness results file (format {doc.get('format')!r})")
    return {**doc.get("meta", {}), "command": doc.get("command"), "script": doc.get("script")}, doc["rows"]


# -- tables ------------------------------------------------------------------------------------


def fmt(x: Any, spec: str = "{:.2f}", none: str = "-") -> str:
    """``spec.format(x)``, or ``none`` for None and NaN."""
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else spec.format(x)


def cell(x: Any, spec: str = "{:.2f}", none: str = "-") -> str:
    """A table cell: floats through ``spec`` (:func:`fmt`), None and NaN as ``none``."""
    if x is None or isinstance(x, float):
        return fmt(x, spec, none)
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10000:
        return f"{x:,}"
    if isinstance(x, (list, tuple)):
        return ",".join(map(str, x))
    return str(x)


def _columns(rows: Sequence[dict], columns: Sequence[str] | None) -> list[str]:
    if columns:
        return list(columns)
    out: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if not isinstance(v, (dict, list)) and k != "note":
                out[k] = None
    return list(out)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] | None = None, fmt: str = "{:.2f}") -> str:
    """A Markdown table of ``columns`` (default: every scalar field) of ``rows``."""
    cols = _columns(rows, columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(cell(r.get(c), fmt) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def rich_table(rows: Sequence[dict], columns: Sequence[str] | None = None, title: str | None = None,
               fmt: str = "{:.2f}"):
    """The same table for the console (a :class:`rich.table.Table`)."""
    from rich.table import Table

    cols = _columns(rows, columns)
    t = Table(title=title)
    for c in cols:
        t.add_column(c, justify="left" if c in ("model", "case", "method", "variant", "status", "graph") else "right",
                     overflow="fold")
    for r in rows:
        t.add_row(*(cell(r.get(c), fmt) for c in cols))
    return t


def print_table(rows: Sequence[dict], columns: Sequence[str] | None = None, title: str | None = None) -> None:
    from rich.console import Console

    Console(width=max(120, min(240, 20 * len(_columns(rows, columns))))).print(rich_table(rows, columns, title))


# -- the entry point ------------------------------------------------------------------------------


def parser(script: str | Path, doc: str | None = None) -> argparse.ArgumentParser:
    """The script's argument parser, with the harness's options: ``--results PATH`` (default
    ``benchmarks/results/<script>.json``), ``--no-results`` and ``--threads``."""
    first = " ".join((doc or "").strip().split("\n\n")[0].split())
    ap = argparse.ArgumentParser(prog=Path(script).name, description=first,
                                 epilog=f"Writes its rows to {_display(results_path(script))} (--results).")
    g = ap.add_argument_group("harness")
    g.add_argument("--results", default=None,
                   help=f"where the JSON rows go (default: {_display(results_path(script))}; a script "
                        "may name its file after a setting, as user_trial.py after --model)")
    g.add_argument("--no-results", action="store_true", help="print only; write no results file")
    g.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    return ap


def output_path(args: argparse.Namespace, script: str | Path) -> Path:
    """Where the script's rows go: ``--results``, else ``benchmarks/results/<stem>.json`` (the
    script's stem, or ``args.results_stem`` when the script set one)."""
    if args.results:
        return Path(args.results)
    return results_dir(script) / f"{getattr(args, 'results_stem', None) or Path(script).stem}.json"


def _display(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


@dataclass
class Result:
    """What a script's ``run`` may return instead of bare rows: rows, run settings, and a table
    (columns and title) to print."""

    rows: list
    meta: dict = field(default_factory=dict)
    columns: Sequence[str] | None = None
    title: str | None = None
    printed: bool = False  # the script printed its own tables
    status: int = 0  # the exit status, after the rows are written (1: a check failed)


def main(script: str | Path, run: Callable[[argparse.Namespace], Any],
         arguments: Callable[[argparse.ArgumentParser], None] | None = None,
         argv: Sequence[str] | None = None, *, doc: str | None = None,
         columns: Sequence[str] | None = None, passthrough: bool = False) -> int:
    """Parse ``argv`` with :func:`parser` plus the script's ``arguments(ap)``, call
    ``run(args)`` (rows, or a :class:`Result`), print a table of the rows and write them to
    ``--results``. Returns the exit status (0; ``run`` may return an int to exit early).
    ``passthrough``: arguments the parser does not know go to ``args.rest`` (a driver of
    another command line)."""
    ap = parser(script, doc)
    if arguments is not None:
        arguments(ap)
    if passthrough:
        args, rest = ap.parse_known_args(list(argv) if argv is not None else None)
        args.rest = rest
    else:
        args = ap.parse_args(list(argv) if argv is not None else None)
    args.parser = ap
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    out = run(args)
    del args.parser
    if isinstance(out, int) or out is None:
        return int(out or 0)
    res = out if isinstance(out, Result) else Result(list(out))
    rows = [as_row(r) for r in res.rows]
    if not res.printed and rows:
        print_table(rows, res.columns or columns, res.title or Path(script).stem)
    if not args.no_results:
        settings = {k: v for k, v in vars(args).items()
                    if k not in ("results", "no_results", "parser", "results_stem")}
        device = getattr(args, "device", "cpu")
        cmd = " ".join(["python", f"benchmarks/{Path(script).name}"] +
                       list(argv if argv is not None else sys.argv[1:]))
        path = write_rows(output_path(args, script), rows, {**environment(device), "args": settings, **res.meta},
                          script=Path(script).stem, command=cmd)
        print(f"wrote {len(rows)} rows to {_display(path)}")
    return res.status
