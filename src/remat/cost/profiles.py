"""Device profiles a user can name, write and reuse: plan here for the GPU you will train on.

A *target* is what :func:`resolve_profile` turns into a :class:`~remat.cost.model.DeviceProfile`:

- a GPU by name, from its datasheet (:data:`remat.cost.model.DATASHEETS`): ``"H100"``,
  ``"H200"``, ``"A100-40GB"``, ``"A100-80GB"`` (``"A100"`` is the 80 GB part), ``"L4"``,
  ``"RTX4090"``; case, spaces, dashes and underscores do not matter, and a dtype may end the
  name (``"H100-bf16"``, ``"a100_fp32"``; bf16, fp16 or fp32, default bf16);
- ``"cpu"`` or ``"cuda"`` (``"cuda:1"``): this machine's device, measured
  (:func:`remat.cost.calibrate.profile_for`, once per device and torch version: the
  measurement is stored beside the plan cache, :mod:`remat.cost.probes`);
- a path to a profile file that :func:`save_profile` (or ``remat profile -o FILE``) wrote on
  the GPU itself: the measured numbers, carried to the machine that plans;
- a :class:`~remat.cost.model.DeviceProfile`, returned as it is.

>>> p = resolve_profile("H100")
>>> p.name, memory_bytes(p) // 2**30, memory_bytes("cpu")
('h100-bf16', 80, None)
>>> resolve_profile("h100-fp32").peak_flops < resolve_profile("H100", dtype="fp16").peak_flops
True

A profile file is JSON::

    {"format": "remat-device-profile", "version": 1, "source": "measured",
     "device": "NVIDIA H200", "torch": "2.11.0+cu130",
     "profile": {"name": "...", "peak_flops": ..., "bandwidth": ..., "matmul_curve": [[f, r], ...],
                 ..., "memory": 150754820096}}

``source`` is ``"measured"`` or ``"datasheet"``; ``device`` and ``torch`` say what it was
measured on (null for a datasheet's). A file remat cannot use is an
:class:`~remat.errors.OptionError` naming the file and what is wrong
(:mod:`remat.cost.profile_json` turns a profile into this JSON and back).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..errors import OptionError
from .model import DATASHEETS, DeviceProfile, datasheet_profile
from .profile_json import (
    PROFILE_FORMAT,
    PROFILE_VERSION,
    file_error,
    profile_entry,
    profile_from_entry,
    profile_record,
)

_DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
                "fp32": "fp32", "float32": "fp32", "float": "fp32"}
_ALIASES = {re.sub(r"[^a-z0-9]", "", gpu.lower()): gpu for gpu in DATASHEETS} | {"a100": "A100-80GB"}


def known_names() -> list[str]:
    """The GPU names :func:`resolve_profile` knows (a dtype may follow each: ``-bf16``,
    ``-fp16``, ``-fp32``), then ``cpu`` and ``cuda``."""
    return [*DATASHEETS, "A100", "cpu", "cuda"]


def dtype_name(dtype) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` for a dtype given as one of those, a torch-style name
    (``"bfloat16"``, ``"float32"``, ``"half"``) or a ``torch.dtype``."""
    text = str(dtype).lower().removeprefix("torch.")
    if text not in _DTYPE_NAMES:
        raise OptionError(f"remat knows the training dtypes bf16, fp16 and fp32, not {dtype!r}")
    return _DTYPE_NAMES[text]


def _split_dtype(name: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"(.*?)[-_ ]?(bf16|bfloat16|fp16|float16|fp32|float32)", name.strip().lower())
    return (m.group(1), _DTYPE_NAMES[m.group(2)]) if m and m.group(1) else (name, None)


def resolve_profile(target, dtype=None) -> DeviceProfile:
    """The :class:`~remat.cost.model.DeviceProfile` ``target`` names (the module's docstring
    lists the forms). ``dtype`` (bf16, fp16, fp32; a ``torch.dtype`` too) chooses a named GPU's
    rate where the name carries none (default bf16), and the dtype a ``"cpu"`` / ``"cuda"``
    measurement times its matmuls in (default float32, as remat's eager path measures); a
    profile file or object carries its own and takes no ``dtype``.

    >>> resolve_profile("A100").memory == resolve_profile("a100-80gb").memory == 80 * 2**30
    True
    >>> resolve_profile("H200", dtype="fp16").name
    'h200-fp16'
    """
    if isinstance(target, DeviceProfile):
        _no_dtype(target.name, dtype)
        return target
    if isinstance(target, os.PathLike):
        _no_dtype(str(target), dtype)
        return load_profile(target)
    if not isinstance(target, str):
        raise OptionError(f"a device target is a GPU name, 'cpu', 'cuda', a profile file or a DeviceProfile, "
                          f"not {type(target).__name__} {target!r}")
    text = target.strip()
    low = text.lower()
    if low == "cpu" or low == "cuda" or re.fullmatch(r"cuda:\d+", low):
        from .calibrate import profile_for

        return profile_for(low, dtype=None if dtype is None else dtype_name(dtype))
    base, named = _split_dtype(text)
    gpu = _ALIASES.get(re.sub(r"[^a-z0-9]", "", base.lower()))
    if gpu is None and _looks_like_path(text):  # a name wins over a file of the same name
        _no_dtype(text, dtype)
        return load_profile(text)
    if gpu is None:
        raise OptionError(f"remat does not know the device {target!r}; name one of "
                          f"{', '.join(known_names())} (a dtype may follow a GPU's name: H100-bf16, "
                          "A100-40GB-fp32), or give a profile file that `remat profile -o FILE` wrote "
                          "on that GPU")
    asked = None if dtype is None else dtype_name(dtype)
    if named and asked and named != asked:
        raise OptionError(f"the device {target!r} names the dtype {named}, and dtype={dtype!r} another: "
                          "give one of them")
    return datasheet_profile(gpu, named or asked or "bf16")


def _looks_like_path(text: str) -> bool:
    return text.endswith(".json") or os.sep in text or "/" in text or os.path.isfile(text)


def _no_dtype(what: str, dtype) -> None:
    if dtype is not None:
        raise OptionError(f"{what} carries its own numbers; dtype={dtype!r} applies to a GPU's name "
                          "or to 'cpu' / 'cuda' only")


def memory_bytes(profile_or_name) -> int | None:
    """Bytes of memory of the device a profile (or anything :func:`resolve_profile` reads)
    describes; None for a CPU profile or one that does not record it. A name is not measured:
    ``"cuda"`` reads the memory of this machine's GPU from torch.

    >>> memory_bytes("L4") == memory_bytes("RTX4090") == 24 * 2**30
    True
    """
    if isinstance(profile_or_name, str) and profile_or_name.strip().lower() == "cpu":
        return None
    if isinstance(profile_or_name, str) and re.fullmatch(r"cuda(:\d+)?", profile_or_name.strip().lower()):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(profile_or_name.strip().lower())).total_memory)
    return resolve_profile(profile_or_name).memory


def profile_key(profile: DeviceProfile) -> str:
    """A short stable hash (16 hex digits) of ``profile``'s numbers, not its name: two profiles
    that price every op alike share a key (an H100's bf16 and fp16), any number that differs
    gives another. The plan cache keys on it.

    >>> profile_key(resolve_profile("H100-bf16")) == profile_key(resolve_profile("H100-fp16"))
    True
    >>> profile_key(resolve_profile("H100")) == profile_key(resolve_profile("H200"))
    False
    """
    record = profile_record(profile)
    record.pop("name")
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_profile(profile: DeviceProfile, path, *, device: str | None = None,
                 torch_version: str | None = None) -> Path:
    """Write ``profile`` as a profile file at ``path`` (JSON, the module's docstring says its
    layout), with the device it was measured on (default: the profile's name) and the torch
    version (default: the installed one; none for a datasheet's profile). Returns the path.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "h100.json")
    >>> load_profile(save_profile(resolve_profile("H100"), path)) == resolve_profile("H100")
    True
    """
    entry = profile_entry(profile, device=device, torch_version=torch_version)
    path = Path(path)
    try:
        text = json.dumps(entry, indent=1, allow_nan=False)
    except ValueError as e:
        raise OptionError(f"the profile {profile.name!r} has a number JSON cannot hold ({e})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def load_profile(path) -> DeviceProfile:
    """The :class:`~remat.cost.model.DeviceProfile` a profile file at ``path`` holds; an
    :class:`~remat.errors.OptionError` naming the file and what is wrong when it cannot be
    used (missing, not JSON, another format or version, a field missing or not a positive
    number, a curve out of order)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise OptionError(f"there is no profile file {str(path)!r}; write one with `remat profile -o "
                          f"{path.name}` on the device, or name a GPU ({', '.join(known_names())})") from None
    except OSError as e:
        raise OptionError(f"the profile file {str(path)!r} cannot be read ({e})") from None
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise file_error(path, f"it is not JSON ({type(e).__name__}: {e})") from None
    return profile_from_entry(entry, path)


__all__ = ["PROFILE_FORMAT", "PROFILE_VERSION", "dtype_name", "known_names", "load_profile", "memory_bytes",
           "profile_key", "resolve_profile", "save_profile"]
