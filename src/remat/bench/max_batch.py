"""The maximum-batch search on Checkmate's graphs, now at home in :mod:`remat.fit.search`
(``remat fit`` runs it on any graph); re-exported here for the benchmarks that import it."""

from ..fit.search import (
    MaxBatch,
    Probe,
    cost_split,
    max_batch,
    one_forward_overhead,
    probe_batch,
)

__all__ = ["MaxBatch", "Probe", "cost_split", "max_batch", "one_forward_overhead", "probe_batch"]
