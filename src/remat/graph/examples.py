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
