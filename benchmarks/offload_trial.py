"""User trial (issue 11): offloading on a model no test names, beside PyTorch's own.

An MLP encoder-decoder with four long skip connections (512 x 256), written for this trial.
PyTorch: ``torch._functorch.config.enable_activation_offloading = True`` under
``torch.compile``, counting the transfers its ``ao`` ops register. remat:
``remat.compile(model, solver="swap", budget=0.7)`` under inductor: the offloads its plan
makes, and the gradients' largest difference from eager autograd. Prints one line each.

    PYTHONPATH=src python benchmarks/offload_trial.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"

import torch  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from torch import nn  # noqa: E402

import remat  # noqa: E402


class Net(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.enc = nn.ModuleList([nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d)) for _ in range(4)])
        self.dec = nn.ModuleList([nn.Sequential(nn.Linear(2 * d, d), nn.SiLU()) for _ in range(4)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        skips = []
        for e in self.enc:
            x = e(x)
            skips.append(x)
        for d, s in zip(self.dec, reversed(skips)):
            x = d(torch.cat([x, s], -1))
        return self.head(x).logsumexp(-1).mean()


def main() -> None:
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
    functorch_config.enable_activation_offloading = True
    try:
        m = Net()
        m.load_state_dict(ref.state_dict())
        torch.compile(m)(x).backward()
    finally:
        functorch_config.enable_activation_offloading = False
        offload_ops._register_wait = register
    print(f"PyTorch's activation offloading: ran, {copies[0]} transfers registered")

    torch._dynamo.reset()
    m = Net()
    m.load_state_dict(ref.state_dict())
    plans = []
    remat.compile(m, solver="swap", budget=0.7, on_plan=lambda g, p: plans.append(p))(x).backward()
    err = max(float((p.grad - e).abs().max()) for p, e in zip(m.parameters(), eager))
    print(f"remat swap at 0.7: {sum(p.sim.offloads for p in plans)} offloads, "
          f"gradients within {err:.1e} of eager")


if __name__ == "__main__":
    main()
