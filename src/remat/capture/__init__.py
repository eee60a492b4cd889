"""Capture: the joint forward+backward graph AOTAutograd hands to a partitioner -> remat Graph.

:mod:`.joint` is the one place remat touches PyTorch's private partitioner API;
:mod:`.to_graph` builds the torch-free :class:`~remat.graph.Graph` from a prepared joint graph.
"""
