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
:class:`~remat.errors.OptionError` naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
from pathlib import Path

from ..errors import OptionError
from .model import DATASHEETS, DTYPES, DeviceProfile, datasheet_profile

PROFILE_FORMAT = "remat-device-profile"
PROFILE_VERSION = 1
"""The version of a profile file's layout; bumped when its fields change meaning."""

_DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
                "fp32": "fp32", "float32": "fp32", "float": "fp32"}
_ALIASES = {re.sub(r"[^a-z0-9]", "", gpu.lower()): gpu for gpu in DATASHEETS} | {"a100": "A100-80GB"}
_CURVES = ("matmul_curve", "conv_curve", "bandwidth_curve")
_OPTIONAL = ("op_seconds", "view_seconds", "memory")


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


def profile_record(profile: DeviceProfile) -> dict:
    """``profile``'s fields as plain JSON values (curves as lists of ``[x, rate]`` pairs)."""
    out = {}
    for f in dataclasses.fields(DeviceProfile):
        v = getattr(profile, f.name)
        if f.name in _CURVES:
            v = [[float(x), float(r)] for x, r in v]
        elif f.name == "memory":
            v = None if v is None else int(v)
        elif f.name != "name" and v is not None:
            v = float(v)
        out[f.name] = v
    return out


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


def _source(profile: DeviceProfile) -> tuple[str, str | None]:
    """("datasheet" | "measured", the device it describes)."""
    names = {datasheet_profile(gpu, d).name: gpu for gpu in DATASHEETS for d in DTYPES}
    if profile.name in names and profile == datasheet_profile(names[profile.name], profile.name.rsplit("-", 1)[1]):
        return "datasheet", DATASHEETS[names[profile.name]].label
    return "measured", profile.name.removesuffix(" (measured)")


def profile_entry(profile: DeviceProfile, *, device: str | None = None,
                  torch_version: str | None = None) -> dict:
    """The content of ``profile``'s profile file (:func:`save_profile` says the defaults)."""
    source, described = _source(profile)
    if torch_version is None and source == "measured":
        from importlib import metadata

        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "source": source,
            "device": device or described, "torch": torch_version, "profile": profile_record(profile)}


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
        raise _bad(path, f"it is not JSON ({type(e).__name__}: {e})") from None
    return profile_from_entry(entry, path)


def profile_from_entry(entry, path) -> DeviceProfile:
    """The profile of a profile file's parsed content (``path`` names it in errors)."""
    if not isinstance(entry, dict) or entry.get("format") != PROFILE_FORMAT:
        raise _bad(path, f'it is not a remat device profile (no "format": "{PROFILE_FORMAT}")')
    if entry.get("version") != PROFILE_VERSION:
        raise _bad(path, f"it has version {entry.get('version')!r}; this remat reads version {PROFILE_VERSION}")
    record = entry.get("profile")
    if not isinstance(record, dict):
        raise _bad(path, 'it has no "profile" object')
    fields = {f.name: f for f in dataclasses.fields(DeviceProfile)}
    unknown = sorted(set(record) - set(fields))
    if unknown:
        raise _bad(path, f"its profile has fields this remat does not know: {', '.join(unknown)}")
    kw = {}
    for name, f in fields.items():
        if name not in record:
            if f.default is dataclasses.MISSING:
                raise _bad(path, f"its profile has no {name!r}")
            continue
        kw[name] = _field(path, name, record[name])
    return DeviceProfile(**kw)


def _field(path, name: str, v):
    if name == "name":
        if not isinstance(v, str) or not v:
            raise _bad(path, "its profile's name is not a string")
        return v
    if name in _OPTIONAL and v is None:
        return None
    if name in _CURVES:
        if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
            raise _bad(path, f"its {name} is not a list of [size, rate] pairs")
        curve = tuple((_number(path, f"{name} size", x), _number(path, f"{name} rate", r)) for x, r in v)
        if any(b[0] <= a[0] for a, b in itertools.pairwise(curve)):
            raise _bad(path, f"its {name} is not in ascending order of size")
        return curve
    if name == "memory":
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise _bad(path, f"its memory is {v!r}, not a positive number of bytes")
        return v
    zero_ok = name in ("launch_seconds", "conv_workspace", "op_seconds", "view_seconds", "element_seconds")
    return _number(path, name, v, zero_ok)


def _number(path, what: str, v, zero_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v == 0 and not zero_ok:
        raise _bad(path, f"its {what} is {v!r}, not a {'non-negative' if zero_ok else 'positive'} number")
    return float(v)


def _bad(path, why: str) -> OptionError:
    return OptionError(f"remat cannot use the device profile {str(path)!r}: {why}. Write it again with "
                       "`remat profile -o FILE` on the device")


__all__ = ["PROFILE_FORMAT", "PROFILE_VERSION", "dtype_name", "known_names", "load_profile", "memory_bytes",
           "profile_key", "resolve_profile", "save_profile"]
