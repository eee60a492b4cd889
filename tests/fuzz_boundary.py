"""The boundary fuzz: random graph documents and option sets, fed to what a user calls.

A property-based fuzz (hypothesis) of remat's boundary: graph JSON as a user or a tool writes
it (valid graphs from :mod:`strategies`, then broken the ways files break: a field set to a
huge, negative, non-finite, mistyped or nested value, a key dropped or added, a node repeated,
the text truncated, deeply nested or not UTF-8) and the options a user passes
(:func:`remat.solve`'s solver, budget, time limit and solver options; ``remat.compile``'s
options). Each document goes through :func:`remat.graph.io.load_graph` and, when it loads,
:func:`remat.solve`. The property: nothing raises but remat's documented errors
(:class:`remat.RematError` and its subclasses), and nothing hangs (every solve has a time
limit of at most a second, and the test a deadline).

``tests/test_boundary_fuzz.py`` runs it with a bounded number of examples in the suite, and
long with ``REMAT_FUZZ_EXAMPLES=N``, reporting what it tried. The graph properties need no
torch (the graph layer, the budgets and the solvers are torch-free); the compile one imports it.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field

from hypothesis import strategies as st

from remat.errors import RematError
from remat.graph.io import graph_to_dict, load_graph

from strategies import joint_graphs

SOLVERS = ("auto", "mincut-conservative", "mincut-aggressive", "checkmate", "checkmate-lp",
           "checkpoint-all", "chen-sqrtn", "chen-greedy", "griewank", "magis", "swap",
           "swap-recompute", "no-such-solver")
"""What ``solver`` is drawn from: most of the registry, and one name that is not there."""

NASTY = st.one_of(
    st.integers(-2**70, 2**70), st.integers(0, 2**62), st.floats(0, 1e30), st.sampled_from([2**63, 2**63 - 1, 2**64, -1, 0, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -1e308, 1e-320]),
    st.text(max_size=8), st.booleans(), st.none(),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
"""Values a broken file may hold where a number, a name or a list was due."""

BUDGETS = st.one_of(
    st.none(), st.none(), st.floats(0.05, 1.0), st.sampled_from(["min", "0.5", "1KiB", "1GiB"]), st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 10**400),
    st.sampled_from(["min", "1e300GiB", "0.5", "60%", "512MB", "-1GiB", "abc", "", "1e-30",
                     "150%", "nanGiB", "infB", "1_000", "0", "1KiB", "10**400"]),
    st.booleans(), st.lists(st.integers(), max_size=2),
)

TIME_LIMITS = st.one_of(st.none(), st.floats(0, 1.0), st.sampled_from([-1.0, math.nan, math.inf, "1", True, 10**400]))

OPTION_VALUES = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.booleans(), st.none(),
                          st.text(max_size=4), st.sampled_from([1e300, -1e300, 2**70]))
OPTION_NAMES = st.sampled_from(["threads", "tie_break", "max_overhead", "mode", "fission", "bandwidth",
                                "rounding", "segments", "no_such_option", "headroom"])
SOLVER_OPTIONS = st.one_of(st.just({}), st.just({}), st.just({}), st.dictionaries(OPTION_NAMES, OPTION_VALUES, max_size=2),
                           st.sampled_from([[1], "threads=1", 3, None]))


@st.composite
def documents(draw) -> dict | list | str:
    """A graph document: remat's JSON of a random valid joint graph, broken (or not) at random."""
    g = draw(joint_graphs(max_nodes=10))
    doc = graph_to_dict(g)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        kind = draw(st.sampled_from(("value", "value", "value", "drop", "add", "repeat", "meta",
                                     "top", "shape", "empty", "inputs")))
        nodes = doc.get("nodes") if isinstance(doc, dict) else None
        if not isinstance(nodes, list) or not nodes:
            break
        k = draw(st.integers(0, len(nodes) - 1))
        node = nodes[k]
        keys = sorted(node) if isinstance(node, dict) else []
        if kind == "value" and keys:
            node[draw(st.sampled_from(keys + ["bytes", "flops", "cost"]))] = draw(NASTY)
        elif kind == "drop" and keys:
            node.pop(draw(st.sampled_from(keys)))
        elif kind == "add" and isinstance(node, dict):
            node[draw(st.text(min_size=1, max_size=5))] = draw(NASTY)
        elif kind == "repeat":
            nodes.append(json.loads(json.dumps(node)))
        elif kind == "meta" and isinstance(node, dict):
            depth = draw(st.sampled_from([1, 40, 200]))
            value: object = 1
            for _ in range(depth):
                value = {"x": value}
            node["meta"] = value
        elif kind == "top":
            key = draw(st.sampled_from(["format", "version", "name", "nodes", "meta"]))
            doc[key] = draw(NASTY)
        elif kind == "shape" and isinstance(node, dict):
            node["shape"] = draw(st.lists(st.sampled_from([-1, 0, 3, 2**62, 2**80, 1.5, "x"]), max_size=4))
        elif kind == "empty":
            doc["nodes"] = []
        elif kind == "inputs" and isinstance(node, dict):
            node["inputs"] = draw(st.sampled_from([[node.get("name")], "a", [1], None, ["nowhere"]]))
    return doc


@st.composite
def texts(draw) -> bytes:
    """The bytes of a graph file: a document's JSON, possibly truncated, wrapped in deep
    nesting, given a non-finite number or not UTF-8."""
    doc = draw(documents())
    text = json.dumps(doc, allow_nan=True).encode()
    how = draw(st.sampled_from(("as is",) * 5 + ("truncate", "nest", "latin1", "nan", "garbage")))
    if how == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif how == "nest":
        depth = draw(st.sampled_from([100, 5000, 100_000]))
        text = b"[" * depth + text + b"]" * depth
    elif how == "latin1":
        text = text.replace(b'"', b'"\xe9', 1)
    elif how == "nan":
        text = text.replace(b'"bytes": 0', b'"bytes": NaN', 1).replace(b'"flops": 0', b'"flops": Infinity', 1)
    elif how == "garbage":
        text = draw(st.binary(max_size=64))
    return text


@dataclass
class Tally:
    """What a fuzz run tried and saw: documents, how many loaded and planned, each error class
    remat raised (by name), and the escapes (anything else: the findings)."""

    documents: int = 0
    loaded: int = 0
    planned: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    findings: list[str] = field(default_factory=list)
    slowest: float = 0.0


@contextlib.contextmanager
def _judged(tally: Tally, stage: list, about: str):
    """Counts what the body raises into ``tally``: a :class:`remat.RematError` by class (the
    documented answer), anything else as a finding, raised again as an AssertionError naming it
    with ``about``. ``stage[0]`` names the call the body is in."""
    t0 = time.perf_counter()
    tally.documents += 1
    try:
        yield
    except RematError as e:
        tally.errors[f"{stage[0]}: {type(e).__name__}"] += 1
    except Exception as e:  # noqa: BLE001 - the finding
        what = f"{stage[0]} raised {type(e).__name__}: {str(e)[:200]} ({about:.600})"
        tally.findings.append(what)
        raise AssertionError(what) from e
    finally:
        tally.slowest = max(tally.slowest, time.perf_counter() - t0)


def _solve(graph, solver, budget, time_limit, options, tally: Tally) -> None:
    import remat

    kwargs = options if isinstance(options, dict) else {"solver_options": options}
    remat.solve(graph, solver, budget=budget, time_limit=time_limit, **kwargs)
    tally.planned += 1


def check_document(text: bytes, solver, budget, time_limit, options, tally: Tally | None = None) -> None:
    """The property for one file and one set of options: load it, plan it; anything raised
    must be a :class:`remat.RematError`. Raises AssertionError naming what escaped."""
    tally = tally if tally is not None else Tally()
    about = f"solver={solver!r}, budget={budget!r}, time_limit={time_limit!r}, options={options!r}"
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "wb") as f:
        f.write(text)
    stage = ["load_graph"]
    try:
        with _judged(tally, stage, about):
            g = load_graph(path)
            tally.loaded += 1
            stage[0] = "solve"
            _solve(g, solver, budget, time_limit, options, tally)
    finally:
        os.unlink(path)


def check_compile_options(kwargs: dict, tally: Tally | None = None) -> None:
    """``remat.compile``'s options as a user may pass them: checked when ``remat.compile`` is
    called (no model runs, nothing compiles), and anything wrong is a :class:`remat.RematError`."""
    import remat

    tally = tally if tally is not None else Tally()
    with _judged(tally, ["compile"], repr(kwargs)):
        remat.compile(_identity, **kwargs)
        tally.planned += 1  # accepted


def _identity(x):
    return x


COMPILE_OPTIONS = st.fixed_dictionaries({}, optional={
    "solver": st.sampled_from(SOLVERS), "budget": BUDGETS, "time_limit": TIME_LIMITS,
    "strict": st.one_of(st.booleans(), st.integers(0, 2)), "compiler": st.sampled_from(["eager", "inductor", "x"]),
    "solver_options": SOLVER_OPTIONS, "cache": st.one_of(st.booleans(), st.none()),
    "outputs": st.sampled_from(["kept", "dropped", "x"]), "offload": st.one_of(st.booleans(), st.integers()),
    "bandwidth": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 2**70)),
    "verbose": st.booleans(), "max_overhead": st.one_of(st.none(), OPTION_VALUES),
    "no_such_option": st.integers(),
})


@st.composite
def extreme_graphs(draw):
    """A valid joint graph whose sizes and costs are drawn up to the bounds remat accepts
    (:mod:`remat.graph.limits`): the arithmetic of every solver must hold there."""
    from remat.graph.limits import MAX_NODE_BYTES, MAX_TOTAL_BYTES, MAX_WORK

    g = draw(joint_graphs(max_nodes=12))
    scale = draw(st.sampled_from([1, 2**20, 2**40, MAX_NODE_BYTES // 24, MAX_NODE_BYTES]))
    work = draw(st.sampled_from([0.0, 1.0, 1e12, MAX_WORK]))
    nodes = []
    for n in g.nodes:
        nbytes = min(n.bytes * scale, MAX_NODE_BYTES, MAX_TOTAL_BYTES // max(1, len(g)))  # within both bounds
        cost = draw(st.sampled_from([None, None, 0.0, work]))
        nodes.append(n.replace(bytes=nbytes, flops=draw(st.sampled_from([0.0, work])), cost=cost))
    return g.replace_nodes(nodes)


def check_solve(graph, solver, budget, time_limit, options, tally: Tally | None = None) -> None:
    """The property for a graph that loads: :func:`remat.solve` raises nothing but remat's
    errors, whatever the solver, budget, time limit and options."""
    tally = tally if tally is not None else Tally()
    about = (f"solver={solver!r}, budget={budget!r}, time_limit={time_limit!r}, options={options!r}, "
             f"graph={[vars(n) for n in graph.nodes]!r}")
    with _judged(tally, ["solve"], about):
        tally.loaded += 1
        _solve(graph, solver, budget, time_limit, options, tally)

