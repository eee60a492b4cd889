"""Reading and writing graphs: remat's own JSON format and the Checkmate/Moccasin graphs.

remat's format (version 1) is one JSON object::

    {"format": "remat.graph", "version": 1, "name": "cos_cos",
     "nodes": [
        {"name": "a", "op": "placeholder", "role": "input", "inputs": [],
         "bytes": 4096, "flops": 0, "category": "input",
         "shape": [1024], "dtype": "float32"},
        {"name": "add", "op": "add", "role": "forward", "inputs": ["a", "b"], ...}
     ]}

Required node keys: ``name``, ``op``, ``role``, ``inputs``, ``bytes``, ``flops``,
``category``. Optional: ``shape``, ``dtype``, ``cost``, ``fusible``, ``must_save``,
``must_recompute``, ``can_save``, ``is_output``, ``backward_output``, ``meta`` (free-form object). Nodes may
appear in any order; they are sorted topologically on load. The graph object may hold a
``meta`` object of its own (:attr:`Graph.meta`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import Any

from ..errors import GraphError
from .graph import Graph, Node
from .limits import MAX_DEPTH, MAX_FILE_ENV, check_meta, check_plannable, check_shape, depth, max_file_bytes

FORMAT = "remat.graph"
VERSION = 1
REQUIRED_KEYS = ("name", "op", "role", "inputs", "bytes", "flops", "category")
OPTIONAL_KEYS = ("shape", "dtype", "cost", "fusible", "must_save", "must_recompute", "can_save",
                 "is_output", "backward_output", "meta")
_BOOL_KEYS = ("fusible", "must_save", "must_recompute", "can_save", "is_output", "backward_output")


def graph_to_dict(g: Graph) -> dict[str, Any]:
    nodes = []
    for n in g.nodes:
        d: dict[str, Any] = {k: getattr(n, k) for k in REQUIRED_KEYS}
        d["inputs"] = list(n.inputs)
        if n.shape is not None:
            d["shape"] = list(n.shape)
        for key in ("dtype", "cost"):
            if getattr(n, key) is not None:
                d[key] = getattr(n, key)
        if n.fusible != (n.category in ("pointwise", "reduction", "view")):
            d["fusible"] = n.fusible
        for flag in ("must_save", "must_recompute", "is_output", "backward_output"):
            if getattr(n, flag):
                d[flag] = True
        if not n.can_save:
            d["can_save"] = False
        if n.meta:
            d["meta"] = n.meta
        nodes.append(d)
    out = {"format": FORMAT, "version": VERSION, "name": g.name, "nodes": nodes}
    if g.meta:
        out["meta"] = g.meta
    return out


def graph_from_dict(data: Any, source: str = "<dict>") -> Graph:
    """Build a Graph from remat's JSON object, or from a Checkmate/Moccasin node-link object."""
    if not isinstance(data, dict):
        raise GraphError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        if "nodes" in data and ("links" in data or "edges" in data):
            return _from_node_link(data, source)
        raise GraphError(
            f"{source}: not a remat graph (missing \"format\": \"{FORMAT}\"); expected "
            f'{{"format": "{FORMAT}", "version": {VERSION}, "nodes": [...]}} '
            "or a Checkmate node-link graph with 'nodes' and 'links'"
        )
    if data.get("version") != VERSION:
        raise GraphError(
            f"{source}: remat graph version {data.get('version')!r} is not supported; "
            f"this remat reads version {VERSION}"
        )
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise GraphError(f"{source}: 'nodes' must be a list of node objects")
    nodes = [_node_from_dict(d, i, source) for i, d in enumerate(raw_nodes)]
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise GraphError(f"{source}: 'meta' must be an object, got {meta!r}")
    check_meta(source, meta)
    graph = Graph(nodes, name=str(data.get("name", Path(source).stem)), meta=meta)
    check_plannable(graph)
    return graph


def _node_from_dict(d: Any, i: int, source: str) -> Node:
    if not isinstance(d, dict):
        raise GraphError(f"{source}: nodes[{i}] is not an object")
    missing = [k for k in REQUIRED_KEYS if k not in d]
    where = f"{source}: node {d.get('name', f'nodes[{i}]')!r}"
    if missing:
        raise GraphError(f"{where} lacks required key(s) {missing}; required: {list(REQUIRED_KEYS)}")
    unknown = set(d) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS)
    if unknown:
        raise GraphError(f"{where} has unknown key(s) {sorted(unknown)}; put extra data under 'meta'")
    if not isinstance(d["name"], str):
        raise GraphError(f"{source}: nodes[{i}] has name {d['name']!r}; a node's name is text")
    if not isinstance(d["inputs"], list) or not all(isinstance(x, str) for x in d["inputs"]):
        raise GraphError(f"{where}: 'inputs' must be a list of node names")
    if d.get("shape") is not None:
        check_shape(where, d["shape"])
    if "meta" in d and isinstance(d["meta"], dict):
        check_meta(where, d["meta"])
    if not isinstance(d["bytes"], int) or isinstance(d["bytes"], bool):
        raise GraphError(f"{where}: 'bytes' must be an integer, got {d['bytes']!r}")
    if not isinstance(d["flops"], (int, float)) or isinstance(d["flops"], bool):
        raise GraphError(f"{where}: 'flops' must be a number, got {d['flops']!r}")
    for k in _BOOL_KEYS:
        if k in d and not isinstance(d[k], bool) and not (k == "fusible" and d[k] is None):
            raise GraphError(f"{where}: {k!r} must be true or false, got {d[k]!r}")
    if "meta" in d and not isinstance(d["meta"], dict):
        raise GraphError(f"{where}: 'meta' must be an object, got {d['meta']!r}")
    kwargs = {k: d[k] for k in REQUIRED_KEYS}
    kwargs["inputs"] = tuple(d["inputs"])
    for k in OPTIONAL_KEYS:
        if k in d:
            kwargs[k] = d[k]
    try:
        return Node(**kwargs)
    except (TypeError, ValueError) as e:
        raise GraphError(f"{where}: {e}") from None


def save_graph(g: Graph, path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(graph_to_dict(g), indent=1) + "\n")


def load_graph(path: str | os.PathLike) -> Graph:
    """Read a graph file: remat's format or a Checkmate/Moccasin node-link graph, gzipped
    when its name ends in ``.gz``; ``"checkmate:NAME"`` reads a graph shipped with remat
    (:mod:`remat.data`).

    >>> import tempfile, os
    >>> from remat.graph.examples import cos_cos_graph
    >>> p = os.path.join(tempfile.mkdtemp(), "g.json"); save_graph(cos_cos_graph(), p)
    >>> len(load_graph(p))
    16
    """
    if isinstance(path, str) and path.startswith("checkmate:"):  # a graph shipped with remat
        from ..data import checkmate_path
        path = checkmate_path(path)
    p = Path(path)
    if not p.exists():
        raise GraphError(f"{p}: no such file")
    return graph_from_dict(parse_document(_read_capped(p), str(p)), str(p))


def _read_capped(p: Path) -> bytes:
    """The bytes of graph file ``p``, decompressed when its name ends in ``.gz``, refused past
    :func:`~remat.graph.limits.max_file_bytes` (a gzip bomb is stopped as it inflates)."""
    cap = max_file_bytes()
    too_big = (f"{p}: the graph is larger than {cap} bytes{{}}; set ${MAX_FILE_ENV} to a larger number "
               "of bytes if it really is that large")
    try:
        if not p.is_file():
            raise GraphError(f"{p}: not a regular file; a graph is a JSON file (or one gzipped, .gz)")
        gz = p.suffix == ".gz"
        if not gz and p.stat().st_size > cap:
            raise GraphError(too_big.format(""))
        with (gzip.open(p, "rb") if gz else open(p, "rb")) as f:
            data = f.read(cap + 1)  # never more than the cap, whatever the file says of itself
        if len(data) > cap:
            raise GraphError(too_big.format(" once decompressed" if gz else ""))
        return data
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise GraphError(f"{p}: cannot read graph file ({getattr(e, 'strerror', None) or e})") from None


def parse_document(data: bytes | str, source: str = "<document>") -> Any:
    """JSON text as a graph document: UTF-8, finite numbers only (``NaN``, ``Infinity`` and
    ``1e400`` are refused: no size or cost is infinite), at most
    :data:`~remat.graph.limits.MAX_DEPTH` levels of nesting below the nodes' fields. Raises
    :class:`~remat.errors.GraphError` saying what is wrong and where."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    except UnicodeDecodeError as e:
        raise GraphError(f"{source}: not a JSON text file (not UTF-8: {e.reason} at byte {e.start})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _NotFinite as e:
        raise GraphError(f"{source}: holds the number {e.args[0]}, which is not finite; sizes, FLOPs and "
                         "costs are finite numbers") from None
    except json.JSONDecodeError as e:
        raise GraphError(f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise GraphError(f"{source}: nested too deeply to be a graph (a graph nests {MAX_DEPTH + 3} levels "
                         "at most)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise GraphError(f"{source}: not a graph document ({e})") from None
    if depth(doc, MAX_DEPTH + 3) > MAX_DEPTH + 3:  # the document, its nodes, a node, its fields
        raise GraphError(f"{source}: nested more than {MAX_DEPTH + 3} levels deep; a graph's 'meta' "
                         f"nests {MAX_DEPTH} at most")
    return doc


class _NotFinite(ValueError):
    pass


def _no_constant(name: str):
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise _NotFinite(text)
    return x


# -- Checkmate (MLSys 2020) and Moccasin graphs ---------------------------------------------

_COMPUTE = re.compile(r"conv|dense|fc\d|predictions|matmul|linear|Loss", re.I)
_POINTWISE = re.compile(r"relu|bn|batch_norm|add|activation|dropout|pad|act", re.I)
_VIEW = re.compile(r"flatten|reshape", re.I)


def _guess_category(name: str) -> str:
    base = name.removesuffix("_backward")
    if _COMPUTE.search(base):
        return "compute"
    if _VIEW.search(base):
        return "view"
    if _POINTWISE.search(base):
        return "pointwise"
    return "other"


def _input_bytes_from_name(name: str) -> int:
    """Checkmate file names are MODEL_BATCH_H_W_C: the image batch is B*H*W*C float32."""
    nums = re.findall(r"_(\d+)", name)
    if len(nums) >= 4:
        b, h, w, c = (int(x) for x in nums[-4:])  # the model name may hold numbers: fcn_8_vgg
        return b * h * w * c * 4
    return 0


def _from_node_link(data: dict, source: str) -> Graph:
    try:
        return _node_link_graph(data, source)
    except GraphError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise GraphError(
            f"{source}: malformed node-link graph ({what}); expected 'nodes' (objects with an "
            "'id' or 'name') and 'links' (objects with 'source' and 'target')"
        ) from None


def _node_link_graph(data: dict, source: str) -> Graph:
    links = data.get("links", data.get("edges"))
    if isinstance(links, str) or not isinstance(data.get("nodes"), list) or not isinstance(links, list):
        raise GraphError(f"{source}: node-link graph must have lists 'nodes' and 'links'")
    raw = data["nodes"]
    key = "id" if raw and "id" in raw[0] else "name"
    ids = {nd[key]: nd for nd in raw}
    preds: dict[Any, list[Any]] = {k: [] for k in ids}
    for link in links:
        s, t = (link["source"], link["target"]) if "source" in link else (link["0"], link["1"])
        if s not in ids or t not in ids:
            raise GraphError(f"{source}: link {s!r} -> {t!r} names an unknown node")
        preds[t].append(s)
    stem = Path(source).stem
    checkmate = "cost_ram" in raw[0] if raw else False
    names = {k: (str(nd.get("name", k)) if checkmate else f"n{k}") for k, nd in ids.items()}
    nodes: list[Node] = []
    if checkmate:
        data_name = "data"
        nodes.append(Node(data_name, "placeholder", (), role="input",
                          bytes=_input_bytes_from_name(stem), category="input"))
        fwd_users: dict[Any, int] = {k: 0 for k in ids}
        for t, ps in preds.items():
            if not ids[t]["backward"]:
                for s in ps:
                    fwd_users[s] += 1
        for k, nd in ids.items():
            backward = bool(nd["backward"])
            inputs = [names[s] for s in preds[k]]
            if not inputs and not backward:
                inputs = [data_name]
            nodes.append(Node(
                names[k], names[k], tuple(inputs),
                role="backward" if backward else "forward",
                bytes=int(nd["cost_ram"]), cost=float(nd["cost_cpu"]),
                category=_guess_category(names[k]),
                is_output=(not backward and fwd_users[k] == 0),
                meta={"id": nd["id"]},
            ))
    else:
        for k, nd in ids.items():
            inputs = tuple(names[s] for s in preds[k])
            nodes.append(Node(
                names[k], "op", inputs, role="forward" if inputs else "input",
                bytes=int(nd.get("out_cost", 0)), cost=float(nd.get("duration", 0)),
                category="other" if inputs else "input",
                meta={"param_bytes": int(nd.get("param_cost", 0))},
            ))
    graph_meta = data.get("graph")
    name = graph_meta.get("name", stem) if isinstance(graph_meta, dict) else stem
    graph = Graph(nodes, name=str(name))
    check_plannable(graph)
    return graph
