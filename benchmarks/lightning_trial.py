"""Lightning's Trainer on a transformers LM, as a Lightning user calls remat (issue 38).

A LightningModule around a transformers ``Phi3ForCausalLM`` (a config no test names: 2 layers x
128, vocabulary 2048, batch 4 x 256), ``Trainer.fit`` for ``--steps`` steps on CPU, one row per
way to train it: plain; transformers' own activation checkpointing (what a Lightning user turns
on today), alone and with the LM head and the loss in 8 checkpointed token chunks (Liger's
algorithm in plain torch: ``remat.bench.fission.ChunkedHeadLoss``); ``remat.compile`` at 0.5 and ``"min"`` (eager compiler: the partitioned graphs run op
by op, so step times compare plans, not kernels); ``remat.checkpoint`` at 0.5. Columns: the
peak of the last training step above its start (profiler allocation records, through a
callback), its time, the losses' largest difference from plain training, and the first step's
time (compile and planning included).

    python benchmarks/lightning_trial.py [--steps 6]
"""

from __future__ import annotations

import os
import time
import warnings

os.environ.setdefault("REMAT_CACHE_DIR", "off")

import torch  # noqa: E402

import remat  # noqa: E402
from remat.bench import harness  # noqa: E402
from remat.eager.blocks import enable_transformers_checkpointing  # noqa: E402

COLUMNS = ("method", "peak_MiB", "of_plain", "step_s", "first_step_s", "loss_diff", "plans")


def arguments(ap) -> None:
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)


def _module(pl, seq: int, chunks: int = 0):
    import transformers

    from remat.bench.fission import ChunkedHeadLoss

    class LM(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            cfg = transformers.Phi3Config(vocab_size=2048, hidden_size=128, intermediate_size=512,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=seq, pad_token_id=0, use_cache=False)
            self.lm = transformers.Phi3ForCausalLM(cfg)
            self.lm.loss_type = "ForCausalLM"
            # Liger's algorithm in plain torch: the head and the loss in token chunks, each checkpointed
            self.head_loss = ChunkedHeadLoss(self.lm, chunks) if chunks else None
            self.losses, self.times = [], []

        def forward(self, ids):
            if self.head_loss is not None:
                return self.head_loss(ids, ids)
            return self.lm(input_ids=ids, labels=ids).loss

        def training_step(self, batch, batch_idx):
            return self(batch[0])  # the loss is kept by the callback: a list here would recompile each step

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return LM()


def run(args):
    import lightning.pytorch as pl
    from torch.profiler import ProfilerActivity, profile, record_function

    data = torch.utils.data.TensorDataset(torch.randint(1, 2048, (4 * args.steps, args.seq)))

    class Timing(pl.Callback):
        """Times each step and keeps its loss; the profiler records the last two steps, and the
        last one's peak above its start is the running sum of its allocations and frees (the
        step before it runs under the profiler too, so that the frees of what it left count, as
        :func:`remat.bench.measure.memory_events` does)."""

        def __init__(self, steps):
            self.steps, self.t0, self.prof, self.mark, self.peak = steps, 0.0, None, None, 0

        def on_train_batch_start(self, trainer, module, batch, i):
            if i == self.steps - 2:
                self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
                self.prof.__enter__()
            if i == self.steps - 1:
                self.mark = record_function("remat-measured-step")
                self.mark.__enter__()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            module.times.append(time.perf_counter() - self.t0)
            module.losses.append(float(outputs["loss"]))
            if i == self.steps - 1:
                self.mark.__exit__(None, None, None)
                self.prof.__exit__(None, None, None)
                events = self.prof.profiler.kineto_results.events()
                mark = next(e for e in events if e.name() == "remat-measured-step")
                live = 0
                for e in sorted((e for e in events if e.name() == "[memory]"
                                 and mark.start_ns() <= e.start_ns() <= mark.end_ns()), key=lambda e: e.start_ns()):
                    live += int(e.nbytes())
                    self.peak = max(self.peak, live)

    def fit(name, wrap, chunks=0):
        module = _module(pl, args.seq, chunks)
        plans: list = []
        timing = Timing(args.steps)
        trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[timing])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(wrap(module, plans), torch.utils.data.DataLoader(data, batch_size=4))
        return {"method": name, "peak_MiB": timing.peak / 2**20, "step_s": module.times[-1],
                "first_step_s": module.times[0], "losses": module.losses, "plans": len(plans)}

    def hf_ckpt(m, plans):
        enable_transformers_checkpointing(m.lm, use_reentrant=False)
        return m

    rows = [fit("plain", lambda m, plans: m),
            fit("transformers' checkpointing", hf_ckpt),
            fit("transformers' checkpointing + chunked head and loss", hf_ckpt, chunks=8),
            fit("remat.compile 0.5", lambda m, plans: remat.compile(m, budget=0.5, compiler="eager",
                                                                   on_plan=lambda g, p: plans.append(p))),
            fit("remat.compile min", lambda m, plans: remat.compile(m, budget="min", compiler="eager",
                                                                   on_plan=lambda g, p: plans.append(p))),
            fit("remat.checkpoint 0.5", lambda m, plans: remat.checkpoint(m, budget=0.5))]
    plain = rows[0]
    for r in rows:
        r["of_plain"] = r["peak_MiB"] / plain["peak_MiB"]
        r["loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], plain["losses"]))
    print(harness.markdown_table(rows, COLUMNS))
    return rows


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
