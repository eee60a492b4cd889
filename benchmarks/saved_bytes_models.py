"""Saved activation bytes and the seeds' cut cost: remat vs PyTorch's partitioner on small models,
with the max gradient difference to eager autograd (no-codegen compiler; CPU).

    PYTHONPATH=src python benchmarks/saved_bytes_models.py
"""
import torch, remat, time, sys
from remat.zoo.cnn import ConvBN
from remat.zoo.mlp import MLP
from remat.zoo.patterns import TransformerBlock
from remat.zoo.transformers_models import GPT2Loss, gpt2_tiny
torch.manual_seed(0)
def cases():
    yield "mlp", MLP(), (torch.randn(16, 32),)
    yield "cnn", ConvBN(), (torch.randn(4, 3, 16, 16),)
    yield "transformer", TransformerBlock(), (torch.randn(2, 8, 32),)
    yield "gpt2", GPT2Loss(gpt2_tiny()), (torch.randint(0, 256, (2, 16)),)
compiler = sys.argv[1] if len(sys.argv) > 1 else "eager"
for name, m, inp in cases():
    import copy
    for mode in ["conservative", "aggressive"]:
        ref = copy.deepcopy(m); test = copy.deepcopy(m)
        out = ref(*inp); (out.float().pow(2).sum() if out.dim() else out).backward()
        plans = []
        t = time.time()
        c = remat.compile(test, solver=f"mincut-{mode}", compiler=compiler, strict=True, on_plan=lambda g, p: plans.append(p))
        out2 = c(*inp); (out2.float().pow(2).sum() if out2.dim() else out2).backward()
        err = max((a.grad - b.grad).abs().max().item() for a, b in zip(ref.parameters(), test.parameters()) if a.grad is not None)
        tp = remat.plan(copy.deepcopy(m), *inp, solver="torch-mincut")
        print(f"{name:12s} {mode:12s} maxerr={err:.2e} saved={plans[0].saved_activation_bytes} torch={tp.saved_activation_bytes} nsaved={len(plans[0].saved)} cost={plans[0].cost} torchcost={tp.cost} t={time.time()-t:.1f}s")
