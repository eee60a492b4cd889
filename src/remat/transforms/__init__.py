"""Schedule -> Schedule passes: re-ordering (reorder) and swapping (swap)."""
