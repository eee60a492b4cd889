"""Lowering: a Plan's Schedule -> the forward and backward fx graphs PyTorch compiles.

:mod:`.fx` rebuilds the two graphs in statement order, :mod:`.partitioner` is the hook inductor
calls, :mod:`.backend` the ``"remat"`` dynamo backend.
"""
