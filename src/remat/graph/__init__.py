"""The graph IR every layer of remat speaks, with its readers and writers (no torch).

:class:`Graph` and :class:`Node` (:mod:`.graph`), remat's JSON and the Checkmate graphs
(:mod:`.io`), hand-written and synthetic example graphs (:mod:`.examples`, :mod:`.synthetic`),
and batch rescaling of Checkmate graphs (:mod:`.batch`).
"""

from .graph import CATEGORIES, ROLES, Graph, GraphArrays, Node
from .io import graph_from_dict, graph_to_dict, load_graph, save_graph

__all__ = ["CATEGORIES", "ROLES", "Graph", "GraphArrays", "Node", "graph_from_dict", "graph_to_dict",
           "load_graph", "save_graph"]
