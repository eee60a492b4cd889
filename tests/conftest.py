import os
import warnings

import pytest

# The compiled-graph caches (inductor's FX graph cache, AOTAutograd's) would let a second compile
# skip the partitioner entirely: off. Inductor's kernel cache stays on, so a kernel compiled once
# in the run is not compiled again (every compile still partitions and plans).
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
# The searches stop on work (a count from the graph's size); their shares of the time limit are
# only safety stops, which a loaded CI machine could reach first and so change a plan. Far off
# here, in this process and the ones the tests start: a test's verdict never rests on the clock.
os.environ.setdefault("REMAT_SAFETY_SCALE", "3600")
warnings.filterwarnings("ignore", message=".*dynamo_pgo force disabled.*")


@pytest.fixture(scope="session")
def _plan_cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("remat-plan-cache")


@pytest.fixture(autouse=True)
def _plan_cache(_plan_cache_root, request, monkeypatch):
    """remat's plan cache (on by default) never writes to ~/.cache from the tests, and each test
    has its own (a plan one test stored never answers another's; subprocesses inherit it)."""
    folder = _plan_cache_root / f"{len(list(_plan_cache_root.iterdir())):05d}"
    folder.mkdir()
    monkeypatch.setenv("REMAT_CACHE_DIR", str(folder))
    yield folder


@pytest.fixture(autouse=True)
def _reset_dynamo():
    try:
        import torch._dynamo
    except ImportError:
        yield
        return
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pytest_configure(config):
    """Under pytest-xdist (the README's ``-n 2``) each worker is one of two processes sharing the
    machine's cores: one intra-op thread each (tests that measure on more threads set them)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _inductor_marker(request, monkeypatch):
    """A test that lowers a graph with inductor (10-25 s each here) carries the ``inductor``
    marker, so ``-m "not inductor"`` really leaves them out: fail one that does not."""
    try:
        from torch._inductor.graph import GraphLowering
    except ImportError:
        yield
        return
    lowered = []
    init = GraphLowering.__init__

    def counting(self, *args, **kwargs):
        lowered.append(1)
        return init(self, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "__init__", counting)
    yield
    if lowered and request.node.get_closest_marker("inductor") is None:
        pytest.fail(f"{request.node.nodeid} lowered {len(lowered)} graph(s) with inductor: "
                    "mark it @pytest.mark.inductor", pytrace=False)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add contention on a shared 2-core machine. A module
    that wants it: ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
