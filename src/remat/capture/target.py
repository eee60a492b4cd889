"""The device a plan is made for, where it is not the one that captured the step.

``remat.plan(model, ..., device="H100")`` captures the step here (on meta or fake tensors:
:mod:`remat.capture.abstract`) and plans it for that GPU: the captured graph's
``meta["device"]`` names the target (``{"type": "cuda", "name": "H100", "dtype": "bfloat16",
"profile": {...}, "target": True}``), so that the cost model prices it with the target's
profile (its time), the simulator follows the target's memory rules, and the plan cache keys
on it. The profile is resolved by :func:`remat.cost.profiles.resolve_profile` (a
:class:`~remat.cost.model.DeviceProfile`, a GPU name such as ``"H100"``, ``"H100-bf16"`` or
``"A100-40GB"``, or a JSON file ``remat profile`` wrote).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cost.model import PROFILES, DeviceProfile, datasheet_gpu
from ..cost.profiles import memory_bytes, profile_key, profile_record, resolve_profile
from ..errors import OptionError


@dataclass(frozen=True)
class Target:
    """``device``: ``"cpu"``, ``"cuda"`` (``"cuda:N"``) or a GPU's name (``"H100"``);
    ``profile``: a :class:`DeviceProfile`, a GPU profile's name or a profile JSON's path (the
    device's numbers; without it, the named GPU's or the device's default)."""

    device: str | None = None
    profile: Any = None

    @classmethod
    def create(cls, device: Any = None, profile: Any = None) -> Target | None:
        """A checked target, or None where neither is given."""
        if device is None and profile is None:
            return None
        if device is not None and not isinstance(device, str):
            device = str(device) if type(device).__name__ == "device" else device  # a torch.device
        if device is not None and (not isinstance(device, str) or not device.strip()):
            raise OptionError(f"device must be 'cpu', 'cuda' or a GPU's name such as 'H100', not {device!r}")
        if profile is not None and not isinstance(profile, (DeviceProfile, str, Path)):
            raise OptionError(f"profile must be a DeviceProfile, a GPU profile's name ('H100-bf16') or the "
                              f"path of a profile JSON written by `remat profile`, not {type(profile).__name__}")
        target = cls(device.strip() if isinstance(device, str) else None,
                     str(profile) if isinstance(profile, Path) else profile)
        target.resolve(None)  # a name or file remat does not know fails now, not after the capture
        return target

    @property
    def kind(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        if self.device is not None and self.device.lower().split(":")[0] == "cpu":
            return "cpu"
        if self.device is None and isinstance(self.profile, DeviceProfile) and self.profile.name == "cpu":
            return "cpu"
        return "cuda"

    @property
    def gpu(self) -> str:
        """The GPU's name as given (the device's or the profile's); for a bare ``"cuda"``, this
        machine's GPU where it has one, else ``""``."""
        if self.device is not None and self.device.lower().split(":")[0] not in ("cpu", "cuda"):
            return self.device
        if isinstance(self.profile, DeviceProfile):
            return self.profile.name
        if isinstance(self.profile, str) and not _is_file(self.profile):
            return self.profile
        torch = sys.modules.get("torch")  # imported by whoever captures; `remat plan` needs none
        if self.device is not None and torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_name(self.device if ":" in self.device else None)
        return ""

    def resolve(self, dtype: str | None) -> DeviceProfile:
        """The profile the plan prices with, for a step in ``dtype`` (``"bfloat16"``, ...): the
        ``profile`` given (a file or object carries its own dtype), else the named GPU's in
        ``dtype``; remat's default CPU profile for ``"cpu"`` (the one a CPU capture is priced
        with), an A100's for a bare ``"cuda"``."""
        if self.profile is not None:
            named = isinstance(self.profile, str) and not _is_file(self.profile)
            return resolve_profile(self.profile, dtype=_dtype(dtype) if named else None)
        if self.kind == "cpu":
            return PROFILES["cpu"]
        name = self.gpu or "A100"
        try:
            return resolve_profile(name, dtype=_dtype(dtype))
        except OptionError as e:
            first = e
        try:
            return resolve_profile(name)  # a name with a dtype of its own ("H100-fp32") wins
        except OptionError:
            known = datasheet_gpu(name)  # a CUDA device's own name ("NVIDIA H100 80GB HBM3")
            if known is None:
                raise first from None
            return resolve_profile(known, dtype=_dtype(dtype))

    def device_meta(self, captured: dict) -> dict:
        """``graph.meta["device"]`` for a graph captured with device record ``captured``: the
        target's, with the captured step's dtype."""
        dtype = captured.get("dtype")
        profile = self.resolve(dtype)
        out: dict = {"type": self.kind}
        if self.kind == "cuda":
            out["name"] = self.gpu or "an unnamed GPU (priced as an A100)"
        if dtype is not None:
            out["dtype"] = dtype
        out["profile"] = profile_record(profile)
        memory = memory_bytes(profile)
        if memory is not None:
            out["memory_bytes"] = int(memory)
        out["target"] = True
        return out

    def key(self) -> str:
        """What decides the plans, for compile caches: the device and its profile's numbers."""
        return f"{self.kind}|{self.gpu}|{profile_key(self.resolve(None)) if self.profile is not None else None}"


def _is_file(text: str) -> bool:
    return text.endswith(".json") or "/" in text or Path(text).is_file()


def _dtype(dtype: str | None) -> str | None:
    """A captured dtype as a GPU profile's (bf16, fp16, fp32); None for one none is made for."""
    return dtype if dtype in ("bfloat16", "float16", "float32") else None
