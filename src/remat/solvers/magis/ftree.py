"""The F-Tree: the fission regions worth trying, and the rules that change which run (seeds/004
Section 4.3, Algorithm 1, and Section 5.1, Figure 7).

:func:`ftree` builds it: for each large component of the dimension graph
(:mod:`remat.graph.dims`), the dominator tree ``T`` of the sub-graph the component induces
(both phases: a region may hold forward nodes the backward computes again); each node's *heat* is the size of the memory hot spots
(values resident at the simulated peak) it dominates, and its *score* (Eq. 3-4, n = 2)
``(1 - 1/2) heat(v) - sum of the region's inputs that are not hot`` (inputs and
parameters, resident throughout, do not count). Scores are cut into ``L``
bands (default 4); in each band, the lowest dominators (none of whose descendants is in the
band) give a candidate region, ``T.des(v)`` minus ``v`` (the dominator is the region's input),
kept if :func:`~remat.transforms.fission.illegal` finds nothing wrong with it split in two.
Candidates nest (dominator sub-trees do): each has its smallest container as parent.

A state of the tree is the number of parts of each candidate (1: disabled). :func:`mutations`
are the paper's rules: *enable* (two or more parts on a candidate none of whose ancestors or
descendants is enabled, and which shares no node with an enabled one), *lift* (disable one and
enable its parent, which must then have no other enabled descendant), *disable*, and *change
n* (the next divisor of the length up or down). At most one candidate on any path of the tree
runs split (MAGIS's released code: ``height_limit=1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import networkx as nx

from ...graph.dims import Component, axis_length, dim_graph, label_side, links
from ...graph.fission import Fission
from ...graph.graph import Graph
from ...transforms.fission import MAX_PARTS, fission, illegal
from ...errors import PlanError

LEVELS = 4
"""L, the score bands of Algorithm 1 (seeds/004 Section 7.1: L = 4 works best)."""

COMPONENT_SHARE = 0.5
"""Components with fewer nodes than this share of the largest are skipped (MAGIS's code),
except the :data:`MIN_COMPONENTS` largest."""

MIN_COMPONENTS = 3

UP = 2
"""How many dominators above a band's lowest one also give candidate regions."""

_ROOT = "\0root"


@dataclass(frozen=True)
class FTree:
    """Candidate regions (``n`` = 1 each) and each one's smallest containing candidate
    (``parent``, -1 at a root)."""

    candidates: tuple[Fission, ...]
    parent: tuple[int, ...]
    notes: tuple[str, ...] = ()  # why a dimension stops where users might expect a region

    def __len__(self) -> int:
        return len(self.candidates)

    def ancestors(self, i: int) -> list[int]:
        out = []
        while self.parent[i] >= 0:
            i = self.parent[i]
            out.append(i)
        return out

    def fissions(self, ns: tuple[int, ...]) -> list[Fission]:
        """The enabled fissions of state ``ns``, numbered in order (their slice names)."""
        chosen = [self.candidates[i].with_n(n) for i, n in enumerate(ns) if n > 1]
        return [f.with_index(k) for k, f in enumerate(chosen)]


def divisors(length: int) -> list[int]:
    """The part counts a dimension of ``length`` allows, above 1 and at most MAX_PARTS."""
    return [d for d in range(2, min(length, MAX_PARTS) + 1) if length % d == 0]


def ftree(g: Graph, hot: set[str], levels: int = LEVELS) -> FTree:
    """Algorithm 1 on ``g`` with hot spots ``hot`` (node names resident at the peak)."""
    dg = dim_graph(g)
    comps = dg.components
    notes = batch_statistics(g)
    if not comps:
        return FTree((), (), notes)
    largest = len(comps[0].axis)
    found: list[Fission] = []
    seen: set[tuple[str, ...]] = set()
    for rank, comp in enumerate(comps):
        if rank >= MIN_COMPONENTS and len(comp.axis) < COMPONENT_SHARE * largest:
            continue
        for f in _candidates(g, comp, hot, levels):
            if f.nodes not in seen:
                seen.add(f.nodes)
                found.append(f.with_index(len(found)))
    return FTree(tuple(found), _parents(found), notes)


def batch_statistics(g: Graph) -> tuple[str, ...]:
    """Where the batch cannot be split: each training-mode batch norm (its statistics are a
    reduction over the batch, as ``var_mean`` over dims 0, 2, 3 once decomposed, so capture
    links no batch axis through it), named by its module."""
    out: dict[str, None] = {}
    for n in g.nodes:
        if n.role != "forward" or not n.inputs:
            continue
        op = n.op.split(".", 1)[0]
        if op in ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"):
            stats = True
        elif op in ("var_mean", "var") and g[n.inputs[0]].shape and len(g[n.inputs[0]].shape) >= 3:
            kept = {i for u, i, a in links(n) if u == n.inputs[0] and a >= 0}
            stats = 0 not in kept and 1 in kept  # over the batch, per channel: a batch norm's
        else:
            stats = False
        if stats:
            where = n.meta.get("module") or n.name
            out[f"the batch is not split across {where}: a training-mode batch norm needs the "
                "whole batch's statistics (eval mode, GroupNorm and LayerNorm split)"] = None
    return tuple(out)


def _candidates(g: Graph, comp: Component, hot: set[str], levels: int) -> list[Fission]:
    members = [v for v in comp.axis if g[v].role == "tangent" or (
        g[v].op != "placeholder" and g[v].category != "random" and "dims" in g[v].meta)]
    if len(members) < 2:
        return []
    inside = set(members)
    dg = nx.DiGraph()
    dg.add_nodes_from(members)
    dg.add_node(_ROOT)
    # a tangent is the gradient of the step's outputs: for dominance it comes after them, so
    # that the backward hangs below the forward that it differentiates (also where a node
    # reads a tangent outside the component, or a scalar computed from one: a mean loss's
    # gradient over its count). "Them": the members the step's forward outputs are computed
    # from outside the component (a scalar loss has no axis: the sums it divides are members)
    outputs = _feeding_outputs(g, inside)
    # one entry, as MAGIS's dominators have: the largest input; what only the others (labels,
    # and the label-side values computed whole before any region) reach is left out of the
    # tree, so that it does not cut the main path's dominance
    inputs = sorted((n for n in g.nodes if n.role == "input"), key=lambda n: (-n.bytes, g.index(n.name)))
    side = {n.name for n in inputs[1:]} | label_side(g)
    for v in members:
        if g[v].role == "tangent":
            preds = outputs
        else:
            preds = [u for u in g[v].inputs if u in inside]
            if any(u not in inside and _scalar_gradient(g[u]) for u in g[v].inputs):
                preds += outputs
        dg.add_edges_from((u, v) for u in preds)
        if not preds and not (side and side.intersection(g[v].inputs)):
            dg.add_edge(_ROOT, v)
    idom = nx.immediate_dominators(dg, _ROOT)
    children: dict[str, list[str]] = {v: [] for v in members}
    for v in members:
        d = idom.get(v)
        if d is not None and d != _ROOT and d != v:
            children[d].append(v)
    des = _descendants(members, children, g)
    resident = _resident(g)  # inputs and parameters (and their views) stay resident anyway
    n = 2
    score: dict[str, float] = {}
    apart = [v for v in members if v not in idom]  # reached only from labels: not in the tree
    regions = {v: _absorb(g, {w for w in des[v] if w != v and g[w].role != "tangent"}, apart, inside)
               for v in members}
    for v in members:
        sub = regions[v]
        if not sub:
            continue
        heat = sum(g[w].bytes for w in sub if w in hot)
        ins = {u for w in sub for u in g[w].inputs if u not in sub and u not in resident}
        score[v] = (1 - 1 / n) * heat - sum(g[u].bytes for u in ins if u not in hot)
    if not score:
        return []
    smax = max(score.values())
    if smax <= 0:
        return []
    out = []
    for i in range(1, levels + 1):
        band = {v for v, s in score.items() if i / levels <= s / smax < (i + 1) / levels}
        for v in sorted(band, key=g.index):
            if any(w in band for w in des[v] if w != v):
                continue
            # also with the dominator itself, and its own dominators a few steps up: the
            # producer of the largest value (an LM head's logits, read only by the loss)
            # must be in the region for it to be computed in parts
            bases = []
            chain = _up(v, idom, members, len(members))
            same = [u for u in chain if u in band]  # the band's whole span above v, too: its
            for u in dict.fromkeys(chain[:UP + 1] + same[-1:]):  # inputs are then the band's
                bases.append((regions[u], f"{comp.id}:{u}"))
                if g[u].role != "tangent" and any(b == comp.axis[u] for _, _, b in links(g[u])):
                    bases.append((regions[u] | {u}, f"{comp.id}:{u}+"))
            for nodes, label in (x for base in bases for x in _finer(g, comp, *base)):
                try:
                    f = fission(g, comp, nodes, 1, label=label)
                except PlanError:
                    continue
                ds = divisors(f.length)
                if ds and illegal(g, f.with_n(ds[0])) is None:
                    out.append(f)
    return out


def _up(v: str, idom: dict, members: list[str], steps: int) -> list[str]:
    """``v`` and its dominators up to ``steps`` above it, members of the component."""
    chain = [v]
    inside = set(members)
    while len(chain) <= steps:
        d = idom.get(chain[-1])
        if d is None or d == chain[-1] or d not in inside:
            break
        chain.append(d)
    return chain


def _absorb(g: Graph, region: set[str], apart: list[str], inside: set[str]) -> set[str]:
    """``region`` with the members outside the dominator tree (computed from labels only, such
    as cross-entropy's one-hot of the targets in its backward) whose every reader in the
    component is in it: they are split with their readers, their label inputs sliced."""
    if not region or not apart:
        return region
    out = set(region)
    for v in reversed(apart):  # readers first
        readers = [w.name for w in g.users(v) if w.name in inside]
        if readers and all(w in out for w in readers):
            out.add(v)
    return out


def _finer(g: Graph, comp: Component, region: set[str], label: str):
    """``region``, then for each longer axis length L among its nodes, the nodes whose axis
    length is a multiple of L: a region of the tokens (B*T) without the batch-shaped (B) nodes
    around it splits into more parts than the batch has (an LM head and its loss)."""
    yield region, label
    lengths = {v: axis_length(g, v, comp.axis[v]) or comp.length for v in region}
    for length in sorted(set(lengths.values()) - {min(lengths.values())}, reverse=True):
        nodes = {v for v, x in lengths.items() if x % length == 0}
        if len(nodes) >= 2:
            yield nodes, f"{label}/{length}"


def _feeding_outputs(g: Graph, inside: set[str]) -> list[str]:
    """The forward members of a component that the step's forward outputs read, directly or
    through forward nodes outside it."""
    todo = [n.name for n in g.nodes if n.is_output and n.is_forward]
    seen = set(todo)
    found = []
    while todo:
        v = todo.pop()
        if v in inside:
            found.append(v)
            continue
        for u in g[v].inputs:
            if u not in seen and g[u].is_forward:
                seen.add(u)
                todo.append(u)
    return sorted(found, key=g.index)


def _scalar_gradient(node) -> bool:
    """A tangent, or a backward value of one element (a scalar loss's gradient, divided by its
    count): every part of a region reads it whole."""
    if node.role == "tangent":
        return True
    return node.role == "backward" and (not node.shape or prod(node.shape) == 1)


def _resident(g: Graph) -> set[str]:
    primal = {n.name for n in g.nodes if n.is_primal}
    return primal | {n.name for n in g.nodes if n.meta.get("alias_of") in primal}


def _descendants(members: list[str], children: dict[str, list[str]], g: Graph) -> dict[str, set[str]]:
    """Each node's dominator sub-tree (itself included), children before parents."""
    des: dict[str, set[str]] = {}
    has_parent = {c for cs in children.values() for c in cs}
    for root in (v for v in members if v not in has_parent):
        stack = [(root, False)]
        while stack:
            v, expanded = stack.pop()
            if expanded:
                des[v] = {v}.union(*(des[c] for c in children[v]))
            else:
                stack.append((v, True))
                stack.extend((c, False) for c in children[v])
    return des


def _parents(found: list[Fission]) -> tuple[int, ...]:
    sets = [frozenset(f.nodes) for f in found]
    parent = []
    for i, s in enumerate(sets):
        holders = [j for j, t in enumerate(sets) if j != i and s < t]
        parent.append(min(holders, key=lambda j: len(sets[j])) if holders else -1)
    return tuple(parent)


def mutations(tree: FTree, ns: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The states one rule away from ``ns``: (rule name, new state), in a fixed order."""
    out: list[tuple[str, tuple[int, ...]]] = []
    on = [i for i, n in enumerate(ns) if n > 1]
    busy = set().union(*(tree.candidates[i].nodes for i in on)) if on else set()

    def with_(changes: dict[int, int]) -> tuple[int, ...]:
        return tuple(changes.get(i, n) for i, n in enumerate(ns))

    for i, f in enumerate(tree.candidates):
        ds = divisors(f.length)
        if ns[i] == 1:
            if not busy.intersection(f.nodes) and ds:
                out.append((f"enable {f.label}", with_({i: ds[0]})))
            continue
        out.append((f"disable {f.label}", with_({i: 1})))
        k = ds.index(ns[i]) if ns[i] in ds else -1
        if k + 1 < len(ds):
            out.append((f"more parts {f.label}", with_({i: ds[k + 1]})))
        if k > 0:
            out.append((f"fewer parts {f.label}", with_({i: ds[k - 1]})))
        p = tree.parent[i]
        if p >= 0:
            lifted = {j: 1 for j in on if set(tree.candidates[j].nodes) <= set(tree.candidates[p].nodes)}
            others = busy - set().union(*(tree.candidates[j].nodes for j in lifted))
            if not others.intersection(tree.candidates[p].nodes):
                lifted[p] = max(2, min(ns[i], tree.candidates[p].length))
                if tree.candidates[p].length % lifted[p] == 0:
                    out.append((f"lift {f.label}", with_(lifted)))
    return out
