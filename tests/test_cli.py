"""The remat command line: plan a saved graph, capture a model, run the demo; bad input gets a
clear message and exit code 2, never a traceback."""

import contextlib
import io
import json
import os
import subprocess
from types import SimpleNamespace
import sys

import pytest

from remat.cli.main import main
from remat.graph.examples import cos_cos_graph
from remat.graph.io import load_graph, save_graph


def run_cli(*args):
    """``remat ARGS`` in this process (no interpreter start per call): the exit status (an
    argparse error's SystemExit included) and what it wrote."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run_cli_process(*args):
    """``python -m remat.cli ARGS`` in a process of its own: the command line as users start it."""
    return subprocess.run([sys.executable, "-m", "remat.cli", *args], capture_output=True, text=True)


def test_plan_json_on_saved_graph(tmp_path, capsys):
    path = tmp_path / "cos.json"
    save_graph(cos_cos_graph(), path)
    assert main(["plan", str(path), "--solver", "mincut-conservative", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["saved"]] == ["add_2"]
    assert out["cost"] == 2 * 4096
    assert out["solve_seconds"] > 0  # reported; how long it takes is for the benchmarks


from paths import CHECKMATE_DIR  # noqa: E402

CHECKMATE_FILE = CHECKMATE_DIR / "VGG16_256_224_224_3_train_nx.json"


def test_plan_aggressive_on_checkmate_graph(capsys):
    from paths import CHECKMATE_DIR

    assert main(["plan", str(CHECKMATE_DIR / "VGG16_256_224_224_3_train_nx.json"), "--solver",
                 "mincut-aggressive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved"] and out["solver"] == "mincut-aggressive"


def test_plan_names_a_shipped_graph(capsys):
    """``checkmate:NAME`` plans a graph shipped with remat (remat.data); a name that matches
    several, or none, lists the names."""
    assert main(["plan", "checkmate:VGG16", "--solver", "mincut-aggressive", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert main(["plan", str(CHECKMATE_FILE), "--solver", "mincut-aggressive", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["saved"] == same["saved"]
    assert main(["plan", "checkmate:VGG", "--solver", "mincut-aggressive"]) != 0
    err = capsys.readouterr().err
    assert "names several" in err and "VGG19_256_224_224_3_train_nx" in err


def test_plan_no_offload_bars_offloading_solvers(capsys):
    """``--no-offload`` is remat.compile's offload=False on a saved graph: the offloading
    solvers refuse it, naming the flag."""
    assert main(["plan", "checkmate:VGG16", "--solver", "swap", "--budget", "0.9", "--no-offload"]) != 0
    assert "may not: --no-offload" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "remat.graph", "version": 1, "nodes": [{"name": "a"}]}', "lacks required key"),
    ('{"format": "remat.graph", "version": 1, "nodes": ['
     '{"name": "a", "op": "x", "role": "forward", "inputs": ["b"], "bytes": 1, "flops": 0, "category": "other"},'
     '{"name": "b", "op": "x", "role": "forward", "inputs": ["a"], "bytes": 1, "flops": 0, "category": "other"}]}',
     "cycle"),
    ('{"format": "remat.graph", "version": 1, "nodes": ['
     '{"name": "a", "op": "x", "role": "forward", "inputs": [], "bytes": 1, "flops": 0, "category": "magic"}]}',
     "unknown category"),
])
def test_bad_graph_files_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    r = run_cli("plan", str(path), "--json")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_capture_writes_a_loadable_graph(tmp_path):
    out = tmp_path / "g.json"
    r = run_cli_process("capture", "--model", "cos-cos", "--out", str(out))  # the one smoke test
    assert r.returncode == 0, r.stderr
    g = load_graph(out)
    assert {n.role for n in g} >= {"input", "tangent", "forward", "backward"}
    r = run_cli("plan", str(out), "--json")
    assert [s["name"] for s in json.loads(r.stdout)["saved"]] == ["add_2"]


def test_demo_runs_every_method(tmp_path):
    r = run_cli("demo", "cos-cos", "dropout-mask", "--compiler", "eager", "--numel", "512",
                "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    by = {(x["example"], x["method"]): x for x in rows}
    assert by[("cos-cos", "mincut-conservative")]["saved_names"] == ["add_2"]
    assert by[("cos-cos", "eager")]["saved_tensors"] == 2
    assert by[("cos-cos", "mincut-conservative")]["saved_tensors"] == 1
    assert by[("dropout-mask", "mincut-conservative")]["saved_bytes"] == 512  # the bool mask


_DEMO_CACHES = """
import json
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config
from remat.cli import demo

def caches():
    return [functorch_config.enable_autograd_cache, inductor_config.fx_graph_cache]

seen, measure = [], demo.saved_activation_bytes
def spy(step, **kwargs):
    seen.append(caches())
    return measure(step, **kwargs)

demo.saved_activation_bytes = spy
before = caches()
rows = demo.run_demo(["cos-cos"], numel=256, repeats=1, compiler="eager")
print(json.dumps({"before": before, "seen": seen, "after": caches(),
                  "names": [r.saved_names for r in rows if r.method == demo.REMAT]}))
"""


def test_the_demo_compiles_with_the_compiled_graph_caches_off():
    """With inductor's FX graph cache and AOTAutograd's cache on (a user's machine: the suite's
    environment turns them off, hence a process of its own), a second ``remat demo`` loaded
    every step from them, planned nothing, and its table left "remat saves" empty: the demo's
    first step of each method, which compiles, runs with both off, and they are on again after."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_AUTOGRAD_CACHE", "TORCHINDUCTOR_FX_GRAPH_CACHE")}
    r = subprocess.run([sys.executable, "-c", _DEMO_CACHES], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before"] == out["after"] == [True, True]
    from remat.cli.demo import METHODS
    assert out["seen"] == [[False, False]] * len(METHODS)
    assert out["names"] == [["add_2"]]


def test_bad_arguments_print_one_line_and_exit_2(tmp_path):
    path = tmp_path / "cos.json"
    save_graph(cos_cos_graph(), path)
    cases = [
        (["--budget", "abc"], "budget 'abc' is not understood"),
        (["--budget", "1.5"], "neither a fraction in (0, 1] nor a byte count"),
        (["--solver", "foo"], "unknown solver 'foo'; solvers: auto, mincut-conservative"),
        (["--time-limit", "-1"], "--time-limit: -1 must be a number of seconds >= 0"),
        (["--solver", "checkmate"], "needs a memory budget"),
        (["--solver", "torch-mincut"], "PyTorch's own partitioner"),
        (["--budget", "0.5", "--max-overhead", "0.1"], "not both"),
        (["--solver", "mincut-conservative", "--max-overhead", "0.1"], "has no option 'max_overhead'"),
    ]
    for args, message in cases:
        r = run_cli("plan", str(path), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_plan_with_a_budget_uses_compile_s_planner_headroom_and_error(tmp_path, capsys):
    path = tmp_path / "cos.json"
    save_graph(cos_cos_graph(), path)
    assert main(["plan", str(path), "--solver", "auto", "--budget", "0.9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["peak_bytes"] <= out["budget"] == out["options"]["budget_bytes"]
    assert out["options"]["planned_bytes"] == out["options"]["budget_bytes"]  # a fraction: no headroom
    # min with a time bound, as remat.compile(budget="min", max_overhead=...) takes them
    assert main(["plan", str(path), "--budget", "min", "--max-overhead", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["options"]["budget"] == "min"
    assert main(["plan", str(path), "--budget", "36KiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["options"]["planned_bytes"] == int(36 * 1024 * 0.99)  # remat.compile's TORCH_HEADROOM
    # a budget no plan meets: exit 1, the error of remat.compile (the smallest feasible budget)
    r = run_cli("plan", str(path), "--budget", "20KiB")
    assert r.returncode == 1 and "smallest feasible budget found is" in r.stderr
    r = run_cli("plan", str(path), "--budget", "20KiB", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and not out["feasible"] and out["details"]["smallest_feasible"] > 20 * 1024


def test_plan_json_loads_back_with_its_schedule(tmp_path, capsys):
    from remat.plans import Plan, simulate

    path = tmp_path / "cos.json"
    save_graph(cos_cos_graph(), path)
    for args in ([], ["--solver", "checkmate", "--budget", "0.9"], ["--solver", "griewank", "--budget", "1.0"]):
        assert main(["plan", str(path), "--json", *args]) == 0
        d = json.loads(capsys.readouterr().out)
        plan = Plan.from_dict(d, graph=load_graph(path))
        assert plan.to_dict() == d
        assert simulate(plan.schedule()).peak_bytes == d["peak_bytes"]


def test_a_zero_time_limit_is_honoured():
    """The MILP on ResNet50 ran 54 s with --time-limit 0; now it stops before building, and
    the smallest feasible budget in the message comes from the baselines that need no search
    (the full search took 10 s more)."""
    from paths import CHECKMATE_DIR

    r = run_cli("plan", str(CHECKMATE_DIR / "ResNet50_256_224_224_3_train_nx.json"), "--solver", "checkmate",
                "--budget", "0.6", "--time-limit", "0", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "no_solution"
    assert "time limit (0 s) ran out" in out["message"]
    assert "the time limit stopped the search for a smaller one" in out["message"]
    # a fixed baseline's policy (Chen's sqrt(n)), not only recompute-all's 35.6 GiB
    assert out["details"]["smallest_feasible"] < out["options"]["budget_bytes"] / 2


def test_plan_with_the_swap_solver_prints_offload_and_reload_statements_and_plots(tmp_path, capsys):
    from paths import CHECKMATE_DIR

    png = tmp_path / "streams.png"
    assert main(["plan", str(CHECKMATE_DIR / "vgg_unet_32_416_608_3_train_nx.json"), "--solver", "swap",
                 "--budget", "0.8", "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    ops = [s["op"] for s in out["schedule"]]
    assert ops.count("offload") > 0 and ops.count("reload") >= ops.count("offload")
    assert out["peak_bytes"] <= out["budget"] and "offload" in out["decisions"].values()
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["bench", "--models", "nope"], "--models: unknown model 'nope'; models: all, cos-cos"),
    (["bench", "--models", "mlp", "--methods", "nope"], "unknown method 'nope'"),
    (["bench", "--models", "mlp", "--methods", "eager,auto:budget=1.5"], "method 'auto:budget=1.5': budget 1.5"),
    (["bench", "--size", "huge"], "--size 'huge': use one or more of tiny, small, full"),
    (["bench", "--repeats", "0"], "--repeats: 0 must be at least 1"),
    (["bench", "--batch", "-2"], "--batch: -2 must be at least 1"),
    (["capture", "--model", "nope"], "--model: unknown model 'nope'"),
    (["demo", "nope"], "unknown example 'nope'; examples: cos-cos"),
    (["demo", "--numel", "-5"], "--numel: -5 must be from 1 to 1073741824"),
    (["demo", "--numel", str(10**12)], "must be from 1 to 1073741824"),
    (["demo", "--repeats", "0"], "--repeats: 0 must be at least 1"),
    (["plan", "g.json", "--budget", "1e300GiB"], "more bytes than any device holds"),
    (["plan", "g.json", "--bandwidth", "inf"], "--bandwidth: inf must be a finite number > 0"),
    (["plan", "g.json", "--max-overhead", "-1"], "--max-overhead: -1 must be a share"),
    (["sweep", "g.json", "--points", "0"], "--points: 0 must be at least 1"),
    (["sweep", "g.json", "--budgets", "0.5,abc"], "budget 'abc' is not understood"),
    (["sweep", "g.json", "--solvers", "checkmate,nope"], "unknown solver 'nope'"),
])
def test_a_mistake_is_one_line_and_exit_2_before_any_work(tmp_path, monkeypatch, args, message):
    """Before, `remat bench --models nope` ran 35-70 s and wrote a results folder of error rows,
    `remat demo --numel -5` printed a traceback and `--repeats 0` ran 260 s and exited 0."""
    import remat.bench.runner
    import remat.cli.demo

    def no_work(*a, **k):
        raise AssertionError("the command ran: its arguments should have been refused first")

    monkeypatch.setattr(remat.bench.runner, "run", no_work)
    monkeypatch.setattr(remat.cli.demo, "run_demo", no_work)
    monkeypatch.chdir(tmp_path)
    r = run_cli(*args)
    assert r.returncode == 2, (args, r.stderr)
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr, (args, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_methods_with_several_options_are_one_method_each():
    """`--methods checkmate:budget=0.5,time_limit=20,threads=1` is one method (the README's
    example); before, the runner split it at every comma."""
    from remat.bench.methods import parse_method, split_methods

    methods = split_methods("eager,checkmate:budget=0.5,time_limit=20,threads=1,auto:budget=0.6")
    assert methods == ["eager", "checkmate:budget=0.5,time_limit=20,threads=1", "auto:budget=0.6"]
    spec = parse_method(methods[1])
    assert spec.options == {"budget": 0.5, "time_limit": 20} and spec.solver_options == {"threads": 1}


def test_a_results_file_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """`remat bench --out` resumes from OUT/results.json: an unreadable one raised a JSON
    traceback; it is an error naming the fix, before any work."""
    import remat.bench.runner

    (tmp_path / "results.json").write_bytes(b"\xff not json")
    r = run_cli("bench", "--models", "cos-cos", "--methods", "eager", "--out", str(tmp_path), "--no-progress")
    assert r.returncode == 2 and "cannot be resumed from: it is not UTF-8" in r.stderr and "--no-resume" in r.stderr
    assert r.stderr.strip().count("\n") == 0
