"""torchtitan's Llama 3 model definition under FSDP2 (``fully_shard`` on each transformer block and
on the root) on 2 gloo ranks on the CPU, with ``remat.checkpoint`` applied before sharding (as
torchtitan's ``parallelize_llama`` orders activation checkpointing and FSDP2) and with
``remat.compile`` of the sharded model: each rank's gradients of 2 SGD steps equal the same run
without remat, and remat did save less. ``tests/torchtitan_worker.py`` is one rank, run once for
every case (starting a rank and importing torchtitan cost ~10 s here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torchtitan_model as titan  # before torchtitan: it stands in for Triton where it is missing
from ranks import run_ranks

import remat

pytest.importorskip("torchtitan")

try:
    titan.block_class()
except ImportError as e:  # a torchtitan whose model definitions need what is not installed
    pytest.skip(f"torchtitan's Llama 3 does not import: {e}", allow_module_level=True)

import torch.distributed as dist

WORKER = Path(__file__).with_name("torchtitan_worker.py")
WORLD = 2
REFERENCE = "none"
RUNS = ["checkpoint:0.8", "checkpoint:min", "compile:0.5"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("torchtitan-fsdp")
    specs = [REFERENCE, *RUNS]
    files = {s: [out / f"{s.replace(':', '_')}-{r}.pt" for r in range(WORLD)] for s in specs}
    run_ranks(WORKER, specs, out, WORLD, 300, "torchtitan FSDP2 run",
              [out / f"done-{r}" for r in range(WORLD)] + [f for fs in files.values() for f in fs],
              OMP_NUM_THREADS="1")
    got = {s: [torch.load(f) for f in fs] for s, fs in files.items()}
    for s, records in got.items():
        for rank, record in enumerate(records):
            if record["error"]:
                pytest.fail(f"rank {rank}, {s}:\n{record['error']}", pytrace=False)
    return got


def _max_grad_err(got: list[dict], want: list[dict]) -> float:
    """max |g - g_ref| over every parameter and step (one dict per step), relative to the largest |g_ref|."""
    diff = max(float((a[n] - b[n]).abs().max()) for a, b in zip(got, want) for n in b)
    scale = max(float(b[n].abs().max()) for b in want for n in b)
    return diff / scale


@pytest.mark.slow
@pytest.mark.parametrize("spec", RUNS)
def test_gradients_equal_fsdp2_without_remat(ranks, spec):
    for rank, (got, want) in enumerate(zip(ranks[spec], ranks[REFERENCE])):
        assert got["grads"][0].keys() == want["grads"][0].keys()
        err = _max_grad_err(got["grads"], want["grads"])
        assert err <= 1e-5, f"rank {rank}, {spec}: gradients differ by {err:.2e} of their largest"
        assert got["losses"] == pytest.approx(want["losses"], rel=1e-6)
    assert ranks[REFERENCE][0]["losses"] != ranks[REFERENCE][1]["losses"], "both ranks trained on the same batch"


@pytest.mark.slow
@pytest.mark.parametrize("spec", RUNS)
def test_remat_saved_less(ranks, spec):
    """remat's plans are in force: the step saves less for the backward than FSDP2 alone, and
    ``remat.compile`` planned the step's graphs (FSDP2 splits it) without falling back."""
    for got, want in zip(ranks[spec], ranks[REFERENCE]):
        assert got["saved_bytes"] < 0.8 * want["saved_bytes"], (got["saved_bytes"], want["saved_bytes"])
        if spec.startswith("compile"):
            assert got["plans"] >= 1 and not got["fallbacks"], got["fallbacks"]


def test_checkpoint_finds_torchtitan_s_blocks_without_being_told():
    model = titan.llama3()
    remat.checkpoint(model, budget="min")
    from remat.eager.blocks import find_blocks

    assert [n for n, _ in find_blocks(model)] == [f"layers.{i}" for i in range(titan.LAYERS)]
