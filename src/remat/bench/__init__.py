"""Benchmarks: the methods compared (:mod:`remat.bench.methods`) on the cases of
:mod:`remat.zoo`, and how they are measured and reported; :mod:`remat.bench.harness` is what
the scripts in ``benchmarks/`` share (entry point, cases x variants, JSON rows, tables)."""
