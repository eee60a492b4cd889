"""MAGIS (seeds/004) as one solver family: fission, recomputation and swapping.

- :mod:`.ftree`: the F-Tree, the fission regions worth trying and the rules that change them;
- :mod:`.swap`: the swap pass (Schedule -> Schedule), offloading the hot spots of the peak;
- :mod:`.trade`: recomputations traded for swaps, a pass;
- :mod:`.swap_solver`: ``swap`` and ``reorder`` (the step without recomputation swapped down,
  or re-ordered), and :func:`~.swap_solver.swap_down`, which swaps any schedules down;
- :mod:`.swap_recompute`: ``swap-recompute``, the starting plans for several budgets swapped down;
- :mod:`.search`: ``magis``, the coordinated search (Algorithm 3), and ``auto``'s refinement.

The pure passes these use (re-ordering, fission) live in :mod:`remat.transforms`. This
package imports nothing itself, so that the starting plans (:mod:`remat.solvers.portfolio`)
can use :func:`~.swap_solver.swap_down` while the search and ``swap-recompute`` use them.
"""
