"""remat under DDP, FSDP2 (``fully_shard``) and tensor parallelism: 2 processes on localhost
with the gloo backend (``tests/dist_worker.py`` is one rank).

For each run: the same losses as eager training over 3 steps on every rank, the same plan
on every rank (each rank plans on its own, remat's plan cache off), and no collective
computed twice, recomputed by the backward or moved to it. DDP and FSDP2 run their
collectives outside the compiled graphs (DDP's reducer hooks; FSDP2's hooks are
``torch._dynamo.disable``-d), so the collective checks bite on the tensor-parallel runs,
whose graphs hold ``_c10d_functional.all_reduce`` / ``wait_tensor`` in both phases.

Each fixture launches one pair of processes for several runs (starting a rank costs ~15 s
on this machine): the unbudgeted runs ~50 s, the budgeted ones (``slow``) ~50 s, inductor
(``slow``, ``inductor``) ~90 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import run_ranks, tail

pytest.importorskip("torch.distributed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("dist_worker.py")
WORLD = 2
TIMEOUT = 300  # seconds for one launch, both ranks
RTOL, ATOL = 1e-5, 1e-6

FAST = ["ddp:eager:auto", "fsdp:eager:auto", "tp:eager:auto", "tp:eager:mincut-aggressive",
        "dtensor:eager:auto"]
BUDGETED = ["ddp:eager:auto:min", "ddp:eager:auto:1.0", "fsdp:eager:auto:0.8", "fsdp:eager:auto:1.0",
            "tp:eager:auto:1.0"]
INDUCTOR = ["fsdp:inductor:auto"]


def launch(runs: list[str], out: Path) -> dict:
    """Run ``runs`` in WORLD processes; the ranks' gathered records. On a failure or a
    timeout, fails with every rank's stderr."""
    result = out / "result.json"
    run_ranks(WORKER, runs, out, WORLD, TIMEOUT, f"distributed run {runs}", [result],
              TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    data = json.loads(result.read_text())
    data["out"] = str(out)
    return data


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return launch(FAST, tmp_path_factory.mktemp("dist-fast"))


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory):
    return launch(BUDGETED, tmp_path_factory.mktemp("dist-budget"))


@pytest.fixture(scope="module")
def inductor(tmp_path_factory):
    return launch(INDUCTOR, tmp_path_factory.mktemp("dist-inductor"))


def _runs(data: dict, spec: str) -> list[dict]:
    """Each rank's record of ``spec``; fails with the rank's error (and stderr) if it raised."""
    out = []
    for r in data["ranks"]:
        run = next(x for x in r["runs"] if x["spec"] == spec)
        if run["error"]:
            log = tail(Path(data["out"]) / f"stderr-{r['rank']}.txt", 3000)
            pytest.fail(f"rank {r['rank']}, {spec}: {run['error']}\n{log}", pytrace=False)
        out.append(run)
    return out


def _plan_key(p: dict) -> tuple:
    return (p["graph"], p["nodes"], p["solver"], tuple(p["saved"]), tuple(p["recomputed"]),
            tuple(p["moved_to_backward"]), p["peak_bytes"])


def check(data: dict, spec: str) -> list[dict]:
    """Losses equal eager's on every rank, one plan for all ranks, collectives computed once.
    Returns rank 0's plans."""
    runs = _runs(data, spec)
    wrap = spec.split(":")[0]
    for r, run in zip(data["ranks"], runs):
        ref = r["reference"][wrap]["losses"]
        assert len(run["losses"]) == len(ref) == 3
        for step, (got, want) in enumerate(zip(run["losses"], ref)):
            assert abs(got - want) <= ATOL + RTOL * abs(want), \
                f"rank {r['rank']}, {spec}, step {step}: loss {got} with remat, {want} without"
    plans = [run["plans"] for run in runs]
    assert plans[0], f"{spec}: remat planned no graph"
    for rank, mine in enumerate(plans[1:], 1):
        assert [_plan_key(p) for p in mine] == [_plan_key(p) for p in plans[0]], \
            f"{spec}: rank {rank} planned differently from rank 0"
    for p in plans[0]:
        assert p["feasible"] and p["schedule_error"] is None, p
        recomputed, moved = set(p["recomputed"]), set(p["moved_to_backward"])
        for name, c in p["collectives"].items():
            assert c["computed"] == 1, f"{p['graph']}: collective {name} ({c['op']}) computed {c['computed']} times"
            assert name not in recomputed, f"{p['graph']}: collective {name} recomputed by the backward"
            if c["role"] == "forward":
                assert name not in moved, f"{p['graph']}: forward collective {name} moved to the backward"
                assert c["must_save"], f"{p['graph']}: forward collective {name} not must_save"
    return plans[0]


def _collectives(plans: list[dict]) -> dict[str, list[str]]:
    by_role: dict[str, list[str]] = {"forward": [], "backward": []}
    for p in plans:
        for c in p["collectives"].values():
            by_role.setdefault(c["role"], []).append(c["op"])
    return by_role


@pytest.mark.parametrize("spec", FAST)
def test_losses_plans_and_collectives(fast, spec):
    check(fast, spec)


def test_graphs_per_step(fast):
    """DDP: one graph per bucket (DDPOptimizer), each with its own name; FSDP2: the blocks'
    graph (the root's forward runs eagerly: a graph break at an FSDP hook inside its loop over
    the blocks skips the frame); tensor parallel: one graph, collectives in both phases."""
    ddp = [p["graph"] for p in check(fast, "ddp:eager:auto")]
    assert len(ddp) >= 3 and len(set(ddp)) == len(ddp), ddp
    assert all(n.startswith("DistributedDataParallel_") and f"_submod{k}" in n for k, n in enumerate(ddp)), ddp
    fsdp = [p["graph"] for p in check(fast, "fsdp:eager:auto")]
    assert len(fsdp) >= 1 and len(set(fsdp)) == len(fsdp), fsdp
    for spec in ("ddp:eager:auto", "fsdp:eager:auto"):
        assert not any(p["collectives"] for p in check(fast, spec)), "collectives now traced: check them"
    for spec in ("tp:eager:auto", "tp:eager:mincut-aggressive"):
        by_role = _collectives(check(fast, spec))
        assert by_role["forward"].count("all_reduce.default") == 2, by_role  # one per block
        assert by_role["backward"].count("all_reduce.default") == 2, by_role
        assert len(by_role["forward"]) + len(by_role["backward"]) == 8, by_role  # and their waits


def test_tensor_parallel_model_is_the_full_model(fast):
    """The sharded MLPs compute what the full ones do: rank 0's first eager loss under DDP
    (same weights, same batch, before any update) equals tensor parallelism's."""
    r0 = fast["ranks"][0]["reference"]
    assert abs(r0["tp"]["losses"][0] - r0["ddp"]["losses"][0]) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("spec", BUDGETED)
def test_budgeted(budgeted, spec):
    check(budgeted, spec)


@pytest.mark.slow
@pytest.mark.inductor
@pytest.mark.parametrize("spec", INDUCTOR)
def test_inductor(inductor, spec):
    check(inductor, spec)
