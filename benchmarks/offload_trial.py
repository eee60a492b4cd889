"""User trial (issue 11): offloading on a model no test names, beside PyTorch's own.

An MLP encoder-decoder with four long skip connections (512 x 256), written for this trial.
PyTorch: ``remat.compile(model, solver="torch-offload")``, PyTorch's min cut with
``enable_activation_offloading`` on and every saved activation marked ``should_offload`` inside
the partitioner (left alone, torch marks nothing and copies nothing); its row reports the
transfers its forward makes (``plan.transfers``) and the copies its ops registered.
remat: ``remat.compile(model, solver="swap", budget=0.7)``: the offloads its plan makes. Both
under ``--compiler`` (default inductor), with the gradients' largest difference from eager
autograd. Prints one line each; rows: ``benchmarks/results/offload_trial.json``.

On a CPU PyTorch's offloading copies with ``prims.device_put`` (synchronous); ``--ao`` installs
:mod:`remat.bench.ao_standin` so its ``ao`` ops run (stream parts stubbed; process-wide). Under
inductor PyTorch's ``ao`` path frees the device buffer at its offload's wait (``keepalive``)
while inductor may reuse it: run ``--ao`` with ``--compiler eager`` unless checking that.

    python benchmarks/offload_trial.py [--compiler eager] [--ao]
"""

from __future__ import annotations

import sys
import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402

import remat  # noqa: E402
from remat.zoo.trials import SkipMLP as Net  # noqa: E402
from remat.bench import harness  # noqa: E402


def _err(m: torch.nn.Module, eager: list[torch.Tensor]) -> float:
    return max(float((p.grad - e).abs().max()) for p, e in zip(m.parameters(), eager))


def arguments(ap) -> None:
    ap.add_argument("--compiler", default="inductor", choices=["inductor", "eager"])
    ap.add_argument("--ao", action="store_true", help="PyTorch's ao ops with CPU stand-ins")


def run(args):
    if args.ao:
        from remat.bench import ao_standin
        ao_standin.install()
    torch.manual_seed(0)
    x = torch.randn(512, 256)
    ref = Net()
    ref(x).backward()
    eager = [p.grad.clone() for p in ref.parameters()]

    from torch._functorch._activation_offloading import offload_ops
    copies, register = [0], offload_ops._register_wait

    def counted(*a):
        copies[0] += 1
        return register(*a)
    offload_ops._register_wait = counted
    m = Net()
    m.load_state_dict(ref.state_dict())
    plans = []
    try:
        remat.compile(m, solver="torch-offload", compiler=args.compiler,
                      on_plan=lambda g, p: plans.append(p))(x).backward()
    finally:
        offload_ops._register_wait = register
    print(f"PyTorch's activation offloading (torch-offload): "
          f"{sum(p.details.get('transfers', 0) for p in plans)} transfers in its forward, "
          f"{copies[0]} ao copies registered, gradients within {_err(m, eager):.1e} of eager")
    rows = [{"method": "torch-offload", "transfers": sum(p.details.get("transfers", 0) for p in plans),
             "ao_copies": copies[0], "grad_err": _err(m, eager)}]

    torch._dynamo.reset()
    m = Net()
    m.load_state_dict(ref.state_dict())
    plans = []
    remat.compile(m, solver="swap", budget=0.7, compiler=args.compiler,
                  on_plan=lambda g, p: plans.append(p))(x).backward()
    print(f"remat swap at 0.7: {sum(p.sim.offloads for p in plans)} offloads, "
          f"gradients within {_err(m, eager):.1e} of eager")
    rows.append({"method": "remat swap 0.7", "offloads": sum(p.sim.offloads for p in plans),
                 "grad_err": _err(m, eager)})
    return harness.Result(rows, {"compiler": args.compiler, "ao": args.ao}, printed=True)


def main(argv=None) -> int:
    return harness.main(__file__, run, arguments, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
