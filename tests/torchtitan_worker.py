"""One rank of a 2-process gloo run of torchtitan's Llama 3 (``tests/torchtitan_model.py``) under
FSDP2, with and without remat.

Launched by ``tests/test_torchtitan_fsdp.py``, one process per rank, with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set::

    python tests/torchtitan_worker.py --out DIR RUN [RUN ...]

A RUN is ``none`` (the reference: FSDP2 alone), ``checkpoint:BUDGET`` (``remat.checkpoint`` on
torchtitan's transformer blocks, then ``fully_shard`` on each block and on the root, the order
torchtitan's ``parallelize_llama`` applies activation checkpointing and FSDP2) or
``compile:BUDGET`` (``fully_shard`` as above, then ``remat.compile`` of the root with the
``eager`` compiler). Every rank builds the same model from the same seed and trains 2 SGD steps
on its own batch. For each run the rank saves, in ``DIR/RUN-RANK.pt``, its losses, the
unsharded gradients of both steps (``DTensor.full_tensor()``), the bytes its second step saves
through saved-tensor hooks (what a checkpointed block saves goes through checkpointing's own
hooks, so the figure drops where remat wraps blocks), the plans' fallbacks (``remat.compile``)
and any error; it writes ``DIR/done-RANK`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback

os.environ["REMAT_CACHE_DIR"] = "off"

import torch
import torch.distributed as dist
import torchtitan_model as titan

STEPS, BATCH = 2, 4


def batch(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, titan.VOCAB, (BATCH, titan.SEQ), generator=g)


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def run(spec: str, rank: int) -> dict:
    from torch.distributed.fsdp import fully_shard

    import remat
    from remat.bench.measure import saved_activation_bytes

    how, _, budget = spec.partition(":")
    budget = None if not budget else budget if budget == "min" else float(budget)
    model = titan.llama3()
    if how == "checkpoint":
        remat.checkpoint(model, budget=budget, blocks=titan.block_class())
    for layer in model.layers.values():
        fully_shard(layer)
    fully_shard(model)
    plans: list = []
    step = model
    if how == "compile":
        step = remat.compile(model, budget=budget, compiler="eager", on_plan=lambda g, p: plans.append(p))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = batch(rank)
    losses, grads, saved = [], [], None
    for i in range(STEPS):
        opt.zero_grad(set_to_none=True)
        box: dict = {}

        def one(box=box):
            box["loss"] = titan.loss(step, ids)
            box["loss"].backward()

        if i == 1:  # the first step plans (and measures with hooks of its own)
            saved = saved_activation_bytes(one, held=list(model.parameters())).activation_bytes
        else:
            one()
        losses.append(float(box["loss"].detach()))
        grads.append({n: full(p.grad) for n, p in model.named_parameters()})
        opt.step()
    return {"losses": losses, "grads": grads, "saved_bytes": saved, "plans": len(plans),
            "fallbacks": [str(p.fallback) for p in plans if p.fallback is not None]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=240))
    try:
        for spec in args.runs:
            start = time.perf_counter()
            try:
                record = {"error": None, **run(spec, rank)}
            except Exception as e:  # noqa: BLE001 - recorded; the test fails with it
                record = {"error": "".join(traceback.format_exception(e))[-4000:]}
            record["seconds"] = time.perf_counter() - start
            print(f"{spec}: {record['seconds']:.1f} s", flush=True)
            torch.save(record, os.path.join(args.out, f"{spec.replace(':', '_')}-{rank}.pt"))
            dist.barrier()
    finally:
        open(os.path.join(args.out, f"done-{rank}"), "w").close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
