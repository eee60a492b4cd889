"""Graphs shipped with remat, for benchmarks, tests and users (no torch).

``checkmate/`` holds the training graphs published with the Checkmate paper (Jain et al., MLSys
2020: Keras forward + backward graphs with profiled costs, ``MODEL_BATCH_H_W_C_train_nx.json``)
and the random layered graphs of the Moccasin paper (Bartan et al., ICML 2023,
``random_layered_n*.json``), as networkx node-link JSON: 11 files, 852 KB. See
``checkmate/README.md`` for their fields and the published results on them.

A graph is named by its file's stem or any prefix of it that names one file
(``"ResNet50"``, ``"random_layered_n1000"``); ``remat plan checkmate:ResNet50`` and
``remat.load_graph("checkmate:ResNet50")`` read it.

>>> [p.stem.split("_")[0] for p in checkmate_files()][:3]
['MobileNet', 'ResNet50', 'VGG16']
>>> checkmate_path("VGG19").name
'VGG19_256_224_224_3_train_nx.json'
"""

from __future__ import annotations

from pathlib import Path

from ..errors import GraphError

CHECKMATE_DIR = Path(__file__).resolve().parent / "checkmate"
"""The folder of the shipped graphs."""

PREFIX = "checkmate:"
"""How a graph file argument names a shipped graph (``checkmate:ResNet50``)."""


def checkmate_files() -> list[Path]:
    """Every shipped graph file, sorted by name."""
    return sorted(CHECKMATE_DIR.glob("*.json"))


def checkmate_path(name: str) -> Path:
    """The shipped graph ``name`` (a file's stem, or a prefix that names one file; a leading
    ``checkmate:`` is allowed). Raises :class:`~remat.errors.GraphError` listing the names."""
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    files = checkmate_files()
    found = [p for p in files if p.stem == name or p.name == name]
    for prefix in (name + "_", name):  # "random_layered_n100" is n100's, not also n1000's
        found = found or [p for p in files if name and p.stem.startswith(prefix)]
    if len(found) == 1:
        return found[0]
    names = ", ".join(p.stem for p in files)
    why = "names several" if found else "names none"
    raise GraphError(f"checkmate:{name} {why} of remat's shipped graphs; they are: {names}")
