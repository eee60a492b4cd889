"""User trial (issue 28): offloading on a transformers Qwen2 no test names, beside PyTorch's knob.

Qwen2 2 x 64 (4 heads, 2 KV heads), vocabulary 512, batch 4 x 128, CPU, inductor, one thread,
PyTorch's real ao ops on CPU stand-ins (remat.bench.ao_standin); one process per variant, so a
crash is a row. Prints one JSON line per variant: gradients' largest difference from eager,
median step, peak above the step's start (profiler), offloads, copies left waiting, warnings;
the rows go to ``benchmarks/results/offload_user_trial.json``.

    python benchmarks/offload_user_trial.py [--variants auto-0.4,swap-0.7]
"""
import json, os, subprocess, sys, time, warnings
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
os.environ["REMAT_CACHE_DIR"] = "off"
from remat.bench import harness  # noqa: E402
VARIANTS = {"no-recompute": dict(solver="no-recompute"), "torch-knob-0.4": dict(solver="torch-mincut", knob=0.4),
            "torch-offload": dict(solver="torch-offload"), "auto-0.4": dict(solver="auto", budget=0.4),
            "swap-0.7": dict(solver="swap", budget=0.7), "swap-recompute-0.4": dict(solver="swap-recompute", budget=0.4),
            "auto-0.8": dict(solver="auto", budget=0.8),
            "swap-min": dict(solver="swap", budget="min"), "swap-recompute-0.8": dict(solver="swap-recompute", budget=0.8),
            "auto-min": dict(solver="auto", budget="min")}
def one(name):
    import torch
    torch.set_num_threads(1)
    from remat.bench import ao_standin
    ao_standin.install()
    import remat, transformers
    from remat.bench.measure import peak_memory
    cfg = transformers.Qwen2Config(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg); model.loss_type = "ForCausalLM"
    ids = torch.randint(0, 512, (4, 128))
    def run(fn):
        model.zero_grad(set_to_none=True)
        fn(input_ids=ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]
    want = run(model)
    v = dict(VARIANTS[name]); knob = v.pop("knob", None)
    if knob is not None:
        torch._functorch.config.activation_memory_budget = knob
    plans = []
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = remat.compile(model, strict=v.get("solver") not in ("no-recompute", "torch-mincut", "torch-offload"),
                             on_plan=lambda g, p: plans.append(p), time_limit=10, **v)
        got = run(step)
    first = time.perf_counter() - t0
    err = max(float((a - b).abs().max()) for a, b in zip(got, want))
    ts = []
    for _ in range(5):
        t = time.perf_counter(); run(step); ts.append(time.perf_counter() - t)
    held = list(model.parameters())
    peak = peak_memory(lambda: run(step), "cpu", held=held).peak_bytes
    offl = sum(sum(s.op == "offload" for s in p.schedule().statements) for p in plans if p.statements is not None)
    transfers = sum(p.details.get("transfers", 0) for p in plans)
    print(json.dumps({"variant": name, "first_s": round(first, 1), "grad_err": err, "step_ms": round(sorted(ts)[2] * 1e3, 1),
                      "peak_MiB": round(peak / 2**20, 2), "pred_MiB": round(sum(p.peak_bytes or 0 for p in plans) / 2**20, 2),
                      "offloads": offl, "transfers": transfers, "pending": ao_standin.pending(),
                      "warnings": [str(w.message)[:120] for w in caught if w.category.__module__.startswith("remat")]}))
def arguments(ap):
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of " + ",".join(VARIANTS))
    ap.add_argument("--child", default=None, help="run this one variant here and print its JSON line")
def run(args):
    if args.child:
        one(args.child)
        return 0
    rows = []
    for name in args.variants.split(","):
        r = subprocess.run([sys.executable, __file__, "--child", name, "--no-results"], capture_output=True, text=True,
                           timeout=300)
        line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else \
            json.dumps({"variant": name, "crashed": r.returncode, "err": r.stderr.strip().splitlines()[-1:] })
        print(line, flush=True)
        rows.append(json.loads(line))
    return harness.Result(rows, printed=True)
def main(argv=None):
    return harness.main(__file__, run, arguments, argv, doc=__doc__)
if __name__ == "__main__":
    sys.exit(main())
