"""``remat fit``: the largest batch (or sequence) a model's training step fits on a GPU, per
method, with the predicted peak and step time (:func:`remat.fit.fit`).

    remat fit gpt2 --gpu H100                         # the zoo's GPT-2 small, AdamW, bf16
    remat fit config.json --gpu A100-40GB --sequence --batch 4
    remat fit mypkg.models:build --gpu H100 --gpus 8 --optimizer sgd
    remat fit --checkmate VGG19                        # Checkmate's experiment, a 16 GB V100
"""

from __future__ import annotations

import sys

from . import checks

# importing this module costs no torch: the command line builds its parser from it


def add_parser(sub) -> None:
    """``remat fit``'s arguments, on the command line's subparsers ``sub``."""
    from ..fit.methods import CHECKMATE_METHODS, METHODS

    f = sub.add_parser("fit", help="the largest batch or sequence a model fits on a GPU, per method, "
                                   "with predicted peak and step time")
    f.add_argument("model", nargs="?", default=None,
                   help="a zoo entry (gpt2, bert, ...), a transformers config JSON, module:factory, or "
                        "checkmate:NAME")
    f.add_argument("--checkmate", default=None, metavar="NAME",
                   help="one of Checkmate's graphs (VGG19, VGG16, MobileNet, ResNet50, vgg_unet, ...): its "
                        "paper's maximum-batch experiment")
    f.add_argument("--gpu", default=None,
                   help="the GPU: H100, H200, A100-40GB, A100-80GB, L4, RTX4090, or a profile file from "
                        "`remat profile -o` (default H100; with --checkmate the artifact's 16 GB V100)")
    f.add_argument("--memory", default=None, help="the GPU's memory instead of the profile's (80GiB, 16e9)")
    f.add_argument("--reserve", default="0", help="memory to leave free (the CUDA context, fragmentation): 1GiB")
    f.add_argument("--optimizer", default="adamw", help="sgd, sgd-momentum, adam, adamw, adafactor (default adamw)")
    f.add_argument("--dtype", default="bf16", help="the training dtype: bf16, fp16, fp32 (default bf16)")
    f.add_argument("--no-master-weights", action="store_true",
                   help="no fp32 master weights under bf16/fp16 (pure half-precision training)")
    f.add_argument("--gpus", type=checks.positive_int, default=1, help="GPUs FSDP2 shards the model states over")
    f.add_argument("--sequence", action="store_true", help="search the sequence length (at --batch) instead of the batch")
    f.add_argument("--batch", type=checks.positive_int, default=None, help="with --sequence: the batch (default 1)")
    f.add_argument("--seq-len", type=checks.positive_int, default=None,
                   help="searching the batch: the sequence length (default the model's, at most 1024)")
    f.add_argument("--size", default="full", choices=checks.SIZES, help="a zoo entry's size (default full)")
    f.add_argument("--methods", default=None,
                   help=f"comma-separated: {', '.join(METHODS)} (default all); with --checkmate: "
                        f"{', '.join(CHECKMATE_METHODS)} (default all but the slow MILP, checkmate)")
    f.add_argument("--time-limit", type=checks.seconds, default=60.0, help="seconds per solve (default 60)")
    f.add_argument("--max-size", type=checks.positive_int, default=None, help="the largest batch or sequence tried")
    f.add_argument("--real", action="store_true",
                   help="build the model and run its step for real here (default: on the meta device, "
                        "captured on fake tensors, nothing allocated)")
    f.add_argument("--json", action="store_true", help="print the result as JSON")
    f.add_argument("--plot", default=None, metavar="PNG", help="draw the largest size per method into PNG (matplotlib)")
    f.add_argument("--plain", action="store_true", help="a plain-text table even where rich is installed")
    f.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    f.set_defaults(module="fit")


def run(args) -> int:
    from ..errors import OptionError
    from ..fit.entry import fit
    from ..fit.report import plot, print_table, to_json

    if args.checkmate and args.model:
        raise OptionError("give a model or --checkmate NAME, not both")
    model = f"checkmate:{args.checkmate}" if args.checkmate else args.model
    if not model:
        raise OptionError("remat fit needs a model: a zoo entry, a transformers config JSON, "
                          "module:factory, or --checkmate NAME")
    gpu = args.gpu if args.gpu is not None or model.startswith("checkmate:") else "H100"
    if gpu is not None:  # a GPU remat does not know is an error before any capture
        from ..cost.profiles import resolve_profile

        resolve_profile(gpu)
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    result = fit(model, gpu, optimizer=args.optimizer, dtype=args.dtype,
                 master_weights=False if args.no_master_weights else None, gpus=args.gpus,
                 sequence=args.sequence, batch=args.batch, seq_len=args.seq_len, size=args.size,
                 methods=args.methods, memory=args.memory, reserve=args.reserve,
                 time_limit=args.time_limit, max_size=args.max_size, abstract=not args.real, log=log)
    if args.json:
        print(to_json(result))
    else:
        print_table(result, rich=not args.plain)
    if args.plot:
        plot(result, args.plot)
    return 0
