"""Solvers: functions from a :class:`~remat.graph.Graph` (+ options) to a :class:`~remat.plans.Plan`.

Every solver lives in one registry (:mod:`.registry`) with its name, its family and whether it
takes a budget, and is called the same way: :func:`solve`. Solvers never import torch; the
PyTorch partitioners listed here run on captured fx graphs (:mod:`remat.lower`).

>>> from remat.graph.examples import cos_cos_graph
>>> solve(cos_cos_graph(), "mincut-aggressive").saved_names
['add_2']
>>> names(family="checkmate")
['checkmate', 'checkmate-lp']
"""

from __future__ import annotations

from . import mincut as _mincut
from .auto import auto
# MAGIS's solvers by their modules: a name ``magis`` here would hide the package remat.solvers.magis
from .magis import search as _search, swap_recompute as _swap_recompute, swap_solver as _swap_solver
from .baselines import BASELINES, DESCRIPTIONS
from .checkmate import checkmate, checkmate_lp
from .registry import (DEFAULT_TIME_LIMIT, SolverInfo, check_options, check_time_limit, info, names,
                       register, solve)

register("auto", "auto", "optional", "the default: the conservative min cut without a budget; with "
         "one, the cheapest plan within it of the MILP, the baselines and both min cuts", auto)
for _mode, _what in (("conservative", "recompute only ops that fuse: no slower step"),
                     ("aggressive", "recompute all but compute-intensive and random ops: least memory")):
    register(f"mincut-{_mode}", "mincut", "optional", f"seeds/000's fusion-aware min cut: {_what}",
             _mincut.solver(_mode))
register("checkmate", "checkmate", "required", "seeds/001's optimal MILP (HiGHS), within the time "
         "limit", checkmate)
register("checkmate-lp", "checkmate", "required", "seeds/001's LP relaxation with two-phase rounding",
         checkmate_lp)
for _name, _fn in BASELINES.items():
    register(_name, "baselines", "optional", DESCRIPTIONS[_name], _fn)
register("reorder", "magis", "optional", "seeds/004's re-ordering alone: the step without "
         "recomputation in the topological order of least peak (no work added)", _swap_solver.reorder_only)
register("swap", "magis", "required", "seeds/004's swapping alone: the step without "
         "recomputation, its hot spots offloaded to host memory until it fits", _swap_solver.swap_only)
register("swap-recompute", "magis", "required", "offloading chosen jointly with recomputation: "
         "auto's plans for several budgets, each swapped down; the fastest that fits",
         _swap_recompute.swap_recompute)
register("magis", "magis", "optional", "seeds/004's coordinated search over fission, recomputation "
         "and swapping: the fastest plan within the budget, or without one the least memory within "
         "max_overhead (default 10%) more time", _search.magis)
register("torch-mincut", "pytorch", "none", "PyTorch's own partitioner (min_cut_rematerialization_"
         "partition), as torch.compile runs it")
register("torch-offload", "pytorch", "none", "PyTorch's min cut with its activation offloading on "
         "and every saved activation marked for it (torchtune's offload-everything policy)")
register("no-recompute", "pytorch", "none", "PyTorch's default_partition: saves what eager autograd "
         "saves, recomputes nothing")

__all__ = ["DEFAULT_TIME_LIMIT", "SolverInfo", "check_options", "check_time_limit", "info", "names",
           "register", "solve"]
