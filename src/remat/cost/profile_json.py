"""A :class:`~remat.cost.model.DeviceProfile` as the JSON of a profile file, and back (checked):
the content :func:`remat.cost.profiles.save_profile` writes and the device measurements stored
beside the plan cache hold (:mod:`remat.cost.probes`). The layout is in
:mod:`remat.cost.profiles`' docstring."""

from __future__ import annotations

import dataclasses
import itertools
import math

from ..errors import OptionError
from .model import DATASHEETS, DTYPES, DeviceProfile, datasheet_profile

PROFILE_FORMAT = "remat-device-profile"
PROFILE_VERSION = 1
"""The version of a profile file's layout; bumped when its fields change meaning."""

_CURVES = ("matmul_curve", "conv_curve", "bandwidth_curve")
_OPTIONAL = ("op_seconds", "view_seconds", "memory")


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


def _source(profile: DeviceProfile) -> tuple[str, str | None]:
    """("datasheet" | "measured", the device it describes)."""
    names = {datasheet_profile(gpu, d).name: gpu for gpu in DATASHEETS for d in DTYPES}
    if profile.name in names and profile == datasheet_profile(names[profile.name], profile.name.rsplit("-", 1)[1]):
        return "datasheet", DATASHEETS[names[profile.name]].label
    return "measured", profile.name.removesuffix(" (measured)")


def profile_entry(profile: DeviceProfile, *, device: str | None = None,
                  torch_version: str | None = None) -> dict:
    """The content of ``profile``'s profile file (:func:`remat.cost.profiles.save_profile` says the defaults)."""
    source, described = _source(profile)
    if torch_version is None and source == "measured":
        from importlib import metadata

        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
    return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "source": source,
            "device": device or described, "torch": torch_version, "profile": profile_record(profile)}


def profile_from_entry(entry, path) -> DeviceProfile:
    """The profile of a profile file's parsed content (``path`` names it in errors)."""
    if not isinstance(entry, dict) or entry.get("format") != PROFILE_FORMAT:
        raise file_error(path, f'it is not a remat device profile (no "format": "{PROFILE_FORMAT}")')
    if entry.get("version") != PROFILE_VERSION:
        raise file_error(path, f"it has version {entry.get('version')!r}; this remat reads version {PROFILE_VERSION}")
    record = entry.get("profile")
    if not isinstance(record, dict):
        raise file_error(path, 'it has no "profile" object')
    fields = {f.name: f for f in dataclasses.fields(DeviceProfile)}
    unknown = sorted(set(record) - set(fields))
    if unknown:
        raise file_error(path, f"its profile has fields this remat does not know: {', '.join(unknown)}")
    kw = {}
    for name, f in fields.items():
        if name not in record:
            if f.default is dataclasses.MISSING:
                raise file_error(path, f"its profile has no {name!r}")
            continue
        kw[name] = _field(path, name, record[name])
    return DeviceProfile(**kw)


def _field(path, name: str, v):
    if name == "name":
        if not isinstance(v, str) or not v:
            raise file_error(path, "its profile's name is not a string")
        return v
    if name in _OPTIONAL and v is None:
        return None
    if name in _CURVES:
        if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 for p in v):
            raise file_error(path, f"its {name} is not a list of [size, rate] pairs")
        curve = tuple((_number(path, f"{name} size", x), _number(path, f"{name} rate", r)) for x, r in v)
        if any(b[0] <= a[0] for a, b in itertools.pairwise(curve)):
            raise file_error(path, f"its {name} is not in ascending order of size")
        return curve
    if name == "memory":
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise file_error(path, f"its memory is {v!r}, not a positive number of bytes")
        return v
    zero_ok = name in ("launch_seconds", "conv_workspace", "op_seconds", "view_seconds", "element_seconds")
    return _number(path, name, v, zero_ok)


def _number(path, what: str, v, zero_ok: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v == 0 and not zero_ok:
        raise file_error(path, f"its {what} is {v!r}, not a {'non-negative' if zero_ok else 'positive'} number")
    return float(v)


def file_error(path, why: str) -> OptionError:
    return OptionError(f"remat cannot use the device profile {str(path)!r}: {why}. Write it again with "
                       "`remat profile -o FILE` on the device")


__all__ = ["PROFILE_FORMAT", "PROFILE_VERSION", "file_error", "profile_entry", "profile_from_entry", "profile_record"]
