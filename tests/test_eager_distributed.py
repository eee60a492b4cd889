"""remat.checkpoint (eager, no torch.compile) under DDP and FSDP2 (``fully_shard`` after
``remat.checkpoint``): 2 processes on localhost with gloo (``tests/eager_dist_worker.py`` is one
rank), a small decoder with dropout, 3 SGD steps.

Each run must give the same losses as the same wrapping without remat, on every rank, and remat
must have checkpointed something: the bytes the second step saves through saved-tensor hooks
(what a checkpointed block saves goes through checkpointing's own hooks instead) drop below
eager's. One launch runs every case (starting a rank costs ~10 s here); about 40-60 s in all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import run_ranks

pytest.importorskip("torch.distributed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("eager_dist_worker.py")
WORLD = 2
TIMEOUT = 240
RTOL, ATOL = 1e-5, 1e-6

REFERENCES = ["ddp:none", "fsdp:none"]
RUNS = ["ddp:min", "ddp:0.8", "fsdp:min", "fsdp:0.8", "ddp:0.8:offload", "fsdp:0.8:offload"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("eager-dist")
    results = [out / f"result-{r}.json" for r in range(WORLD)]
    run_ranks(WORKER, [*REFERENCES, *RUNS], out, WORLD, TIMEOUT, "eager distributed run", results,
              OMP_NUM_THREADS="1")
    return [json.loads(r.read_text()) for r in results]


def _run(rank: dict, spec: str) -> dict:
    run = next(x for x in rank["runs"] if x["spec"] == spec)
    if run["error"]:
        pytest.fail(f"rank {rank['rank']}, {spec}:\n{run['error']}", pytrace=False)
    return run


def test_references_train(ranks):
    """The references are real runs: 3 finite, decreasing-overall losses, different data per rank."""
    for ref in REFERENCES:
        losses = [_run(r, ref)["losses"] for r in ranks]
        assert all(len(x) == 3 for x in losses)
        assert all(x[-1] < x[0] for x in losses), losses
        assert losses[0][0] != losses[1][0], "both ranks trained on the same batch"


@pytest.mark.parametrize("spec", RUNS)
def test_same_losses_as_without_remat(ranks, spec):
    wrap = spec.split(":")[0]
    for r in ranks:
        got, want = _run(r, spec), _run(r, f"{wrap}:none")
        for step, (a, b) in enumerate(zip(got["losses"], want["losses"])):
            assert abs(a - b) <= ATOL + RTOL * abs(b), \
                f"rank {r['rank']}, {spec}, step {step}: loss {a} with remat, {b} without"
        assert len(got["losses"]) == 3


@pytest.mark.parametrize("spec", ["ddp:min", "fsdp:min"])
def test_remat_checkpointed_blocks(ranks, spec):
    """At 'min' remat wraps the blocks: a step saves less through saved-tensor hooks, and the
    summary names the blocks' class."""
    wrap = spec.split(":")[0]
    for r in ranks:
        got, want = _run(r, spec), _run(r, f"{wrap}:none")
        assert got["saved_bytes"] < 0.8 * want["saved_bytes"], (got["saved_bytes"], want["saved_bytes"])
        assert "Block" in got["summary"], got["summary"]


@pytest.mark.parametrize("spec", ["ddp:0.8:offload", "fsdp:0.8:offload"])
def test_offload_moved_values(ranks, spec):
    """With offload=True the values the plan keeps went to host memory (and the losses, checked
    above, did not change)."""
    for r in ranks:
        assert _run(r, spec)["offloaded"], f"rank {r['rank']}, {spec}: nothing offloaded"
