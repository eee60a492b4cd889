"""Fusion-aware min-cut checkpointing (seeds/000), solved with OR-Tools' compiled max-flow."""

from .mincut import MODES, analyse, banned, cut_cost, flow_network, mincut, solver

__all__ = ["MODES", "analyse", "banned", "cut_cost", "flow_network", "mincut", "solver"]
