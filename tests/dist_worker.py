"""One rank of a 2-process gloo run of remat under DDP, FSDP2 (``fully_shard``) and tensor
parallelism.

Launched by ``tests/test_distributed.py``, one process per rank, with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set::

    python tests/dist_worker.py --out DIR RUN [RUN ...]

A RUN is ``WRAP:COMPILER:SOLVER[:BUDGET]``, e.g. ``ddp:eager:auto``, ``fsdp:eager:auto:0.6``.
WRAP is one of

- ``ddp``: ``DistributedDataParallel`` with 0.1 MiB buckets, so that dynamo's DDPOptimizer
  splits the step into one graph per bucket; each rank trains on its own data;
- ``fsdp``: ``fully_shard`` on each block, then on the root; each rank its own data;
- ``tp``: Megatron-style tensor-parallel MLPs written with functional collectives
  (``_c10d_functional.all_reduce`` in the forward, and in the backward, of each block), so
  that the compiled graphs hold collectives (DDP and FSDP2 run theirs outside the graphs);
  both ranks train on the same data, as tensor parallelism needs;
- ``dtensor``: the same MLPs sharded with DTensor (``parallelize_module`` with
  ``ColwiseParallel`` / ``RowwiseParallel``).

Every rank seeds the same and builds the same small GPT-2-like decoder (plain torch, 2
blocks, width 64, the causal LM loss inside ``forward``). For each WRAP it trains 3 steps in
eager (the reference), then each RUN trains the same 3 steps from the same weights through
``remat.compile(..., strict=True)``. Rank 0 writes ``DIR/result.json`` with every rank's
losses, plans (name, saved set, recomputed values, each collective and how often the
schedule computes it) and timings; a rank that fails outside a run writes
``DIR/error-RANK.txt``. remat's plan cache is off, so every rank plans for itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
os.environ["REMAT_CACHE_DIR"] = "off"  # each rank plans on its own: equal plans mean something

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

STEPS = 3
VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 128, 64, 4, 2, 16, 8
BUCKET_MB = 0.1
WRAPS = ("ddp", "fsdp", "tp", "dtensor")

# the collectives of torch.distributed's functional API (_c10d_functional), as the names of
# remat's Graph nodes spell them (the op's name without its namespace), and their waits
COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
    "all_gather_into_tensor", "all_gather_into_tensor_coalesced", "all_gather_into_tensor_out",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "all_to_all_single",
    "broadcast", "broadcast_", "wait_tensor",
})


def is_collective(op: str) -> bool:
    return op.split(".")[0] in COLLECTIVES or "c10d" in op


class _ReduceForward(torch.autograd.Function):
    """Megatron's ``g``: sum over the ranks in the forward, identity in the backward."""

    @staticmethod
    def forward(ctx, x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _ReduceBackward(torch.autograd.Function):
    """Megatron's ``f``: identity in the forward, sum over the ranks in the backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)
        self.out_bias = None  # tensor parallel: the bias added once, after the sum over ranks

    def mlp(self, x):
        if self.out_bias is None:
            return self.out(F.gelu(self.fc(x), approximate="tanh"))
        y = self.out(F.gelu(self.fc(_ReduceBackward.apply(x)), approximate="tanh"))
        return _ReduceForward.apply(y) + self.out_bias

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (y.view(b, t, HEADS, c // HEADS).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-2-like decoder whose forward returns the causal LM loss."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def _shard_mlp(block: Block, rank: int, world: int) -> None:
    """Megatron's column-parallel ``fc`` and row-parallel ``out``: this rank's slices of the
    full layers, the output bias applied after the all-reduce."""
    h = 4 * WIDTH // world
    rows = slice(rank * h, (rank + 1) * h)
    fc, out = nn.Linear(WIDTH, h), nn.Linear(h, WIDTH, bias=False)
    with torch.no_grad():
        fc.weight.copy_(block.fc.weight[rows])
        fc.bias.copy_(block.fc.bias[rows])
        out.weight.copy_(block.out.weight[:, rows])
    block.out_bias = nn.Parameter(block.out.bias.detach().clone())
    block.fc, block.out = fc, out


def wrap(model: TinyGPT, how: str) -> nn.Module:
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # 0.1 MiB buckets: the model's ~0.12M parameters (~0.45 MiB) make several buckets, so
        # dynamo's DDPOptimizer splits the step into one graph per bucket. With a bucket_cap_mb
        # of its own, DDP's first bucket is bucket_cap_mb too, but DDPOptimizer takes its first
        # bucket from dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB) and asserts it is at most
        # bucket_cap_mb: make the two agree, as DDP itself does.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(BUCKET_MB * 2**20)
        return DDP(model, bucket_cap_mb=BUCKET_MB)
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    if how == "tp":
        for block in model.blocks:
            _shard_mlp(block, dist.get_rank(), dist.get_world_size())
        return model
    if how == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            parallelize_module(block, mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
        return model
    raise ValueError(f"unknown wrap {how!r}; one of {WRAPS}")


def fresh(how: str) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    return wrap(TinyGPT(), how)


def batches(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(STEPS)]


def train(step_fn, model: nn.Module, data) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for ids in data:
        opt.zero_grad(set_to_none=True)
        loss = step_fn(ids)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def plan_record(graph, plan) -> dict:
    """What the test checks of one graph's plan: its name, saved set, recomputed values and
    every collective node with how often the plan's schedule computes it."""
    record = {"graph": graph.name, "nodes": len(graph), "solver": plan.solver,
              "feasible": plan.feasible, "peak_bytes": plan.peak_bytes, "saved": plan.saved_names,
              "recomputed": list(plan.recomputed), "moved_to_backward": list(plan.moved_to_backward),
              "collectives": {}, "schedule_error": None}
    collectives = {n.name: n for n in graph if is_collective(n.op)}
    counts = dict.fromkeys(collectives, 0)
    try:
        for s in plan.schedule().statements:
            if s.op == "compute" and s.node in counts:
                counts[s.node] += 1
    except Exception as e:  # noqa: BLE001 - a plan without a schedule is reported, not hidden
        record["schedule_error"] = f"{type(e).__name__}: {e}"
    for name, n in collectives.items():
        record["collectives"][name] = {"op": n.op, "role": n.role, "must_save": bool(n.must_save),
                                       "computed": counts[name]}
    return record


def parse_budget(text: str | None):
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return text  # "6GiB", "60%"


def run_one(spec: str, rank: int) -> dict:
    import remat

    how, compiler, solver, *rest = spec.split(":")
    budget = parse_budget(rest[0] if rest else None)
    data = batches(0 if how in ("tp", "dtensor") else rank)  # tensor parallel: one batch for all
    plans: list[dict] = []
    torch._dynamo.reset()
    t0 = time.perf_counter()
    model = fresh(how)
    step = remat.compile(model, compiler=compiler, solver=solver, budget=budget, strict=True,
                         on_plan=lambda g, p: plans.append(plan_record(g, p)))
    error = None
    try:
        losses = train(step, model, data)
    except Exception as e:  # noqa: BLE001 - reported to the test, which decides
        losses, error = [], f"{type(e).__name__}: {e}"
        traceback.print_exc()
    return {"spec": spec, "wrap": how, "compiler": compiler, "solver": solver, "budget": budget,
            "losses": losses, "plans": plans, "error": error,
            "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+", help="WRAP:COMPILER:SOLVER[:BUDGET]")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    # a rank left waiting in a collective (its peer failed) raises instead of hanging
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        mine: dict = {"rank": rank, "reference": {}, "runs": []}
        for spec in args.runs:
            how = spec.split(":")[0]
            if how not in mine["reference"]:
                torch._dynamo.reset()
                t0 = time.perf_counter()
                model = fresh(how)
                losses = train(model, model, batches(0 if how in ("tp", "dtensor") else rank))
                mine["reference"][how] = {"losses": losses, "seconds": time.perf_counter() - t0}
            mine["runs"].append(run_one(spec, rank))
            print(f"rank {rank}: {spec} done in {mine['runs'][-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            with open(os.path.join(args.out, "result.json"), "w") as f:
                json.dump({"world_size": world, "ranks": everyone}, f, indent=1, default=str)
        return 0
    except BaseException:
        with open(os.path.join(args.out, f"error-{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: after the work is written and the process
    # group destroyed, a C++ thread of torch's runtime (gloo, inductor's compile workers) is
    # at times destroyed while still joinable at exit, and the rank aborts with "terminate
    # called without an active exception" (SIGABRT) although every step and record was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
