"""One rank of a 2-process gloo run of :func:`remat.checkpoint` (eager, no torch.compile) under
DDP and FSDP2 (``fully_shard``).

Launched by ``tests/test_eager_distributed.py``, one process per rank, with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set::

    python tests/eager_dist_worker.py --out DIR RUN [RUN ...]

A RUN is ``WRAP:BUDGET`` (``ddp:min``, ``fsdp:0.5``), ``WRAP:BUDGET:offload``
(``remat.checkpoint(..., offload=True)``: what the plan keeps waits in host memory) or
``WRAP:none`` (the reference: no remat).
WRAP is ``ddp`` (``DistributedDataParallel`` around the model, after ``remat.checkpoint``) or
``fsdp`` (``fully_shard`` on each block, then on the root, after ``remat.checkpoint``, as
torchtitan orders activation checkpointing and sharding). Every rank seeds the same and builds
the same small decoder (plain torch: 2 blocks of width 64, causal attention through SDPA,
dropout 0.1, the LM loss inside ``forward``); each rank trains on its own batch, 3 SGD steps,
the RNG seeded the same before each step of every run (so dropout draws the same masks in the
reference and under remat). For each run the rank records its losses, the bytes its second step
(the first plans) saves through saved-tensor hooks (``remat.bench.measure.saved_activation_bytes``: what a
checkpointed block saves goes through checkpointing's own hooks instead, so the figure drops
where remat wraps blocks) and ``model.remat_summary()``, printed. Each rank writes
``DIR/result-RANK.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback

os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

STEPS = 3
VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 128, 64, 4, 2, 32, 8
P_DROP = 0.1


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(P_DROP)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.down(F.gelu(self.up(self.ln2(x)))))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def build():
    torch.manual_seed(0)
    return Decoder()


def batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def wrap(model: nn.Module, how: str) -> nn.Module:
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def run(spec: str, rank: int) -> dict:
    import remat
    from remat.bench.measure import saved_activation_bytes

    how, budget, *extra = spec.split(":")
    model = build()
    planned = None
    if budget != "none":
        planned = remat.checkpoint(model, budget="min" if budget == "min" else float(budget),
                                   offload="offload" in extra)
    model = wrap(model, how)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = batch(rank)
    losses, saved = [], None
    for step in range(STEPS):
        torch.manual_seed(1000 + step)
        opt.zero_grad(set_to_none=True)
        if step == 1:  # the first step plans (and measures with hooks of its own)
            box = {}

            def one():
                box["loss"] = model(ids)
                box["loss"].backward()

            saved = saved_activation_bytes(one, held=list(model.parameters())).activation_bytes
            loss = box["loss"]
        else:
            loss = model(ids)
            loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    summary = None if planned is None else str(planned.remat_summary())
    off = getattr(getattr(planned, "_remat_planner", None), "_offloader", None)
    return {"spec": spec, "losses": losses, "saved_bytes": saved, "summary": summary, "error": None,
            "offloaded": None if off is None else off.stats.offloaded}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=240))
    records = []
    try:
        for spec in args.runs:
            try:
                records.append(run(spec, rank))
            except Exception as e:  # noqa: BLE001 - recorded; the test fails with it
                records.append({"spec": spec, "error": "".join(traceback.format_exception(e))[-4000:]})
            dist.barrier()
    finally:
        with open(os.path.join(args.out, f"result-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "runs": records}, f)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
