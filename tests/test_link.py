"""The host link measured, not assumed (remat.capture.link, remat.cost.transfer.link_for_graph):
the measurement's arithmetic on fake copy times, its cache (once per device name and torch
version, corrupt files ignored with a warning, off with REMAT_CACHE_DIR=off), no link on a CPU,
and the order link_for_graph picks a GPU's link in."""

import json

import pytest
import torch

from remat.capture import link as lk
from remat.cost.transfer import COPY_LATENCY, DEFAULT_GPU_LINK, H100_LINK, link_for_graph
from remat.errors import RematCacheWarning
from remat.graph.examples import cos_cos_graph

H200 = "NVIDIA H200"


class FakeMeasure:
    """A ``measure`` callable that counts its calls and returns a new link each time."""

    def __init__(self, name=H200):
        self.name, self.calls = name, 0

    def __call__(self):
        self.calls += 1
        return {"bandwidth": 40e9 + self.calls, "h2d": 50e9, "d2h": 40e9 + self.calls, "latency": 7e-6,
                "device": self.name, "torch": torch.__version__, "source": "measured"}


def _cuda_graph(name, link=None):
    g = cos_cos_graph()
    g.meta["device"] = {"type": "cuda", "name": name, "dtype": "bfloat16"}
    if link is not None:
        g.meta["device"]["link"] = link
    return g


# -- the measurement -------------------------------------------------------------------------------
def test_link_from_timings_takes_medians_the_best_size_and_the_slower_direction():
    calls = []

    def time_copy(direction, nbytes, repeats):
        calls.append((direction, nbytes, repeats))
        if repeats == 1:  # the warm-up: never counted
            return [1.0]
        rate = 50e9 if direction == "h2d" else 40e9
        latency = 3e-6 if direction == "h2d" else 5e-6
        t = nbytes / rate if nbytes > lk.SMALL else latency
        small_size_penalty = 2.0 if nbytes == 1 << 20 else 1.0  # the small size's rate is worse
        return [t * small_size_penalty, 9.0, t * small_size_penalty, t * small_size_penalty, 0.0][:repeats]

    got = lk.link_from_timings(time_copy, sizes=(1 << 20, 64 << 20), repeats=5)
    assert got["h2d"] == pytest.approx(50e9) and got["d2h"] == pytest.approx(40e9)
    assert got["bandwidth"] == got["d2h"]
    assert got["latency"] == pytest.approx(5e-6)
    for direction in ("h2d", "d2h"):  # each size warmed up once, then timed
        for n in (lk.SMALL, 1 << 20, 64 << 20):
            assert calls.count((direction, n, 1)) == 1 and calls.count((direction, n, 5)) == 1


def test_a_cpu_has_no_link_to_measure(tmp_path, _plan_cache):
    assert lk.measure_link("cpu") is None
    assert lk.measure_link(torch.device("cpu")) is None
    assert lk.link_for_device("cpu") is None and lk.link_for_device(torch.device("cpu"), cache=False) is None
    assert not (_plan_cache / "links.json").exists()


# -- the cache --------------------------------------------------------------------------------------
def test_measured_once_then_read_from_the_file(_plan_cache):
    assert lk.links_path() == _plan_cache / "links.json"  # $REMAT_CACHE_DIR, set by conftest
    measure = FakeMeasure()
    first = lk.cached_link(H200, measure)
    assert measure.calls == 1 and first["bandwidth"] == 40e9 + 1
    stored = json.loads((_plan_cache / "links.json").read_text())
    assert stored == {"format": "remat-links", "version": 1,
                      "links": {f"{H200} | torch {torch.__version__}": first}}
    again = FakeMeasure()
    assert lk.cached_link(H200, again) == first and again.calls == 0


def test_keyed_by_device_name_and_torch_version(_plan_cache, monkeypatch):
    h200, h100 = FakeMeasure(), FakeMeasure("NVIDIA H100 80GB HBM3")
    lk.cached_link(H200, h200)
    lk.cached_link("NVIDIA H100 80GB HBM3", h100)
    assert h200.calls == 1 and h100.calls == 1
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    other_torch = FakeMeasure()
    assert lk.cached_link(H200, other_torch)["bandwidth"] == 40e9 + 1 and other_torch.calls == 1
    keys = set(json.loads((_plan_cache / "links.json").read_text())["links"])
    assert len(keys) == 3 and f"{H200} | torch 9.9.9" in keys
    lk.cached_link(H200, other_torch)
    assert other_torch.calls == 1


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": "other", "version": 1, "links": {}}',
                                  '{"format": "remat-links", "version": 1, "links": []}'])
def test_a_corrupt_file_is_ignored_with_a_warning_and_replaced(_plan_cache, text):
    path = _plan_cache / "links.json"
    path.write_text(text)
    measure = FakeMeasure()
    with pytest.warns(RematCacheWarning, match="corrupt"):
        got = lk.cached_link(H200, measure)
    assert measure.calls == 1 and got["bandwidth"] == 40e9 + 1
    assert json.loads(path.read_text())["links"] == {f"{H200} | torch {torch.__version__}": got}


def test_an_unusable_entry_is_measured_again(_plan_cache):
    path = _plan_cache / "links.json"
    path.write_text(json.dumps({"format": "remat-links", "version": 1,
                                "links": {f"{H200} | torch {torch.__version__}": {"bandwidth": 0}}}))
    measure = FakeMeasure()
    assert lk.cached_link(H200, measure)["bandwidth"] == 40e9 + 1 and measure.calls == 1


def test_an_unwritable_cache_warns_and_still_returns_the_measurement(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    measure = FakeMeasure()
    with pytest.warns(RematCacheWarning, match="could not store"):
        got = lk.cached_link(H200, measure, path=blocker / "links.json")
    assert got["bandwidth"] == 40e9 + 1


def test_cache_off_measures_every_time_and_writes_nothing(_plan_cache, monkeypatch, tmp_path):
    measure = FakeMeasure()
    lk.cached_link(H200, measure, cache=False)
    lk.cached_link(H200, measure, cache=False)
    assert measure.calls == 2 and not (_plan_cache / "links.json").exists()
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lk.links_path() is None
    lk.cached_link(H200, measure)
    lk.cached_link(H200, measure)
    assert measure.calls == 4 and list(tmp_path.rglob("*")) == [] and list(_plan_cache.iterdir()) == []


def test_the_default_file_is_beside_the_plans_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("REMAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert lk.links_path() == tmp_path / "remat" / "links.json"
    lk.cached_link(H200, FakeMeasure())
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == \
        ["remat/links.json"]


# -- link_for_graph ---------------------------------------------------------------------------------
def test_link_for_graph_prefers_given_then_measured_then_assumed():
    measured = {"bandwidth": 41e9, "latency": 6e-6, "device": H200, "source": "measured"}
    g = _cuda_graph(H200, measured)
    given = link_for_graph(g, bandwidth=30e9)
    assert (given.bandwidth, given.latency, given.source, given.asynchronous) == (30e9, 6e-6, "given", True)
    got = link_for_graph(g)
    assert (got.bandwidth, got.latency, got.source) == (41e9, 6e-6, f"measured on {H200}")
    plain = link_for_graph(_cuda_graph(H200))
    assert (plain.bandwidth, plain.latency) == (DEFAULT_GPU_LINK, COPY_LATENCY)
    assert "assumed" in plain.source and H200 in plain.source
    assert link_for_graph(_cuda_graph(H200), bandwidth=30e9).latency == COPY_LATENCY


def test_an_unmeasured_h200_does_not_get_the_h100s_link():
    assert link_for_graph(_cuda_graph("NVIDIA H200")).bandwidth == DEFAULT_GPU_LINK != H100_LINK
    h100 = link_for_graph(_cuda_graph("NVIDIA H100 80GB HBM3"))
    assert h100.bandwidth == H100_LINK and "assumed" in h100.source
    other = link_for_graph(_cuda_graph("Some Future GPU"))
    assert other.bandwidth == DEFAULT_GPU_LINK and "assumed" in other.source
    # a measured H100 link wins over the H100 figure
    measured = link_for_graph(_cuda_graph("NVIDIA H100 80GB HBM3", {"bandwidth": 20e9}))
    assert measured.bandwidth == 20e9 and measured.source == "measured on NVIDIA H100 80GB HBM3"
    assert measured.latency == COPY_LATENCY  # no latency measured


@pytest.mark.parametrize("bad", [{}, {"bandwidth": 0}, {"bandwidth": -1.0}, {"bandwidth": None},
                                 {"bandwidth": float("inf")}, {"bandwidth": True}, "55e9"])
def test_an_unusable_meta_link_falls_back_to_the_assumed_one(bad):
    got = link_for_graph(_cuda_graph(H200, bad))
    assert got.bandwidth == DEFAULT_GPU_LINK and "assumed" in got.source


def test_a_cached_measurement_in_meta_prices_the_copies(_plan_cache):
    link = lk.cached_link(H200, FakeMeasure())
    got = link_for_graph(_cuda_graph(H200, link))
    assert got.bandwidth == link["bandwidth"] and got.latency == 7e-6
    assert got.seconds(40 << 20) == pytest.approx(7e-6 + (40 << 20) / link["bandwidth"])


def test_cpu_and_deviceless_graphs_keep_their_links():
    g = cos_cos_graph()
    g.meta["device"] = {"type": "cpu"}
    cpu = link_for_graph(g)
    assert not cpu.asynchronous and cpu.source == "a memcpy on the CPU" and cpu.bandwidth > 1.0
    g.meta["device"] = {"type": "cpu", "link": {"bandwidth": 1.0, "source": "given"}}  # bandwidth=1.0
    given = link_for_graph(g)
    assert not given.asynchronous and given.bandwidth == 1.0 and given.source.startswith("given")
    assert link_for_graph(cos_cos_graph()).source.startswith("moves 0.25")
