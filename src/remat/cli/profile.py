"""``remat profile``: measure this machine's device into a profile file, or show a named one.

On the GPU you will train on, ``remat profile -o h100.json`` measures it (matmul and
convolution rates at several sizes, bandwidth, the fixed cost of a kernel, its memory) and
writes the file; anywhere else, ``remat plan GRAPH --profile h100.json`` (or ``remat.plan(..., profile="h100.json")``) plans for it.
``remat profile --gpu H100`` prints (or with ``-o`` writes) a GPU's datasheet profile;
``--gpu FILE`` shows a file's. A measurement is stored for the next process
(:mod:`remat.cost.probes`); ``--remeasure`` measures again.
"""

from __future__ import annotations

import json

from ..cost.profiles import memory_bytes, profile_key, resolve_profile, save_profile


def run(args) -> int:
    described = None
    if args.gpu is not None:
        profile = resolve_profile(args.gpu, dtype=args.dtype)
        what = f"the profile of {args.gpu}"
    else:
        device = args.device or _default_device()
        if args.remeasure:
            forget(device, args.dtype)
        profile = resolve_profile(device, dtype=args.dtype)
        what = f"{device}, measured"
        described = _described(device, args.dtype)
    if args.out is not None:
        path = save_profile(profile, args.out, device=described)
        print(f"wrote {what} to {path} (key {profile_key(profile)})")
        if args.json:
            print(path.read_text(), end="")
        return 0
    if args.json:
        from ..cost.profile_json import profile_record

        print(json.dumps(profile_record(profile), indent=1))
        return 0
    print(describe(profile))
    return 0


def forget(device: str, dtype: str | None) -> None:
    """Delete the measurement of ``device`` stored for this process's settings (the next
    :func:`~remat.cost.profiles.resolve_profile` measures it again and stores the new one)."""
    from ..cost import calibrate, probes

    path = probes.probe_path("profile", calibrate.identity(device, dtype))
    if path is not None:
        path.unlink(missing_ok=True)
    calibrate.cpu_profile.cache_clear()  # and this process's copy
    calibrate.cuda_profile.cache_clear()


def _described(device: str, dtype: str | None) -> str:
    """The device a measurement was made on, as a profile file records it: a GPU's name, or a
    CPU's model and torch's threads."""
    from ..cost.calibrate import identity

    ident = identity(device, dtype)
    return ident["device"] if ident["device"] != "cpu" else f"cpu: {ident['cpu']}, {ident['threads']} threads"


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def describe(profile) -> str:
    """The profile's numbers as a few lines a reader can check against a datasheet."""
    memory = memory_bytes(profile)
    lines = [f"{profile.name}  (key {profile_key(profile)})",
             f"  matmul peak   {profile.peak_flops / 1e12:.3g} TFLOP/s",
             f"  bandwidth     {profile.bandwidth / 1e9:.4g} GB/s",
             f"  memory        {'-' if memory is None else f'{memory / 2**30:.4g} GiB'}",
             f"  kernel        {profile.launch_seconds * 1e6:.3g} us fixed (op by op {profile.op_fixed * 1e6:.3g} us)"]
    if profile.matmul_curve:
        shares = ", ".join(f"{f:.2g}: {r / profile.peak_flops:.0%}" for f, r in profile.matmul_curve)
        lines.append(f"  matmul curve  FLOPs of one call: share of the peak  {shares}")
    return "\n".join(lines)


__all__ = ["describe", "forget", "run"]
