"""One offloading step through PyTorch's real ``ao`` copy ops on the CPU, in a process of its
own (``remat.bench.ao_standin.install`` is process-wide, and a freed buffer reused by a
compiled kernel crashes the process).

Launched by ``tests/test_ao_inductor.py``::

    python tests/ao_worker.py CASE BUDGET COMPILER [--hide-ao | --no-async] [--strict] [--solver=NAME]

CASE is ``mlp``, ``cnn-batchnorm`` or ``unet`` (zoo ``tiny`` sizes; ConvBN from
``remat.zoo.cnn``), BUDGET a fraction or ``min``. The step is ``remat.compile(model,
solver=NAME, budget=BUDGET, compiler=COMPILER, strict=...)`` (``swap`` by default) against eager autograd from
the same weights. ``--hide-ao`` makes this torch's ``ao`` ops look absent
(``remat.lower.offload.ao_problem`` reports them missing), as on torch 2.10-2.12, so remat's
own copy ops lower the offloads; ``--no-async`` hides remat's too
(``remat.lower.offload.async_ops`` finds none), as on a device neither runs on. Prints one
JSON line: the losses, the largest gradient difference, the offloads and reloads of each
plan (all and inside the forward), the waits never consumed, the warnings, or the error.
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def main(argv: list[str]) -> None:
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # a cache hit plans nothing
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    import torch

    from remat.bench import ao_standin

    ao_standin.install()
    if "--hide-ao" in argv or "--no-async" in argv:
        from remat.lower import offload as lowering
        lowering.ao_problem = lambda ns=None: f"torch {torch.__version__} has no torch.ops.ao.offload (hidden)"
        if "--no-async" in argv:
            lowering.async_ops = lambda device_type: None
    import remat
    from remat import zoo
    from remat.zoo.cnn import ConvBN

    case, budget, compiler = argv[0], argv[1], argv[2]
    budget = budget if budget == "min" else float(budget)
    torch.manual_seed(0)
    if case == "cnn-batchnorm":
        model, inputs = ConvBN(), (torch.randn(4, 3, 16, 16),)
        loss_fn = lambda out: out.float().pow(2).mean()  # noqa: E731
    else:
        c = zoo.build(case, "tiny")
        model, inputs, loss_fn = c.model, c.inputs, c.loss

    def run(fn):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(fn(*inputs))
        loss.backward()
        return float(loss.detach()), [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    want_loss, want = run(model)
    plans = []
    out: dict = {"case": case}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            solver = next((a.split("=", 1)[1] for a in argv if a.startswith("--solver=")), "swap")
            step = remat.compile(model, solver=solver, budget=budget, compiler=compiler, cache=False,
                                 strict="--strict" in argv, on_plan=lambda g, p: plans.append(p))
            got_loss, got = run(step)
            out.update(loss=got_loss, want_loss=want_loss, grads=len(got),
                       max_err=max(float((a - b).abs().max()) for a, b in zip(got, want)))
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = f"{type(e).__name__}: {e}"
    out["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught
                       if w.category.__module__.startswith("remat")]
    out["pending"] = ao_standin.pending()
    out["plans"] = []
    for p in plans:
        st = p.schedule().statements
        g = p.graph
        first_bw = next((k for k, s in enumerate(st) if s.op == "compute" and g[s.node].role in ("tangent", "backward")),
                        len(st))
        out["plans"].append({"solver": p.solver, "offloads": sum(s.op == "offload" for s in st),
                             "forward_reloads": sum(s.op == "reload" for s in st[:first_bw])})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
