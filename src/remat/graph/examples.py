"""Hand-written joint graphs of the seeds' worked examples (torch-free, for docs and tests).

``cos_cos_graph`` is seeds/000 Figure 2 / seeds/002: f(a, b, c, d) = cos(cos(a + b + c + d)),
forward and backward, with every tensor ``numel`` float32 elements.
"""

from __future__ import annotations

from .graph import Graph, Node


def cos_cos_graph(numel: int = 1024) -> Graph:
    """The joint graph of f(a,b,c,d) = cos(cos(a+b+c+d)); the optimal saved set is {add_2}.

    >>> g = cos_cos_graph(); [n.name for n in g if n.role == "backward"]
    ['mul', 'mul_1']
    """
    b = 4 * numel

    def pw(name, op, *inputs, role="forward", **kw):
        return Node(name, op, inputs, role=role, bytes=b, category="pointwise",
                    shape=(numel,), dtype="float32", flops=numel, **kw)

    inputs = [Node(x, "placeholder", (), role="input", bytes=b, category="input",
                   shape=(numel,), dtype="float32") for x in "abcd"]
    return Graph([
        *inputs,
        pw("add", "add", "a", "b"),
        pw("add_1", "add", "add", "c"),
        pw("add_2", "add", "add_1", "d"),
        pw("cos", "cos", "add_2"),
        pw("cos_1", "cos", "cos", is_output=True),
        Node("tangents_1", "placeholder", (), role="tangent", bytes=b, category="input",
             shape=(numel,), dtype="float32"),
        pw("sin", "sin", "cos"),
        pw("neg", "neg", "sin"),
        pw("mul", "mul", "tangents_1", "neg", role="backward"),
        pw("sin_1", "sin", "add_2"),
        pw("neg_1", "neg", "sin_1"),
        pw("mul_1", "mul", "mul", "neg_1", role="backward"),
    ], name="cos_cos")


def offload_chain() -> Graph:
    """A chain for offloading's worked examples: x -> f0 .. f3 (f3 the output), the tangent,
    then b3 .. b0 (b3 reads f2, b2 f1, b1 f0, b0 x; b0 the output), every op 1 cost unit and
    every value 100 bytes. Saving {x, f0, f1, f2} takes 8 units and peaks at 7 values.

    >>> [n.name for n in offload_chain() if n.role == "backward"]
    ['b3', 'b2', 'b1', 'b0']
    """
    n = [Node("x", "placeholder", (), role="input", bytes=100, category="input")]
    prev = "x"
    for i in range(4):
        n.append(Node(f"f{i}", "op", (prev,), bytes=100, cost=1.0, is_output=i == 3))
        prev = f"f{i}"
    n.append(Node("t", "placeholder", (), role="tangent", bytes=100, category="input"))
    for k, (src, saved) in enumerate((("t", "f2"), ("b3", "f1"), ("b2", "f0"), ("b1", "x"))):
        n.append(Node(f"b{3 - k}", "grad", (src, saved), role="backward", bytes=100, cost=1.0,
                      is_output=k == 3))
    return Graph(n, name="chain")


def offload_chain_statements(reload_before: str | None = "b1") -> list[tuple[str, str]]:
    """Statements of :func:`offload_chain` saving {x, f0, f1, f2}, as
    ``remat.plans.schedule_from_saved_set`` orders them; with ``reload_before``, f0 is offloaded
    right after its compute, freed after f1 reads it and reloaded before that compute (and
    freed at the end).

    >>> offload_chain_statements("b2")[:5]
    [('compute', 'f0'), ('offload', 'f0'), ('compute', 'f1'), ('free', 'f0'), ('compute', 'f2')]
    """
    base = [("compute", "f0"), ("compute", "f1"), ("compute", "f2"), ("compute", "f3"),
            ("compute", "t"), ("compute", "b3"), ("free", "t"), ("free", "f2"), ("compute", "b2"),
            ("free", "b3"), ("free", "f1"), ("compute", "b1"), ("free", "b2"), ("free", "f0"),
            ("compute", "b0"), ("free", "b1")]
    if reload_before is None:
        return base
    out = []
    for op, node in base:
        if (op, node) == ("compute", reload_before):
            out.append(("reload", "f0"))
        if (op, node) == ("free", "f0"):
            continue  # freed after f1 instead
        out.append((op, node))
        if (op, node) == ("compute", "f0"):
            out.append(("offload", "f0"))
        if (op, node) == ("compute", "f1"):
            out.append(("free", "f0"))
    return out + [("free", "f0")]
