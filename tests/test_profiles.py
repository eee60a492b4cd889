"""Device profiles a user can name, write and reuse (remat.cost.profiles), the device
measurements stored once per device and torch version (remat.cost.probes), and the plan
cache's key on the profile."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from remat.cost import calibrate, probes
from remat.cost.model import (
    DATASHEETS,
    CostModel,
    DeviceProfile,
    GiB,
    profile_for_graph,
)
from remat.cost.profiles import (
    known_names,
    load_profile,
    memory_bytes,
    profile_key,
    resolve_profile,
    save_profile,
)
from remat.errors import OptionError, RematCacheWarning
from remat.graph.examples import cos_cos_graph
from remat.plans.cache import cache_key

FAKE = DeviceProfile("cpu (measured)", 123e9, 9e9, 2e-6, conv_workspace=1.0, op_seconds=2.5e-6,
                     view_seconds=1e-6, matmul_curve=((8e3, 1e9), (4e6, 123e9)),
                     conv_curve=((7e4, 2e9), (6e8, 100e9)), bandwidth_curve=((2e5, 3e10), (2e8, 5e9)),
                     element_seconds=1e-10)
"""What a measurement of this CPU returns in these tests (a real one takes 3-13 s)."""


@pytest.fixture
def measured(monkeypatch):
    """Counts the device measurements this process makes; each returns :data:`FAKE` (or
    ``2e-5`` s for the SAC probe). The per-process caches start empty and are left empty."""
    calls = {"profile": 0, "sac": 0}

    def fake_measure(device, n_matmul, copy_bytes, dtype=None):
        calls["profile"] += 1
        return FAKE

    def fake_sac():
        calls["sac"] += 1
        return 2e-5

    monkeypatch.setattr(calibrate, "_measure", fake_measure)
    monkeypatch.setattr(calibrate, "_measure_sac", fake_sac)
    for f in (calibrate.cpu_profile, calibrate.sac_overhead):
        f.cache_clear()
    yield calls
    for f in (calibrate.cpu_profile, calibrate.sac_overhead):
        f.cache_clear()


def _fresh_process_caches():
    calibrate.cpu_profile.cache_clear()
    calibrate.sac_overhead.cache_clear()


# -- names ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, gpu, dtype", [
    ("H100", "H100", "bf16"), ("h100-bf16", "H100", "bf16"), ("H100_fp16", "H100", "fp16"),
    ("H200", "H200", "bf16"), ("A100-40GB", "A100-40GB", "bf16"), ("a100 40gb fp32", "A100-40GB", "fp32"),
    ("A100", "A100-80GB", "bf16"), ("A100-80GB", "A100-80GB", "bf16"), ("L4", "L4", "bf16"),
    ("RTX4090", "RTX4090", "bf16"), ("rtx-4090-fp32", "RTX4090", "fp32"),
])
def test_gpu_names_resolve_to_their_datasheet(name, gpu, dtype):
    p = resolve_profile(name)
    sheet = DATASHEETS[gpu]
    assert p.name == f"{gpu.lower()}-{dtype}"
    assert p.peak_flops == pytest.approx(0.8 * getattr(sheet, dtype))
    assert p.bandwidth == pytest.approx(0.9 * sheet.bandwidth)
    assert p.memory == sheet.memory == memory_bytes(name)
    assert p.matmul_curve[-1][1] == pytest.approx(p.peak_flops)  # small matmuls below the peak
    assert resolve_profile(p) is p


def test_the_datasheet_figures():
    """The published numbers (dense, no sparsity) the named profiles are built from."""
    gib = {gpu: sheet.memory / GiB for gpu, sheet in DATASHEETS.items()}
    assert gib == {"H100": 80, "H200": 141, "A100-40GB": 40, "A100-80GB": 80, "L4": 24, "RTX4090": 24}
    tflops = {gpu: (s.bf16 / 1e12, s.fp32 / 1e12) for gpu, s in DATASHEETS.items()}
    assert tflops == {"H100": (989.4, 66.9), "H200": (989.4, 66.9), "A100-40GB": (312, 19.5),
                      "A100-80GB": (312, 19.5), "L4": (121, 30.3), "RTX4090": (165.2, 82.6)}
    tb = {gpu: s.bandwidth / 1e12 for gpu, s in DATASHEETS.items()}
    assert tb == {"H100": 3.35, "H200": 4.8, "A100-40GB": 1.555, "A100-80GB": 2.039, "L4": 0.3, "RTX4090": 1.008}


def test_dtypes_differ_as_the_datasheets_say():
    for gpu in DATASHEETS:
        bf16, fp16, fp32 = (resolve_profile(gpu, dtype=d) for d in ("bf16", "fp16", "fp32"))
        assert bf16.peak_flops == fp16.peak_flops  # one tensor-core rate on these parts
        assert bf16.bandwidth == fp32.bandwidth and bf16.memory == fp32.memory
        assert fp32.peak_flops < bf16.peak_flops
    h100 = resolve_profile("H100")
    assert h100.peak_flops / resolve_profile("H100-fp32").peak_flops == pytest.approx(989.4 / 66.9)
    assert resolve_profile("RTX4090").peak_flops / resolve_profile("RTX4090-fp32").peak_flops == pytest.approx(2.0)
    assert resolve_profile("H200").peak_flops == h100.peak_flops and resolve_profile("H200").bandwidth > h100.bandwidth
    import torch

    assert resolve_profile("H100", dtype=torch.float16).name == "h100-fp16"


def test_a_captured_graph_on_a_gpu_is_priced_by_its_datasheet():
    g = cos_cos_graph()
    for device_name, gpu in [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                             ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"),
                             ("NVIDIA L4", "l4"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
                             ("NVIDIA L40S", "a100-80gb")]:  # not an L4: an unknown GPU, the A100's
        g.meta["device"] = {"type": "cuda", "name": device_name, "dtype": "bfloat16"}
        assert profile_for_graph(g) == resolve_profile(f"{gpu}-bf16"), device_name


def test_unknown_names_and_conflicting_dtypes_are_errors_that_say_what_to_write():
    with pytest.raises(OptionError) as e:
        resolve_profile("H300")
    for name in ("H100", "H200", "A100-40GB", "A100-80GB", "L4", "RTX4090", "cpu", "cuda"):
        assert name in str(e.value) and name in known_names()
    with pytest.raises(OptionError, match="bf16.*fp32|names the dtype"):
        resolve_profile("H100-bf16", dtype="fp32")
    with pytest.raises(OptionError, match="bf16, fp16 and fp32"):
        resolve_profile("H100", dtype="int8")
    with pytest.raises(OptionError, match="carries its own"):
        resolve_profile(resolve_profile("H100"), dtype="fp32")
    with pytest.raises(OptionError, match="not int"):
        resolve_profile(100)


def test_cpu_is_this_machines_measured_profile(measured):
    assert resolve_profile("cpu") == FAKE and resolve_profile("CPU") is resolve_profile("cpu")
    assert memory_bytes("cpu") is None and memory_bytes(FAKE) is None
    assert measured["profile"] == 1


# -- files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [resolve_profile("H100"), resolve_profile("L4-fp32"), FAKE,
                                     DeviceProfile("NVIDIA H200 (measured)", 7e14, 4.3e12, 5e-6, memory=150 * 10**9)])
def test_a_profile_file_round_trips_equal(tmp_path, profile):
    path = save_profile(profile, tmp_path / "p.json")
    back = load_profile(path)
    assert back == profile and profile_key(back) == profile_key(profile)
    assert resolve_profile(str(path)) == profile and resolve_profile(path) == profile
    entry = json.loads(path.read_text())
    assert entry["format"] == "remat-device-profile" and entry["version"] == 1
    if profile.name.endswith("(measured)"):
        assert entry["source"] == "measured" and entry["torch"]  # the torch it was measured with
        assert entry["device"] == profile.name.removesuffix(" (measured)")
    else:
        assert entry["source"] == "datasheet" and entry["torch"] is None and "NVIDIA" in entry["device"]


def _good_entry() -> dict:
    return json.loads(json.dumps({"format": "remat-device-profile", "version": 1, "source": "measured",
                                  "device": "x", "torch": "2.13", "profile": {
                                      "name": "x", "peak_flops": 1e12, "bandwidth": 1e11,
                                      "matmul_curve": [[1e3, 1e9], [1e6, 1e12]], "memory": 1 << 30}}))


@pytest.mark.parametrize("edit, why", [
    (lambda e: "not json {", "not JSON"),
    (lambda e: {**e, "format": "other"}, "not a remat device profile"),
    (lambda e: {**e, "version": 99}, "version 99"),
    (lambda e: {**e, "profile": None}, 'no "profile"'),
    (lambda e: {**e, "profile": {**e["profile"], "peak_flops": -1}}, "peak_flops is -1"),
    (lambda e: {**e, "profile": {**e["profile"], "bandwidth": "fast"}}, "bandwidth is 'fast'"),
    (lambda e: {k: v for k, v in e.items()} | {"profile": {"name": "x", "bandwidth": 1e11}}, "no 'peak_flops'"),
    (lambda e: {**e, "profile": {**e["profile"], "matmul_curve": [[1e6, 1e12], [1e3, 1e9]]}}, "ascending"),
    (lambda e: {**e, "profile": {**e["profile"], "memory": 0.5}}, "memory is 0.5"),
    (lambda e: {**e, "profile": {**e["profile"], "colour": "green"}}, "colour"),
])
def test_a_bad_profile_file_is_a_clear_error_naming_the_file(tmp_path, edit, why):
    path = tmp_path / "bad.json"
    assert load_profile(_write(path, _good_entry())).peak_flops == 1e12
    content = edit(_good_entry())
    _write(path, content)
    with pytest.raises(OptionError) as e:
        load_profile(path)
    assert str(path) in str(e.value) and why in str(e.value) and "remat profile -o" in str(e.value)


def test_a_missing_profile_file_says_how_to_write_one(tmp_path):
    with pytest.raises(OptionError, match="there is no profile file.*remat profile -o"):
        resolve_profile(str(tmp_path / "h100.json"))


def _write(path, content):
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# -- the plan cache's key -----------------------------------------------------------------------
def test_the_plan_cache_key_differs_per_profile(measured, tmp_path):
    g = cos_cos_graph()
    targets = ["H100", "H100-fp32", "H200", "A100-40GB", "A100", "L4", "RTX4090", "cpu"]
    keys = {t: cache_key(g, "mincut-aggressive", budget=0.9, cost_model=CostModel(resolve_profile(t)))
            for t in targets}
    assert len(set(keys.values())) == len(targets)
    assert len({profile_key(resolve_profile(t)) for t in targets}) == len(targets)
    back = load_profile(save_profile(resolve_profile("H100"), tmp_path / "h100.json"))
    again = cache_key(g, "mincut-aggressive", budget=0.9, cost_model=CostModel(back))
    assert again == keys["H100"]  # a profile read back from its file keys the same plans


def test_a_plan_stored_for_an_h100_is_not_served_for_the_cpu(measured, tmp_path):
    from remat.solvers.cached import cached_solve

    g = cos_cos_graph()
    h100 = cached_solve(g, "mincut-aggressive", cost_model=CostModel(resolve_profile("H100")), cache=tmp_path)
    assert h100.cache == "miss"
    assert cached_solve(g, "mincut-aggressive", cost_model=CostModel(resolve_profile("H100")), cache=tmp_path).cache == "hit"
    assert cached_solve(g, "mincut-aggressive", cost_model=CostModel(resolve_profile("cpu")), cache=tmp_path).cache == "miss"


# -- measurements stored once per device and torch version ---------------------------------------
def test_a_measurement_is_stored_and_read_instead_of_measured_again(measured, _plan_cache):
    p = calibrate.profile_for("cpu")
    s = calibrate.sac_overhead()
    assert (p, s) == (FAKE, 2e-5) and measured == {"profile": 1, "sac": 1}
    files = sorted(f.name for f in (_plan_cache / "probes").iterdir())
    assert len(files) == 2 and files[0].startswith("profile-") and files[1].startswith("sac-")
    # the stored profile is a profile file too
    assert load_profile(_value_file(_plan_cache)) == FAKE
    _fresh_process_caches()  # as a new process would start
    assert calibrate.profile_for("cpu") == FAKE and calibrate.sac_overhead() == 2e-5
    assert measured == {"profile": 1, "sac": 1}


def _value_file(cache):
    entry = json.loads(next((cache / "probes").glob("profile-*.json")).read_text())
    out = cache / "value.json"
    out.write_text(json.dumps(entry["value"]))
    return out


def test_a_second_process_reads_the_stored_probes_instead_of_measuring(measured, _plan_cache):
    import torch

    calibrate.profile_for("cpu"), calibrate.sac_overhead()
    # the probes are keyed on torch's thread count: the child runs with this process's (an
    # earlier test in this worker may have set it)
    code = (f"import torch; torch.set_num_threads({torch.get_num_threads()})\n"
            "import json, remat.cost.calibrate as c\n"
            "def refuse(*a, **k):\n"
            "    raise AssertionError('measured again')\n"
            "c._measure = c._measure_sac = refuse\n"
            "from remat.eager import policy\n"
            "p = policy.device_profile('cpu')\n"
            "print(json.dumps([p.peak_flops, p.matmul_curve, policy.sac_overhead()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    peak, curve, sac = json.loads(out)
    assert peak == FAKE.peak_flops and [tuple(x) for x in curve] == list(FAKE.matmul_curve) and sac == 2e-5


def test_another_thread_count_or_torch_is_measured_again(measured, monkeypatch):
    import torch

    calibrate.cpu_profile()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        _fresh_process_caches()
        calibrate.cpu_profile()
        assert measured["profile"] == 2
    finally:
        torch.set_num_threads(threads)
    version = torch.__version__
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    _fresh_process_caches()
    calibrate.cpu_profile()
    assert measured["profile"] == 3
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(calibrate, "_measure", lambda *a, **k: pytest.fail("measured again"))
    _fresh_process_caches()
    assert calibrate.cpu_profile() == FAKE  # the first is still there


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b'{"format": "remat-probe", "version": 1}',
                                     b"[]", b"x" * (2 << 20)])
def test_a_corrupt_probe_file_is_measured_again_with_a_warning(measured, content):
    calibrate.cpu_profile(), calibrate.sac_overhead()
    for path in probes.probe_directory().iterdir():
        path.write_bytes(content)
    _fresh_process_caches()
    with pytest.warns(RematCacheWarning, match="measuring again"):
        assert calibrate.cpu_profile() == FAKE and calibrate.sac_overhead() == 2e-5
    assert measured == {"profile": 2, "sac": 2}
    _fresh_process_caches()  # and replaced: read from then on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibrate.cpu_profile(), calibrate.sac_overhead()
    assert measured == {"profile": 2, "sac": 2}


def test_a_stored_value_that_does_not_load_is_measured_again(measured):
    calibrate.sac_overhead()
    path = next(probes.probe_directory().glob("sac-*.json"))
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "value": -3}))
    _fresh_process_caches()
    with pytest.warns(RematCacheWarning, match="not a number of seconds"):
        assert calibrate.sac_overhead() == 2e-5
    assert measured["sac"] == 2


def test_the_plan_caches_off_switch_turns_the_store_off(measured, monkeypatch, tmp_path):
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    assert probes.probe_directory() is None
    for _ in range(2):
        _fresh_process_caches()
        calibrate.cpu_profile(), calibrate.sac_overhead()
    assert measured == {"profile": 2, "sac": 2}
    monkeypatch.delenv("REMAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert probes.probe_directory() == tmp_path / "remat" / "probes"  # beside remat/plans
    from remat.plans.cache import default_directory

    assert default_directory() == tmp_path / "remat" / "plans"


def test_a_folder_that_cannot_be_written_warns_and_measures(measured, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("REMAT_CACHE_DIR", str(blocker))  # probes would be a folder under a file
    with pytest.warns(RematCacheWarning, match="could not store"):
        assert calibrate.cpu_profile() == FAKE
    assert measured["profile"] == 1


def test_the_eager_planner_reads_the_stored_sac_overhead(measured, monkeypatch):
    from remat.eager import policy

    monkeypatch.delitem(policy._profiles, "sac", raising=False)
    assert policy.sac_overhead() == 2e-5 and measured["sac"] == 1
    assert policy.device_profile("cpu") == FAKE


# -- the command line -------------------------------------------------------------------------
def test_remat_profile_writes_and_shows_profiles(measured, tmp_path, capsys):
    from remat.cli.main import main

    assert main(["profile", "--gpu", "H100", "-o", str(tmp_path / "h100.json")]) == 0
    assert load_profile(tmp_path / "h100.json") == resolve_profile("H100")
    assert main(["profile", "--gpu", "a100-40gb-fp32"]) == 0
    out = capsys.readouterr().out
    assert "a100-40gb-fp32" in out and "15.6 TFLOP/s" in out and "40 GiB" in out
    assert main(["profile", "--device", "cpu", "-o", str(tmp_path / "cpu.json")]) == 0
    assert load_profile(tmp_path / "cpu.json") == FAKE and measured["profile"] == 1
    assert "wrote cpu, measured" in capsys.readouterr().out
    assert main(["profile", "--gpu", str(tmp_path / "cpu.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_flops"] == FAKE.peak_flops
    assert main(["profile", "--device", "cpu"]) == 0 and measured["profile"] == 1  # stored, not measured
    assert main(["profile", "--device", "cpu", "--remeasure"]) == 0 and measured["profile"] == 2
    capsys.readouterr()
    assert main(["profile", "--gpu", "H300"]) == 2
    assert "H100, H200" in capsys.readouterr().err


def test_a_gpu_is_measured_once_per_gpu_model_with_its_memory(measured, monkeypatch):
    """The CUDA path on this CPU build, torch.cuda's queries stood in for: the profile carries
    the GPU's memory, and another GPU model is measured again, not read."""
    import contextlib
    import types

    import torch

    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory": 85_000_000_000}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: gpu["name"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: types.SimpleNamespace(total_memory=gpu["memory"]))
    calibrate.cuda_profile.cache_clear()
    try:
        p = resolve_profile("cuda")
        assert p.memory == gpu["memory"] and p.peak_flops == FAKE.peak_flops and measured["profile"] == 1
        calibrate.cuda_profile.cache_clear()
        assert resolve_profile("cuda") == p and measured["profile"] == 1  # read back
        gpu.update(name="NVIDIA H200", memory=150_000_000_000)
        calibrate.cuda_profile.cache_clear()
        assert resolve_profile("cuda").memory == gpu["memory"] and measured["profile"] == 2
        assert memory_bytes("cuda") == gpu["memory"]
    finally:
        calibrate.cuda_profile.cache_clear()
