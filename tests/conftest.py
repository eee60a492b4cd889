import os
import warnings

import pytest

# Compiled-graph caches would let a second run skip the partitioner entirely.
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
warnings.filterwarnings("ignore", message=".*dynamo_pgo force disabled.*")


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
