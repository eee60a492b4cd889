"""The benchmark harness measures what it claims: saved bytes, peak memory, batch search,
records that survive crashes and resume, and the ``remat bench`` command line.

Fast: the compiled methods use ``compiler="eager"`` (AOTAutograd and remat's partitioner,
no kernel codegen); the seeds' cos-cos example (seeds/003: f = cos(cos(a+b+c+d)), remat
saves only a+b+c+d) is the main case.
"""

from __future__ import annotations

import json

import pytest
import torch

from remat.bench import measure as M
from remat.bench import report
from remat.bench.fidelity import fidelity, markdown as fidelity_markdown

REQUIRED = {"model", "size", "method", "device", "status", "saved_activation_bytes", "peak_bytes",
            "predicted_peak_bytes", "step_ms", "predicted_step_ms", "compile_s", "planner_ms", "batch",
            "timeline"}


def _prepared(method: str, name: str = "cos-cos", **kw):
    from remat import zoo
    from remat.bench.methods import prepare

    case = zoo.build(name, "tiny", **kw)
    return case, prepare(method, case, compiler="eager")


# -- measure ---------------------------------------------------------------------------------

def test_peak_memory_sees_a_known_allocation():
    n = 3 << 20
    x = torch.randn(256, requires_grad=True)

    def step():
        x.grad = None
        big = torch.empty(n // 4)
        big.fill_(1.0)
        loss = (x * big[:256]).sum()
        loss.backward()
        del big
        return loss

    pm = M.peak_memory(step)
    assert pm.source == "profiler"
    assert pm.peak_bytes >= n
    assert pm.peak_bytes < n + (1 << 20)  # and not much more: a few small temporaries
    assert pm.timeline and max(b for _, b in pm.timeline) == pm.peak_bytes
    assert abs(pm.end_bytes) < 4096  # the big tensor was freed; the new gradient replaced the old


def test_peak_memory_counts_the_previous_gradients_freed():
    """A step that sets grad = None releases the old gradients before it allocates new ones:
    the profiler must see those frees (they were allocated before the measured step)."""
    x = torch.randn(1 << 18, requires_grad=True)  # 1 MiB

    def step():
        x.grad = None
        loss = (x * 2).sum()
        loss.backward()
        return loss

    pm = M.peak_memory(step)
    assert min(b for _, b in pm.timeline) <= -(1 << 20)  # the old gradient's free is seen
    assert abs(pm.end_bytes) < 4096


def test_saved_activation_bytes_cos_cos_conservative_is_one_tensor():
    case, prep = _prepared("mincut-conservative")
    prep.step()
    saved = M.saved_activation_bytes(prep, prep.params_and_inputs())
    one = case.inputs[0].numel() * case.inputs[0].element_size()
    assert saved.activation_bytes == one and saved.count == 1
    assert M.plans_saved_activation_bytes(prep) == one  # what the plan says it saves
    _, nr = _prepared("no-recompute")
    nr.step()
    assert M.saved_activation_bytes(nr, nr.params_and_inputs()).activation_bytes > one


def test_prediction_of_cos_cos_matches_measured_peak():
    case, prep = _prepared("mincut-conservative")
    prep.step()
    held = prep.params_and_inputs()
    released = M.released_gradient_bytes(prep.step, held)
    assert released == sum(x.numel() * 4 for x in case.inputs)  # grad = None frees all four
    pm = M.peak_memory(prep.step, held=held)
    pred = M.predicted(prep, released_bytes=released)
    assert pred is not None
    # within one 1024-float tensor: the simulator has the four input gradients share one
    # tensor (add's backward passes it through); autograd gives b, c and d copies of it
    assert abs(pred.peak_bytes - pm.peak_bytes) <= 4096 + 16
    g = pred.per_graph[0]
    assert pred.peak_bytes == g["simulated_peak_bytes"] - g["constant_bytes"] - released
    assert pred.seconds > 0 and pred.saved_activation_bytes == case.inputs[0].numel() * 4
    assert M.predicted(_prepared("eager")[1]) is None  # eager has no plan of its own
    eager_pred = M.predicted(_prepared("eager")[1], fallback=prep, released_bytes=released)
    assert eager_pred.peak_bytes == pred.peak_bytes


def test_step_time_alternates_and_survives_a_failing_step():
    x = torch.randn(64, requires_grad=True)
    calls = []

    def ok():
        calls.append("ok")
        x.grad = None
        x.exp().sum().backward()

    def bad():
        calls.append("bad")
        raise RuntimeError("boom")

    t = M.step_time({"ok": ok, "bad": bad}, repeats=4, warmup=1)
    assert t["bad"].error.startswith("error: RuntimeError: boom")
    assert len(t["ok"].samples) == 4 and t["ok"].median_s > 0 and t["ok"].error is None
    assert calls.count("bad") == 1  # it left the loop after failing
    assert M.error_status(torch.cuda.OutOfMemoryError("CUDA out of memory")) == "oom"


def test_max_batch_size_on_cpu_is_the_largest_batch_within_the_budget():
    from remat import zoo
    from remat.bench.methods import prepare

    def build(b):
        case = zoo.build("mlp", "tiny", batch=b)
        prep = prepare("eager", case)
        return prep, prep.params_and_inputs()

    def total(b):
        prep, held = build(b)
        pm = M.peak_memory(prep.step, held=held, timeline=False)
        return pm.resident_before + pm.peak_bytes

    budget = total(6)
    res = M.max_batch_size(build, budget_bytes=budget)
    assert res.batch >= 6
    assert total(res.batch) <= budget < total(res.batch + 1)
    assert [p.batch for p in res.probes][:3] == [1, 2, 4]  # doubling, then bisection
    assert all(p.fits == (p.peak_bytes <= budget) for p in res.probes)
    with pytest.raises(ValueError, match="budget"):
        M.max_batch_size(build)


def test_calibrated_cpu_profile_is_cached():
    from remat.cost.calibrate import cpu_profile, profile_for

    p = cpu_profile()
    assert p.peak_flops > 1e8 and p.bandwidth > 1e8 and p.launch_seconds > 0
    assert profile_for("cpu") is p


# -- runner, report, fidelity ----------------------------------------------------------------

def test_runner_records_errors_and_keeps_the_others(tmp_path):
    from remat.bench.runner import run

    recs = run(["cos-cos", "no-such-model"], "tiny", ["eager", "mincut-conservative", "no-such-solver"],
               compiler="eager", out_dir=tmp_path, repeats=2, warmup=1, progress=False)
    by = {(r["model"], r["method"]): r for r in recs}
    assert len(recs) == 6
    for r in recs:
        assert REQUIRED <= set(r), REQUIRED - set(r)
    assert by["cos-cos", "eager"]["status"] == "ok"
    cons = by["cos-cos", "mincut-conservative"]
    assert cons["status"] == "ok" and cons["saved_activation_bytes"] == 4 << 10  # a+b+c+d: 2^10 floats
    assert cons["predicted_peak_bytes"] is not None and cons["step_ms"] > 0
    assert by["cos-cos", "no-such-solver"]["status"].startswith("error")
    assert all(by["no-such-model", m]["status"].startswith("error") for m in
               ("eager", "mincut-conservative", "no-such-solver"))
    # the files: json (versioned), csv, md, fidelity, timelines
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["format"] == report.RESULTS_FORMAT and len(doc["records"]) == 6
    assert (tmp_path / "results.csv").read_text().startswith("model,size,method")
    assert "| cos-cos | tiny | mincut-conservative | ok |" in (tmp_path / "results.md").read_text()
    assert "Fidelity" in (tmp_path / "fidelity.md").read_text()
    tl = json.loads((tmp_path / cons["timeline"]).read_text())
    assert tl["measured"] and tl["simulated"]

    # resume: ok records are kept as they are, failed ones are tried again
    stamp = cons["time"]
    recs2 = run(["cos-cos"], "tiny", ["eager", "mincut-conservative", "no-recompute"], compiler="eager",
                out_dir=tmp_path, repeats=2, warmup=1, progress=False)
    by2 = {(r["model"], r["method"]): r for r in recs2}
    assert by2["cos-cos", "mincut-conservative"]["time"] == stamp
    assert by2["cos-cos", "no-recompute"]["status"] == "ok"
    assert len(recs2) == 7
    md = report.markdown_table(recs2)
    row = next(line for line in md.splitlines() if "| mincut-conservative | ok |" in line)
    assert row.split("|")[10].strip() == "0.50"  # saved vs no-recompute: 1 of 2 tensors


def test_fidelity_findings_and_rank_correlation():
    recs = [{"model": "m", "size": "tiny", "method": k, "status": "ok", "peak_bytes": p,
             "predicted_peak_bytes": q, "step_ms": t, "predicted_step_ms": u}
            for k, p, q, t, u in [("a", 100, 110, 1.0, 1.0), ("b", 200, 100, 2.0, 2.2), ("c", 300, 290, 3.0, 3.1)]]
    recs.append({"model": "m", "size": "tiny", "method": "d", "status": "oom"})
    f = fidelity(recs)
    assert f["peak"]["n"] == 3 and f["peak"]["spearman"] == pytest.approx(0.5)
    assert f["step"]["spearman"] == pytest.approx(1.0)
    assert [(x["method"], x["quantity"]) for x in f["findings"]] == [("b", "peak")]
    assert f["peak"]["worst"][0]["method"] == "b"
    assert "| m | tiny | b | peak |" in fidelity_markdown(recs)


def test_cli_bench_writes_results(tmp_path, capsys):
    from remat.cli.main import main

    out = tmp_path / "bench"
    rc = main(["bench", "--models", "cos-cos", "--size", "tiny", "--methods", "eager,mincut-conservative",
               "--compiler", "eager", "--out", str(out), "--repeats", "2", "--no-progress", "--plot"])
    assert rc == 0
    for f in ("results.json", "results.csv", "results.md", "fidelity.md"):
        assert (out / f).exists(), f
    assert (out / "plots" / "normalized_tiny_cpu.png").exists() is False  # no no-recompute baseline
    assert (out / "plots" / "timeline_cos-cos_tiny_cpu.png").exists()
    printed = capsys.readouterr().out
    assert "mincut-conservative" in printed


# -- the harness (remat.bench.harness) and the scripts in benchmarks/ ----------------------------------

import ast  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from remat.bench import harness  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
SIBLINGS = {p.stem for p in SCRIPTS}


def test_harness_writes_rows_with_the_expected_fields(tmp_path, capsys):
    def arguments(ap):
        ap.add_argument("--n", type=int, default=2)

    def run(args):
        cases = [harness.Case(f"c{i}", f"case {i}", None, ()) for i in range(args.n)]
        variants = [harness.Variant("ok", {"x": 1.5}), harness.Variant("bad")]

        def measure(case, v):
            if v.name == "bad":
                raise ValueError("no such thing")
            return {"x": v.options["x"], "inf": float("inf")}
        return harness.Result(harness.matrix(cases, variants, measure), {"extra": "yes"}, columns=("case", "x"))

    script = tmp_path / "benchmarks" / "toy.py"
    rc = harness.main(script, run, arguments, ["--n", "3"], doc="A toy.\n\nMore.")
    assert rc == 0
    path = tmp_path / "benchmarks" / "results" / "toy.json"
    doc = json.loads(path.read_text())
    assert {"format", "version", "script", "command", "meta", "rows"} <= set(doc)
    assert doc["format"] == harness.RESULTS_FORMAT and doc["script"] == "toy"
    assert doc["command"] == "python benchmarks/toy.py --n 3"
    assert {"date", "torch", "python", "machine", "device", "remat_commit", "args"} <= set(doc["meta"])
    assert doc["meta"]["args"]["n"] == 3 and doc["meta"]["extra"] == "yes"
    rows = doc["rows"]
    assert len(rows) == 6 and all({"case", "variant", "status"} <= set(r) for r in rows)
    ok = [r for r in rows if r["variant"] == "ok"]
    assert all(r["status"] == "ok" and r["x"] == 1.5 and r["inf"] == "inf" for r in ok)
    bad = [r for r in rows if r["variant"] == "bad"]
    assert all(r["status"].startswith("error: ValueError") and "no such thing" in r["note"] for r in bad)
    meta, back = harness.read_rows(path)
    assert back == rows and meta["command"] == doc["command"]
    out = capsys.readouterr().out
    assert "toy" in out and "wrote 6 rows" in out
    # --no-results prints and writes nothing; --results names the file
    path.unlink()
    assert harness.main(script, run, arguments, ["--no-results"]) == 0 and not path.exists()
    other = tmp_path / "elsewhere.json"
    assert harness.main(script, run, arguments, ["--results", str(other), "--n", "1"]) == 0
    assert len(harness.read_rows(other)[1]) == 2


def test_harness_tables_and_steps():
    rows = [{"model": "m", "peak_bytes": 123456, "ratio": 1.234, "note": "x", "solvers": ["a", "b"]}]
    md = harness.markdown_table(rows)
    assert md.splitlines()[0] == "| model | peak_bytes | ratio |" and "| m | 123,456 | 1.23 |" in md
    assert harness.rich_table(rows, ["model", "solvers"]).row_count == 1
    model = torch.nn.Linear(4, 2)
    x = (torch.randn(3, 4),)
    step = harness.make_step(lambda x: model(x).square().sum(), model, harness.copy_inputs(x))
    step()
    grads = [p.grad.clone() for p in model.parameters()]
    step()  # zeroed in place, not accumulated
    assert harness.grad_err(model, grads) == 0.0
    assert harness.gradient_bytes(model) == (8 + 2) * 4
    assert harness.measure_peak(step, keep=harness.held(model, x)) >= 0
    t = harness.time_ratios({"a": step, "b": step}, "a", repeats=2, warmup=1)
    assert t["a"]["ratio"] == 1.0 and t["b"]["step_ms"] > 0


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.append((n.lineno, n.module))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "__import__":
            out.append((n.lineno, ast.unparse(n.args[0]) if n.args else "?"))
    return out


def _path_edits(tree: ast.AST) -> list[int]:
    """Lines that change ``sys.path`` (a call on it, or an assignment to it)."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys":
            parent_calls = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                            and c.func.value is n]
            if parent_calls or isinstance(n.ctx, ast.Store):
                lines.append(n.lineno)
    return lines


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_a_thin_entry(script):
    """No sys.path edits and no imports of sibling scripts: what a script shares lives in
    remat.bench (and its models in remat.zoo)."""
    tree = ast.parse(script.read_text())
    assert not _path_edits(tree), f"{script.name} edits sys.path at lines {_path_edits(tree)}"
    siblings = [(ln, m) for ln, m in _imports(tree) if m.split(".")[0].strip("'\"") in SIBLINGS
                or m.startswith("benchmarks")]
    assert not siblings, f"{script.name} imports sibling scripts: {siblings}"
    if script.name != "bench_solver.py":  # its own helper's
        assert "harness.main(" in script.read_text(), f"{script.name} does not enter through remat.bench.harness"


def _load(script: Path):
    saved = dict(os.environ)
    try:
        name = f"benchmarks_{script.stem}"
        spec = importlib.util.spec_from_file_location(name, script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
    finally:  # the scripts set REMAT_CACHE_DIR and inductor's cache switch for their own runs
        os.environ.clear()
        os.environ.update(saved)
    return module


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.name != "bench_solver.py"], ids=lambda p: p.name)
def test_script_help_through_the_harness(script, capsys):
    module = _load(script)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--results" in out and "--no-results" in out, out
