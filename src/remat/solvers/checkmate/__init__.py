"""Checkmate (seeds/001): the optimal MILP, its LP relaxation with two-phase rounding, and the
smallest feasible budget, on HiGHS."""

from .bounds import checkpoint_all, checkpoint_all_matrix, checkpoint_all_peak, memory_lower_bound
from .lp_rounding import checkmate_lp
from .milp import checkmate, min_budget

__all__ = ["checkmate", "checkmate_lp", "checkpoint_all", "checkpoint_all_matrix", "checkpoint_all_peak",
           "memory_lower_bound", "min_budget"]
