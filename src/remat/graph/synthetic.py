"""Synthetic joint graphs shaped like a real transformer training step (torch-free).

:func:`synthetic_joint_graph` writes the joint forward+backward graph that AOTAutograd would
hand a partitioner for a GPT-2-like decoder, at any size: an embedding, repeated pre-LN
blocks (layer norm decomposed into reductions and pointwise ops, attention with a
decomposed softmax, a GELU MLP, occasional dropout), a cross-entropy loss, its tangent, and
a backward made by reverse-mode rules the way autograd writes it: the gradient of ``a * b``
reads the other operand, the gradient of a matmul reads the input activation and the weight,
``tanh`` and ``exp`` read their outputs, and derivative terms that need no tangent (e.g.
``1 - tanh(x)**2``) are forward nodes the partitioner may compute in either pass, as in the
joint graph of seeds/000 Figure 2. It exists to test and benchmark the solvers on graphs of
realistic shape far larger than the captured ones.

>>> from remat.graph.synthetic import synthetic_joint_graph
>>> g = synthetic_joint_graph(2000, seed=0)
>>> 1800 <= len(g) <= 2200
True
>>> [n.name for n in g if n.is_output], [n.role for n in g if n.role == "tangent"]
(['nll_loss'], ['tangent'])
>>> sorted({n.category for n in g})
['compute', 'input', 'other', 'pointwise', 'random', 'reduction', 'view']
"""

from __future__ import annotations

import math
import random

from .graph import Graph, Node

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "bool": 1, "int64": 8}
_BACKWARD_ROLES = frozenset({"tangent", "backward"})
_NO_GRAD = frozenset({"rand", "lt", "amax"})  # outputs that carry no gradient


def synthetic_joint_graph(num_nodes: int, seed: int = 0) -> Graph:
    """A transformer-like joint forward+backward graph of about ``num_nodes`` nodes.

    Deterministic given ``seed``; the seed also draws the model shape (batch, sequence,
    width, heads, vocabulary, dtype) and, per block, the GELU form (one fused op or the
    tanh-approximation chain) and which dropouts are present. The graph has one forward
    output (the loss, ``is_output=True``), one tangent, and at least one block, so very
    small ``num_nodes`` give a graph of roughly 200 nodes.

    >>> g = synthetic_joint_graph(5000, seed=3)
    >>> g.name, abs(len(g) - 5000) < 250
    ('synthetic_5000_seed3', True)
    >>> g2 = synthetic_joint_graph(5000, seed=3)
    >>> [(n.name, n.inputs, n.bytes) for n in g] == [(n.name, n.inputs, n.bytes) for n in g2]
    True
    """
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    rng = random.Random(seed)
    cfg = {
        "B": rng.choice([2, 4, 8]),
        "S": rng.choice([256, 512, 1024]),
        "H": rng.choice([512, 768, 1024]),
        "dtype": rng.choice(["float32", "bfloat16"]),
        "V": rng.choice([32000, 50257]),
    }
    cfg["heads"] = cfg["H"] // 64
    b = _Builder(cfg["dtype"])
    B, S, H, V = cfg["B"], cfg["S"], cfg["H"], cfg["V"]

    # embedding
    tokens = b.placeholder("tokens", "input", (B, S), "int64")
    targets = b.placeholder("targets", "input", (B, S), "int64")
    wte = b.placeholder("wte", "param", (V, H))
    wpe = b.placeholder("wpe", "param", (S, H))
    emb = b.op("embedding", [wte, tokens], "other", (B, S, H), flops=0)
    pos = b.op("slice", [wpe], "view", (S, H))
    x = b.op("add", [emb, pos], "pointwise", (B, S, H))
    x = _dropout(b, x) if rng.random() < 0.5 else x

    tail = 75  # final layer norm, head, loss and the embedding's backward, both passes
    blocks = []
    backward_nodes = 0  # nodes the backward of the blocks so far will add
    while True:
        start, n0 = len(b.tape), len(b.nodes)
        x_in = x
        x = _block(b, x, cfg, rng)
        blocks.append((start, len(b.tape), x_in))
        fwd = len(b.nodes) - n0
        bwd = b.dry_run(lambda tape=b.tape[start:], out=x, x_in=x_in:
                        _backward(b, tape, b.stand_in_grad(out), x_in))
        backward_nodes += bwd
        if len(b.nodes) + backward_nodes + tail + (fwd + bwd) // 2 >= num_nodes:
            break
    # final layer norm, language-model head and cross-entropy loss
    h = _layer_norm(b, x, "ln_f")
    w_head = b.placeholder("lm_head", "param", (H, V))
    logits = b.op("mm", [h, w_head], "compute", (B, S, V), flops=2 * B * S * H * V)
    mx = b.op("amax", [logits], "reduction", (B, S, 1))
    shifted = b.op("sub", [logits, mx], "pointwise", (B, S, V))
    e = b.op("exp", [shifted], "pointwise", (B, S, V))
    se = b.op("sum", [e], "reduction", (B, S, 1))
    lse = b.op("log", [se], "pointwise", (B, S, 1))
    logp = b.op("sub", [shifted, lse], "pointwise", (B, S, V))
    b.op("nll_loss", [logp, targets], "other", (), is_output=True, name="nll_loss")
    tangent = b.placeholder("tangent", "tangent", ())

    # backward: loss and head, then the blocks in reverse, then the embedding
    end = len(b.tape)
    head_start = blocks[-1][1]
    g = _backward(b, b.tape[head_start:end], tangent, x)
    for start, stop, x_in in reversed(blocks):
        g = _backward(b, b.tape[start:stop], g, x_in)
    _backward(b, b.tape[:blocks[0][0]], g, None)
    return Graph(b.nodes, name=f"synthetic_{num_nodes}_seed{seed}")


# -- building ---------------------------------------------------------------------------------

class _Builder:
    """Emits nodes in topological order and records the forward ops on a tape."""

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.nodes: list[Node] = []
        self.info: dict[str, tuple[tuple[int, ...], str, str]] = {}  # shape, dtype, role
        self.counts: dict[str, int] = {}
        self.tape: list[tuple[str, str, tuple[str, ...]]] = []  # (kind, out, inputs)
        self.needs_grad: set[str] = set()

    def _fresh(self, base: str) -> str:
        k = self.counts.get(base, 0)
        self.counts[base] = k + 1
        return base if k == 0 else f"{base}_{k}"

    def _add(self, name, op, inputs, role, shape, dtype, category, flops, **flags) -> str:
        numel = math.prod(shape)
        self.nodes.append(Node(name, op, tuple(inputs), role=role,
                               bytes=numel * _DTYPE_BYTES[dtype], flops=float(flops),
                               category=category, shape=shape, dtype=dtype, **flags))
        self.info[name] = (shape, dtype, role)
        return name

    def placeholder(self, name: str, role: str, shape, dtype: str | None = None) -> str:
        name = self._fresh(name)
        if role == "param":
            self.needs_grad.add(name)
        return self._add(name, "placeholder", (), role, tuple(shape), dtype or self.dtype,
                         "input", 0)

    def emit(self, op: str, inputs, category: str, shape, dtype: str | None = None,
             flops: float | None = None, name: str | None = None, **flags) -> str:
        """Emit a node; its role is ``backward`` exactly when it reads a tangent-derived value."""
        role = "backward" if any(self.info[i][2] in _BACKWARD_ROLES for i in inputs) else "forward"
        shape = tuple(shape)
        if flops is None:
            flops = math.prod(shape) if category in ("pointwise", "reduction") else 0
        return self._add(self._fresh(name or op), op, inputs, role, shape, dtype or self.dtype,
                         category, flops, **flags)

    def op(self, kind: str, inputs, category: str, shape, dtype: str | None = None,
           flops: float | None = None, name: str | None = None, **flags) -> str:
        """A forward op recorded on the tape for the backward rules."""
        out = self.emit(kind, inputs, category, shape, dtype, flops, name, **flags)
        self.tape.append((kind, out, tuple(inputs)))
        if kind not in _NO_GRAD and any(i in self.needs_grad for i in inputs):
            self.needs_grad.add(out)
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info[name][0]

    def stand_in_grad(self, like: str) -> str:
        """A tangent standing in for a gradient during :meth:`dry_run` (never kept)."""
        return self._add("__dry_grad__", "placeholder", (), "tangent", self.shape(like),
                         self.dtype, "input", 0)

    def dry_run(self, fn) -> int:
        """Run ``fn``, roll back every node it emitted, and return how many there were
        (not counting one stand-in gradient)."""
        n0, counts = len(self.nodes), dict(self.counts)
        fn()
        for nd in self.nodes[n0:]:
            del self.info[nd.name]
        emitted = len(self.nodes) - n0 - 1
        del self.nodes[n0:]
        self.counts = counts
        return emitted


def _layer_norm(b: _Builder, x: str, prefix: str) -> str:
    shape = b.shape(x)
    small = shape[:-1] + (1,)
    w = b.placeholder(f"{prefix}_weight", "param", shape[-1:])
    bias = b.placeholder(f"{prefix}_bias", "param", shape[-1:])
    mean = b.op("mean", [x], "reduction", small)
    xc = b.op("sub", [x, mean], "pointwise", shape)
    sq = b.op("square", [xc], "pointwise", shape)
    var = b.op("mean", [sq], "reduction", small)
    var_eps = b.op("add_scalar", [var], "pointwise", small)
    rstd = b.op("rsqrt", [var_eps], "pointwise", small)
    norm = b.op("mul", [xc, rstd], "pointwise", shape)
    y = b.op("mul", [norm, w], "pointwise", shape)
    return b.op("add", [y, bias], "pointwise", shape)


def _linear(b: _Builder, x: str, out_features: int, prefix: str) -> str:
    shape = b.shape(x)
    w = b.placeholder(f"{prefix}_weight", "param", (shape[-1], out_features))
    bias = b.placeholder(f"{prefix}_bias", "param", (out_features,))
    out_shape = shape[:-1] + (out_features,)
    y = b.op("mm", [x, w], "compute", out_shape, flops=2 * math.prod(out_shape) * shape[-1])
    return b.op("add", [y, bias], "pointwise", out_shape)


def _dropout(b: _Builder, x: str) -> str:
    shape = b.shape(x)
    r = b.op("rand", [], "random", shape, dtype="float32", flops=math.prod(shape))
    mask = b.op("lt", [r], "pointwise", shape, dtype="bool")
    y = b.op("mul", [x, mask], "pointwise", shape)
    return b.op("mul_scalar", [y], "pointwise", shape)


def _gelu(b: _Builder, x: str, fused: bool) -> str:
    shape = b.shape(x)
    if fused:
        return b.op("gelu", [x], "pointwise", shape)
    cube = b.op("cube", [x], "pointwise", shape)  # 0.5*x*(1+tanh(c*(x+0.044715*x**3)))
    c2 = b.op("mul_scalar", [cube], "pointwise", shape)
    inner = b.op("add", [x, c2], "pointwise", shape)
    inner2 = b.op("mul_scalar", [inner], "pointwise", shape)
    th = b.op("tanh", [inner2], "pointwise", shape)
    th1 = b.op("add_scalar", [th], "pointwise", shape)
    hx = b.op("mul_scalar", [x], "pointwise", shape)
    return b.op("mul", [hx, th1], "pointwise", shape)


def _block(b: _Builder, x: str, cfg: dict, rng: random.Random) -> str:
    B, S, H, nh = cfg["B"], cfg["S"], cfg["H"], cfg["heads"]
    hd = H // nh
    # attention
    h = _layer_norm(b, x, "ln_1")
    qkv = _linear(b, h, 3 * H, "attn_qkv")
    q, k, v = (b.op("split_view", [qkv], "view", (B, nh, S, hd)) for _ in range(3))
    kt = b.op("transpose", [k], "view", (B, nh, hd, S))
    scores = b.op("bmm", [q, kt], "compute", (B, nh, S, S), flops=2 * B * nh * S * S * hd)
    scaled = b.op("mul_scalar", [scores], "pointwise", (B, nh, S, S))
    mx = b.op("amax", [scaled], "reduction", (B, nh, S, 1))
    shifted = b.op("sub", [scaled, mx], "pointwise", (B, nh, S, S))
    e = b.op("exp", [shifted], "pointwise", (B, nh, S, S))
    se = b.op("sum", [e], "reduction", (B, nh, S, 1))
    p = b.op("div", [e, se], "pointwise", (B, nh, S, S))
    if rng.random() < 0.3:
        p = _dropout(b, p)
    ctx = b.op("bmm", [p, v], "compute", (B, nh, S, hd), flops=2 * B * nh * S * S * hd)
    ctx = b.op("transpose", [ctx], "view", (B, S, nh, hd))
    ctx = b.op("view", [ctx], "view", (B, S, H))
    out = _linear(b, ctx, H, "attn_proj")
    if rng.random() < 0.2:
        out = _dropout(b, out)
    x = b.op("add", [x, out], "pointwise", (B, S, H))
    # MLP
    h = _layer_norm(b, x, "ln_2")
    f = _linear(b, h, 4 * H, "mlp_fc")
    f = _gelu(b, f, fused=rng.random() < 0.5)
    f = _linear(b, f, H, "mlp_proj")
    if rng.random() < 0.2:
        f = _dropout(b, f)
    return b.op("add", [x, f], "pointwise", (B, S, H))


# -- reverse mode -----------------------------------------------------------------------------

def _backward(b: _Builder, tape, grad_out: str, grad_target: str | None) -> str | None:
    """Emit the backward of ``tape`` given the gradient of its last output.

    Returns the gradient of ``grad_target`` (the tape's input activation), or None.
    Gradients of parameters end as backward nodes; gradients of one value from several
    users are summed with ``add`` like autograd's accumulation.
    """
    grads: dict[str, list[str]] = {tape[-1][1]: [grad_out]}
    for kind, out, ins in reversed(tape):
        if out not in grads:
            continue
        parts = grads.pop(out)
        g = parts[0]
        for extra in parts[1:]:
            g = b.emit("add", [g, extra], "pointwise", b.shape(out))
        for inp, gi in _vjp(b, kind, out, ins, g):
            if inp in b.needs_grad:
                grads.setdefault(inp, []).append(gi)
    result = None
    for value, parts in grads.items():  # params and the tape's input activation
        g = parts[0]
        for extra in parts[1:]:
            g = b.emit("add", [g, extra], "pointwise", b.shape(value))
        if value == grad_target:
            result = g
    return result


def _reduce_to(b: _Builder, g: str, like: str) -> str:
    """Sum a broadcast gradient down to the shape of ``like``."""
    if b.shape(g) == b.shape(like):
        return g
    return b.emit("sum", [g], "reduction", b.shape(like))


def _vjp(b: _Builder, kind: str, out: str, ins: tuple[str, ...], g: str):
    """(input, gradient) pairs for the inputs of one op; only inputs that need a gradient
    are asked for, so no dead backward nodes are emitted."""
    need = [i in b.needs_grad for i in ins]
    shape = b.shape(out)
    pw = "pointwise"
    if kind in ("add", "add_scalar"):
        return [(i, _reduce_to(b, g, i)) for i, n in zip(ins, need) if n]
    if kind == "sub":
        res = []
        if need[0]:
            res.append((ins[0], _reduce_to(b, g, ins[0])))
        if need[1]:
            res.append((ins[1], _reduce_to(b, b.emit("neg", [g], pw, shape), ins[1])))
        return res
    if kind == "mul":
        a, c = ins
        res = []
        if need[0]:
            res.append((a, _reduce_to(b, b.emit("mul", [g, c], pw, shape), a)))
        if need[1]:
            res.append((c, _reduce_to(b, b.emit("mul", [g, a], pw, shape), c)))
        return res
    if kind == "div":
        a, c = ins
        res = []
        if need[0]:
            res.append((a, _reduce_to(b, b.emit("div", [g, c], pw, shape), a)))
        if need[1]:
            q = b.emit("div", [out, c], pw, shape)  # forward: out / c
            gc = b.emit("neg", [b.emit("mul", [g, q], pw, shape)], pw, shape)
            res.append((c, _reduce_to(b, gc, c)))
        return res
    (x,) = ins[:1] or (None,)
    if kind == "mul_scalar":
        return [(x, b.emit("mul_scalar", [g], pw, shape))]
    if kind == "exp":
        return [(x, b.emit("mul", [g, out], pw, shape))]
    if kind == "log":
        return [(x, b.emit("div", [g, x], pw, shape))]
    if kind == "tanh":
        sq = b.emit("mul", [out, out], pw, shape)
        d = b.emit("rsub", [sq], pw, shape)
        return [(x, b.emit("mul", [g, d], pw, shape))]
    if kind == "square":
        d = b.emit("mul_scalar", [x], pw, shape)
        return [(x, b.emit("mul", [g, d], pw, shape))]
    if kind == "cube":
        d = b.emit("mul_scalar", [b.emit("square", [x], pw, shape)], pw, shape)
        return [(x, b.emit("mul", [g, d], pw, shape))]
    if kind == "rsqrt":
        d = b.emit("mul_scalar", [b.emit("pow", [out], pw, shape)], pw, shape)
        return [(x, b.emit("mul", [g, d], pw, shape))]
    if kind == "gelu":
        return [(x, b.emit("gelu_backward", [g, x], pw, shape))]
    if kind in ("mean", "sum"):
        ge = b.emit("expand", [g], "view", b.shape(x))
        if kind == "mean":
            ge = b.emit("div_scalar", [ge], pw, b.shape(x))
        return [(x, ge)]
    if kind in ("view", "transpose", "split_view", "slice"):
        return [(x, b.emit("view", [g], "view", b.shape(x)))]
    if kind in ("mm", "bmm"):
        a, w = ins
        sa, sw = b.shape(a), b.shape(w)
        res = []
        if need[0]:
            wt = b.emit("t", [w], "view", sw[:-2] + (sw[-1], sw[-2]))
            res.append((a, b.emit(kind, [g, wt], "compute", sa,
                                  flops=2 * math.prod(sa) * shape[-1])))
        if need[1]:
            if kind == "bmm":
                at_shape, contraction = sa[:-2] + (sa[-1], sa[-2]), sa[-2]
            else:
                at_shape, contraction = (sa[-1], math.prod(sa) // sa[-1]), math.prod(sa) // sa[-1]
            at = b.emit("t", [a], "view", at_shape)
            res.append((w, b.emit(kind, [at, g], "compute", sw,
                                  flops=2 * math.prod(sw) * contraction)))
        return res
    if kind == "embedding":
        w, idx = ins
        return [(w, b.emit("embedding_dense_backward", [g, idx], "other", b.shape(w)))]
    if kind == "nll_loss":
        logp, tgt = ins
        return [(logp, b.emit("nll_loss_backward", [g, logp, tgt], "other", b.shape(logp)))]
    raise AssertionError(f"no backward rule for {kind!r}")


__all__ = ["synthetic_joint_graph"]
