"""The cost model: what each op costs to compute, to move through memory and to hold (no torch;
:mod:`.calibrate` imports torch when it measures a device)."""

from .model import PROFILES, CostModel, DeviceProfile, default_cost_model

__all__ = ["PROFILES", "CostModel", "DeviceProfile", "default_cost_model"]
