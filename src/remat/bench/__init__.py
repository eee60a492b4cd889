"""Benchmarks: the methods compared (:mod:`remat.bench.methods`) on the cases of
:mod:`remat.zoo`, and how they are measured and reported."""
