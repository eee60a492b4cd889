"""Pure passes: re-ordering (reorder, Schedule -> Schedule) and fission (Graph -> Graph). MAGIS's
swap pass and trade live with its solvers, in :mod:`remat.solvers.magis`."""
