"""The Graph IR and its JSON readers/writers (remat.graph, remat.graph.io). No torch.

The joint graph is the input of Algorithm 1 (seeds/000 Section 3.2-3.3): a DAG whose nodes are
primal inputs, tangents, forward nodes (V_f, computable from the primals alone) and backward
nodes. These tests pin down that malformed graphs are refused with a GraphError that names the
offending node, and that every field survives a JSON round trip.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from remat.errors import GraphError
from remat.graph.examples import cos_cos_graph
from remat.graph.graph import Graph, Node
from remat.graph.io import graph_from_dict, graph_to_dict, load_graph, save_graph

from paths import CHECKMATE_DIR  # noqa: E402


def inp(name, bytes=16, role="input"):
    return Node(name, "placeholder", (), role=role, bytes=bytes, category="input")


def pw(name, *inputs, role="forward", bytes=16, **kw):
    return Node(name, "op", inputs, role=role, bytes=bytes, category="pointwise", **kw)


# -- validation ---------------------------------------------------------------------------


def test_cycle_is_refused_and_named():
    """A joint graph must be a DAG (seeds/000 Section 2.4); the error names the cycle's nodes."""
    nodes = [inp("x"), pw("p", "x", "r"), pw("q", "p"), pw("r", "q"), pw("after", "r")]
    with pytest.raises(GraphError, match="cycle") as e:
        Graph(nodes)
    msg = str(e.value)
    for name in ("p", "q", "r"):
        assert re.search(rf"\b{name}\b", msg), (name, msg)
    assert "after" not in msg  # downstream of the cycle, not part of it


def test_self_loop_is_refused_and_named():
    """A node reading itself is the smallest cycle (seeds/000 Section 2.4: G is a DAG)."""
    with pytest.raises(GraphError, match=r"'loop'.*cycle"):
        Graph([inp("x"), pw("loop", "x", "loop")])


def test_unknown_input_is_refused_and_named():
    """Every edge (u, v) of the data-flow graph needs u to be a node (seeds/000 Section 2.4)."""
    with pytest.raises(GraphError) as e:
        Graph([inp("x"), pw("y", "x", "nope")])
    assert "'y'" in str(e.value) and "'nope'" in str(e.value)


def test_duplicate_names_are_refused_and_named():
    """Node names identify the vertices i_in/i_out of Algorithm 1 (seeds/000 Section 3.3)."""
    with pytest.raises(GraphError, match=r"duplicate.*'y'"):
        Graph([inp("x"), pw("y", "x"), pw("y", "x")])


@pytest.mark.parametrize("bad", [-1, -4096])
def test_negative_bytes_are_refused_and_named(bad):
    """Capacities w/2w of Algorithm 2 (seeds/000 Section 3.3) come from bytes: they must be >= 0."""
    with pytest.raises(GraphError, match=r"'y'.*bytes"):
        Graph([inp("x"), pw("y", "x", bytes=bad)])


def test_non_integer_bytes_are_refused():
    """Sizes are whole bytes (seeds/000 Lemma 3.5 sums them); a float size is a malformed node."""
    with pytest.raises(GraphError, match=r"'y'.*bytes"):
        Graph([inp("x"), pw("y", "x", bytes=1.5)])


@pytest.mark.parametrize("field,value", [("cost", -1.0), ("cost", "fast"), ("flops", -3),
                                         ("flops", "many"), ("cost", float("nan"))])
def test_bad_cost_or_flops_is_a_graph_error(field, value):
    """Costs feed the planning of seeds/000 Section 3; non-numeric or negative ones are refused
    with a GraphError naming the node, never a bare TypeError from comparing a string with 0."""
    with pytest.raises(GraphError, match=rf"'y'.*{field}"):
        Graph([inp("x"), pw("y", "x").replace(**{field: value})])


def test_unknown_role_is_refused_and_named():
    """Roles encode V_f vs V \\ V_f of seeds/000 Section 3.3; an unknown role is refused."""
    with pytest.raises(GraphError, match=r"'y'.*role 'sideways'"):
        Graph([inp("x"), pw("y", "x", role="sideways")])


def test_unknown_category_is_refused_and_named():
    """Categories decide fusibility and bans (seeds/000 Sections 3.1, 3.4); unknown ones are refused."""
    with pytest.raises(GraphError, match=r"'y'.*category 'elementwise'"):
        Graph([inp("x"), Node("y", "op", ("x",), category="elementwise")])


def test_forward_node_reading_a_tangent_is_refused():
    """A node that needs grad_out is not in V_f (seeds/000 Section 3.2): it must be 'backward'."""
    with pytest.raises(GraphError) as e:
        Graph([inp("x"), inp("tangents_1", role="tangent"), pw("mul", "x", "tangents_1")])
    msg = str(e.value)
    assert "'mul'" in msg and "'tangents_1'" in msg and "backward" in msg


def test_forward_node_reading_a_backward_node_is_refused():
    """Anything depending on a backward value is outside V_f too (seeds/000 Section 3.2)."""
    with pytest.raises(GraphError, match=r"'late'.*'grad'"):
        Graph([inp("x"), inp("t", role="tangent"), pw("grad", "t", "x", role="backward"),
               pw("late", "grad")])


@pytest.mark.parametrize("role", ["input", "param", "tangent"])
def test_placeholders_have_no_inputs(role):
    """Placeholder nodes have no incoming edge (seeds/000 Section 2.4)."""
    with pytest.raises(GraphError, match=r"'p'.*placeholders"):
        Graph([inp("x"), Node("p", "placeholder", ("x",), role=role, category="input")])


def test_must_save_and_must_recompute_conflict():
    """A node cannot be both banned from recomputation and unsaveable (seeds/000 Section 3.3)."""
    with pytest.raises(GraphError, match=r"'y'.*must_save.*must_recompute"):
        Graph([inp("x"), pw("y", "x", must_save=True, must_recompute=True)])


def test_backward_may_read_backward_and_tangents():
    """A valid joint graph (seeds/000 Figure 2 shape) builds without error and reports users."""
    g = Graph([inp("x"), inp("t", role="tangent"), pw("s", "x"),
               pw("g1", "t", "s", role="backward"), pw("g2", "g1", "x", role="backward")])
    assert [n.name for n in g.users("x")] == ["s", "g2"]
    assert ("g1", "g2") in g.edges


# -- topological order --------------------------------------------------------------------


def test_out_of_order_nodes_are_sorted_topologically():
    """Nodes may be given in any order; the Graph is a topological order of the DAG (seeds/000
    Section 2.4), keeping the given order where the data flow allows."""
    given = [pw("mul", "t", "neg", role="backward"), pw("neg", "sin"), pw("sin", "x"),
             inp("t", role="tangent"), inp("x"), pw("cos", "x")]
    g = Graph(given)
    order = [n.name for n in g]
    assert sorted(order) == sorted(n.name for n in given)
    pos = {n: i for i, n in enumerate(order)}
    for u, v in g.edges:
        assert pos[u] < pos[v], (u, v, order)
    # stable: independent nodes keep their given relative order
    assert pos["t"] < pos["x"] < pos["cos"]
    assert order == ["t", "x", "sin", "neg", "mul", "cos"]


def test_order_already_topological_is_kept():
    """An already topological order (e.g. the cos-cos graph of seeds/002) is not permuted."""
    g = cos_cos_graph()
    assert [n.name for n in Graph(list(g.nodes))] == [n.name for n in g]
    assert [n.name for n in Graph(list(reversed(g.nodes)))] != [n.name for n in reversed(g.nodes)]


def test_duplicate_input_edges_are_one_edge():
    """x * x reads x twice but is a single data-flow edge (seeds/000 Section 2.4)."""
    g = Graph([inp("x"), pw("sq", "x", "x")])
    assert g.edges == [("x", "sq")]
    assert [n.name for n in g.users("x")] == ["sq"]


# -- JSON round trip ----------------------------------------------------------------------


def _rich_graph() -> Graph:
    return Graph([
        Node("x", "placeholder", (), role="input", bytes=4096, category="input",
             shape=(2, 512), dtype="float32", meta={"source": "test"}),
        Node("w", "placeholder", (), role="param", bytes=2048, category="input",
             shape=(512, 1), dtype="bfloat16"),
        Node("mm", "mm", ("x", "w"), role="forward", bytes=8, flops=2048.0, category="compute",
             cost=3.5, shape=(2, 1), dtype="float32", must_save=True),
        Node("rnd", "rand_like", ("mm",), role="forward", bytes=8, category="random"),
        Node("mask", "lt", ("rnd",), role="forward", bytes=2, category="pointwise", dtype="bool",
             fusible=False),
        Node("v", "view", ("mm",), role="forward", bytes=8, category="view", must_recompute=True),
        Node("out", "mul", ("v", "mask"), role="forward", bytes=8, category="pointwise",
             is_output=True, flops=2),
        Node("gw", "sum", ("x",), role="forward", bytes=0, category="reduction",
             backward_output=True, fusible=True, meta={"nested": {"a": [1, 2]}}),
        Node("t", "placeholder", (), role="tangent", bytes=8, category="input", shape=(2, 1)),
        Node("gx", "mul", ("t", "mask", "t"), role="backward", bytes=8, category="other",
             fusible=True, cost=0.0),
    ], name="rich")


def _assert_same_graph(a: Graph, b: Graph):
    assert a.name == b.name
    assert [n.name for n in a] == [n.name for n in b]
    for na, nb in zip(a, b):
        assert na == nb, (na, nb)  # every dataclass field except meta
        assert na.meta == nb.meta
        for f in ("shape", "inputs"):
            assert type(getattr(nb, f)) is type(getattr(na, f))


def test_dict_round_trip_preserves_every_field():
    """graph_to_dict/graph_from_dict keep every Node field, flags and meta included (the format
    that carries the joint graphs of seeds/000 Section 3.2 between tools)."""
    g = _rich_graph()
    d = graph_to_dict(g)
    assert d["format"] == "remat.graph" and d["version"] == 1
    d2 = json.loads(json.dumps(d))  # through real JSON text
    _assert_same_graph(g, graph_from_dict(d2))
    # explicit non-default fusible flags survive, default ones are recomputed identically
    g2 = graph_from_dict(d2)
    assert g2["mask"].fusible is False and g2["gx"].fusible is True and g2["out"].fusible is True
    assert g2["mm"].must_save and g2["v"].must_recompute and g2["gw"].backward_output
    assert g2["out"].is_output and g2["mm"].cost == 3.5 and g2["gx"].cost == 0.0
    assert g2["x"].shape == (2, 512) and g2["w"].dtype == "bfloat16"
    assert g2["gx"].inputs == ("t", "mask", "t")


def test_every_field_is_exercised_by_the_round_trip_graph():
    """Guard for the round-trip test above: each optional Node field is non-default somewhere."""
    g = _rich_graph()
    defaults = Node("d", "op")
    for f in ("cost", "shape", "dtype", "must_save", "must_recompute", "is_output",
              "backward_output", "flops", "meta"):
        assert any(getattr(n, f) != getattr(defaults, f) for n in g), f
    assert any(n.fusible != (n.category in ("pointwise", "reduction", "view")) for n in g)


def test_file_round_trip(tmp_path):
    """save_graph/load_graph round-trip a graph file (seeds/002 cos-cos and a richer graph)."""
    for g in (cos_cos_graph(), _rich_graph()):
        p = tmp_path / f"{g.name}.json"
        save_graph(g, p)
        _assert_same_graph(g, load_graph(p))
        _assert_same_graph(g, load_graph(str(p)))


def test_round_trip_of_unsorted_input_file(tmp_path):
    """A file listing nodes out of order loads sorted and then round-trips unchanged."""
    d = graph_to_dict(cos_cos_graph())
    d["nodes"].reverse()
    p = tmp_path / "rev.json"
    p.write_text(json.dumps(d))
    g = load_graph(p)
    ref = cos_cos_graph()
    assert sorted(n.name for n in g) == sorted(n.name for n in ref)
    assert all(g[n.name] == n for n in ref)
    pos = {n.name: i for i, n in enumerate(g)}
    assert all(pos[u] < pos[v] for u, v in g.edges)
    p2 = tmp_path / "again.json"
    save_graph(g, p2)
    _assert_same_graph(g, load_graph(p2))


# -- malformed files ----------------------------------------------------------------------


def _valid_doc():
    return graph_to_dict(cos_cos_graph())


def _load_text(tmp_path, text: str | bytes):
    p = tmp_path / "g.json"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return load_graph(p)


@pytest.mark.parametrize("text,pattern", [
    ("", "not valid JSON"),
    ("{", "not valid JSON"),
    ("{'format': 'remat.graph'}", "not valid JSON"),
    ("nodes: []", "not valid JSON"),
    (b"\xff\xfe\x00\x81garbage", "not"),
])
def test_not_json(tmp_path, text, pattern):
    """A file that is not JSON is a GraphError naming the file, not a JSONDecodeError."""
    with pytest.raises(GraphError, match=pattern) as e:
        _load_text(tmp_path, text)
    assert "g.json" in str(e.value)


def test_missing_file_and_directory(tmp_path):
    """Unreadable paths (a missing file, a directory) are GraphErrors that name the path."""
    with pytest.raises(GraphError, match="no such file"):
        load_graph(tmp_path / "missing.json")
    with pytest.raises(GraphError, match=str(tmp_path.name)):
        load_graph(tmp_path)


def _mutations():
    def drop(key):
        def f(d):
            del d[key]
        return f

    def setk(key, value):
        def f(d):
            d[key] = value
        return f

    def node(i, key, value=None, delete=False):
        def f(d):
            if delete:
                del d["nodes"][i][key]
            else:
                d["nodes"][i][key] = value
        return f

    return [
        ("missing format", drop("format"), "format"),
        ("wrong format", setk("format", "other.graph"), "format"),
        ("wrong version", setk("version", 2), r"version 2"),
        ("version as string", setk("version", "1"), r"version '1'"),
        ("missing version", drop("version"), "version None"),
        ("nodes not a list", setk("nodes", {"a": 1}), "'nodes' must be a list"),
        ("nodes missing", drop("nodes"), "'nodes' must be a list"),
        ("node not an object", setk("nodes", [1]), r"nodes\[0\] is not an object"),
        *[(f"missing {k}", node(6, k, delete=True), rf"'{k}'")
          for k in ("op", "role", "inputs", "bytes", "flops", "category")],
        ("missing name", node(6, "name", delete=True), r"nodes\[6\].*'name'"),
        ("inputs a string", node(6, "inputs", "add_1"), r"'add_2'.*'inputs' must be a list"),
        ("inputs a dict", node(6, "inputs", {"a": 1}), r"'add_2'.*'inputs' must be a list"),
        ("inputs with a number", node(6, "inputs", ["add_1", 3]), r"'add_2'.*'inputs'"),
        ("inputs null", node(6, "inputs", None), r"'add_2'.*'inputs'"),
        ("bytes a string", node(6, "bytes", "4096"), r"'add_2'.*'bytes'"),
        ("bytes a float", node(6, "bytes", 1.5), r"'add_2'.*'bytes'"),
        ("bytes bool", node(6, "bytes", True), r"'add_2'.*'bytes'"),
        ("negative bytes", node(6, "bytes", -1), r"'add_2'.*bytes"),
        ("flops a string", node(6, "flops", "lots"), r"'add_2'.*'flops'"),
        ("cost a string", node(6, "cost", "slow"), r"'add_2'.*cost"),
        ("cost a list", node(6, "cost", [1]), r"'add_2'.*cost"),
        ("shape not a list", node(6, "shape", 7), r"'add_2'"),
        ("shape of strings", node(6, "shape", ["a"]), r"'add_2'"),
        ("flag a string", node(6, "must_save", "yes"), r"'add_2'.*must_save"),
        ("fusible a string", node(6, "fusible", "no"), r"'add_2'.*fusible"),
        ("meta a string", node(6, "meta", "x"), r"'add_2'.*meta"),
        ("unknown key", node(6, "colour", "red"), r"'add_2'.*unknown key.*colour"),
        ("unknown role", node(6, "role", "middle"), r"'add_2'.*role"),
        ("role null", node(6, "role", None), r"'add_2'.*role"),
        ("unknown category", node(6, "category", "magic"), r"'add_2'.*category"),
        ("category a list", node(6, "category", ["pointwise"]), r"'add_2'"),
        ("unknown input", node(6, "inputs", ["add_1", "zzz"]), r"'add_2'.*'zzz'"),
        ("name a number", node(6, "name", 5), r"name"),
    ]


@pytest.mark.parametrize("label,mutate,pattern", _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_remat_json(tmp_path, label, mutate, pattern):
    """Malformed remat graph files raise GraphError with a message naming the problem (and the
    node), never a bare KeyError/TypeError. The graph is seeds/002's cos-cos joint graph."""
    d = _valid_doc()
    assert d["nodes"][6]["name"] == "add_2"
    mutate(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(GraphError, match=pattern):
        load_graph(p)
    with pytest.raises(GraphError, match=pattern):
        graph_from_dict(copy.deepcopy(d))


@pytest.mark.parametrize("data", [[], "graph", 3, None])
def test_top_level_not_an_object(data):
    """The file must hold one JSON object (the remat.graph format of a seeds/000 Section 3.2
    joint graph)."""
    with pytest.raises(GraphError, match="JSON object"):
        graph_from_dict(data, "f.json")


def test_missing_format_message_is_helpful():
    """The error for a file without "format" tells what a remat graph file looks like."""
    d = _valid_doc()
    del d["format"]
    with pytest.raises(GraphError) as e:
        graph_from_dict(d, "x.json")
    msg = str(e.value)
    assert "x.json" in msg and '"format": "remat.graph"' in msg and "version" in msg


def test_unmutated_document_loads():
    """Control for the malformed-file tests: the unmutated seeds/002 document loads."""
    assert len(graph_from_dict(_valid_doc())) == 16


_CM = {"id": 0, "name": "a", "backward": False, "cost_ram": 1, "cost_cpu": 1}


@pytest.mark.parametrize("data,pattern", [
    ({"nodes": [_CM], "links": [{"from": 0}]}, r"m\.json.*'0'|m\.json.*source"),
    ({"nodes": [{k: v for k, v in _CM.items() if k != "backward"}], "links": []},
     r"m\.json.*'backward'"),
    ({"nodes": [{**_CM, "cost_ram": "x"}], "links": []}, r"m\.json"),
    ({"nodes": [{**_CM, "cost_cpu": None}], "links": []}, r"m\.json"),
    ({"nodes": [1, 2], "links": []}, r"m\.json"),
    ({"nodes": [_CM], "links": [{"source": 0, "target": 7}]}, r"m\.json.*unknown node"),
    ({"nodes": [{"id": 0}, {"id": 1}], "links": [{"source": 0, "target": 1},
                                                 {"source": 1, "target": 0}]}, "cycle"),
    ({"nodes": [{"id": 0}], "links": "0->1"}, r"m\.json.*'links'"),
    ({"nodes": [{"id": 0, "out_cost": "big"}], "links": []}, r"m\.json"),
    ({"nodes": [{"id": 0}, {"id": 1}], "links": [[0, 1]]}, r"m\.json"),
])
def test_malformed_node_link_json(data, pattern):
    """Malformed Checkmate/Moccasin node-link graphs (the benchmark graphs run through seeds/000
    Algorithm 1) are GraphErrors naming the file, not bare KeyError/TypeError/ValueError."""
    with pytest.raises(GraphError, match=pattern):
        graph_from_dict(data, "m.json")


# -- Checkmate / Moccasin graphs ----------------------------------------------------------

CHECKMATE_FILES = sorted(CHECKMATE_DIR.glob("*.json"))


def test_all_eleven_checkmate_files_are_present():
    """The shared data set has 11 graphs (7 Checkmate *_train_nx, 4 Moccasin random_layered)."""
    assert len(CHECKMATE_FILES) == 11
    assert sum(p.name.endswith("_train_nx.json") for p in CHECKMATE_FILES) == 7


@pytest.mark.parametrize("path", CHECKMATE_FILES, ids=[p.stem[:24] for p in CHECKMATE_FILES])
def test_checkmate_graphs_import(path):
    """Every shared Checkmate/Moccasin graph imports: node counts, edges and roles match the
    file. Checkmate training graphs get one extra 'data' input node (their first layer reads the
    image batch, which the file does not list); backward roles follow the file's 'backward'."""
    raw = json.loads(path.read_text())
    g = load_graph(path)
    raw_nodes = raw["nodes"]
    links = raw.get("links", raw.get("edges"))
    if path.name.endswith("_train_nx.json"):
        assert len(g) == len(raw_nodes) + 1
        data = g["data"]
        assert data.role == "input" and data.inputs == ()
        b, h, w, c = (int(x) for x in path.stem.split("_")[-6:-2])
        assert data.bytes == b * h * w * c * 4
        by_id = {nd["id"]: nd for nd in raw_nodes}
        for nd in raw_nodes:
            n = g[nd["name"]]
            assert n.role == ("backward" if nd["backward"] else "forward"), nd
            assert n.bytes == nd["cost_ram"]
            assert n.cost == float(nd["cost_cpu"])
        for link in links:
            s, t = by_id[link["source"]]["name"], by_id[link["target"]]["name"]
            assert s in g[t].inputs
        assert sum(n.role == "backward" for n in g) == sum(bool(nd["backward"]) for nd in raw_nodes)
        pairs = {(link["source"], link["target"]) for link in links}
        assert len(g.edges) == len(pairs) + len(g.users("data"))
        first = [nd["name"] for nd in raw_nodes
                 if not nd["backward"] and all(l["target"] != nd["id"] for l in links)]
        assert sorted(n.name for n in g.users("data")) == sorted(first)
        assert any(n.role == "backward" for n in g)
        # forward outputs exist and are forward nodes
        outs = [n for n in g if n.is_output]
        assert outs and all(n.role == "forward" for n in outs)
    else:
        assert len(g) == len(raw_nodes)
        assert sum(n.role == "input" for n in g) >= 1
        assert len(g.edges) == len({(l["0"], l["1"]) if "0" in l else (l["source"], l["target"])
                                    for l in links})
    assert g.name
    # edges point forward in the stored topological order
    pos = {n.name: i for i, n in enumerate(g)}
    assert all(pos[u] < pos[v] for u, v in g.edges)


def test_vgg16_node_count():
    """VGG16 (Checkmate, MLSys 2020) has 45 nodes in the file plus the 'data' input: 46, of which
    23 are backward per the file's flags."""
    g = load_graph(CHECKMATE_DIR / "VGG16_256_224_224_3_train_nx.json")
    assert len(g) == 46
    assert sum(n.role == "backward" for n in g) == 23
    assert sum(n.role == "forward" for n in g) == 22
    assert g["data"].bytes == 256 * 224 * 224 * 3 * 4


def test_checkmate_graph_round_trips_through_remat_format(tmp_path):
    """An imported Checkmate graph (a joint graph in the sense of seeds/000 Section 3.2) saved in
    remat's format loads back identical."""
    g = load_graph(CHECKMATE_DIR / "ResNet50_256_224_224_3_train_nx.json")
    p = tmp_path / "resnet.json"
    save_graph(g, p)
    _assert_same_graph(g, load_graph(p))
