"""The remat command line: plan a saved graph, capture a model, run the demo; bad input gets a
clear message and exit code 2, never a traceback."""

import json
import subprocess
import sys

import pytest

from remat.cli.main import main
from remat.graph.examples import cos_cos_graph
from remat.graph.io import load_graph, save_graph


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "remat.cli", *args], capture_output=True, text=True)


def test_plan_json_on_saved_graph(tmp_path, capsys):
    path = tmp_path / "cos.json"
    save_graph(cos_cos_graph(), path)
    assert main(["plan", str(path), "--solver", "mincut-conservative", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["saved"]] == ["add_2"]
    assert out["cost"] == 2 * 4096
    assert 0 < out["solve_seconds"] < 5


def test_plan_aggressive_on_checkmate_graph(capsys):
    from paths import CHECKMATE_DIR

    assert main(["plan", str(CHECKMATE_DIR / "VGG16_256_224_224_3_train_nx.json"), "--solver",
                 "mincut-aggressive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved"] and out["solver"] == "mincut-aggressive"


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
    r = run_cli("capture", "--model", "cos-cos", "--out", str(out))
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
