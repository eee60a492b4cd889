"""Plans cached across runs: a second process that plans the same graph with the same options
loads the plan instead of solving again (no torch, no pickle).

A cache entry is one JSON file per key, ``<key>.json`` in the cache directory::

    {"format": "remat-plan-cache", "version": 3, "key": "<sha256>", "graph_hash": "<sha256>",
     "remat": "0.2.0", "budget": {"kind": "fraction", "value": 0.5, "planned_bytes": 123456},
     "plan": {<Plan.to_dict(), "remat.plan" version 4>},
     "out_of_reach": {"message": "...", "smallest_feasible": 234567}}

``budget`` is the budget the plan was made for (null: none); an entry that records another
than the one asked is not served. ``out_of_reach`` is there only when that budget was out of
reach and the step ran another plan instead (its least memory: a fraction is a target), which
is the plan stored: a later run that asks for the same fraction gets it at once, with the same
warning, instead of searching again.

The **key** (:func:`cache_key`) is a sha256 over canonical JSON (sorted keys, no Python hash
anywhere, so it is the same in every process and under every ``PYTHONHASHSEED``) of:

- the cache format version, remat's version and a hash of the planner's source (every module
  of the :data:`PLANNER` packages, sub-packages such as ``solvers/magis`` included, and the
  top-level modules: :func:`source_hash`) and the versions of the numerical libraries the
  solvers call (numpy, scipy, ortools, highspy): a new remat or a changed solver never reads an
  old plan;
- the graph (:func:`graph_hash`): every node in the graph's topological order with every
  field of :class:`~remat.graph.Node` (name, op, inputs, role, bytes, flops, category,
  profiled cost, shape, dtype, fusible and the other flags) and its whole ``meta`` (sorted;
  capture's ``alias_of``, ``container`` and ``module`` are there). The graph's *name* is not:
  two identical graphs under different names (the same model compiled again in one process,
  or under another label) share an entry, and a hit carries the asking graph's name. The
  graph's own ``meta`` (facts about the whole graph, such as symbolic sizes) is covered too;
- the solver's name, the budget (its kind and value as the user wrote it, and the bytes the
  solver plans within), the headroom, the time limit, the solver's options and the cost
  model (its class and its device profile), and the profile's
  :func:`~remat.cost.profiles.profile_key`: a plan made for an H100 is never served to a step
  planned for this CPU, nor for another GPU.

Reading an entry checks it before use: a file that cannot be read or parsed for any reason
(:func:`read_json_file`: not UTF-8, not JSON, nested too deeply, too large), has another
format or version, another key or budget, or whose plan does not load against the graph (a node it names is not
in the graph, a saved value differs, or its schedule, replayed in the simulator, is invalid,
over the budget or peaks elsewhere than when it was stored; a plan with fissions is loaded
against the graph split as it says, which the caller builds) is ignored with a
:class:`~remat.errors.RematCacheWarning` and deleted; the next :meth:`PlanCache.put` writes it
again. Nothing a cache file holds ever raises or stops planning. Writes
are atomic (a temporary file in the same directory, then ``os.replace``), so processes that
plan the same graph at once (DDP ranks) never read half a file.

The directory (:func:`default_directory`) is ``$REMAT_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/remat/plans`` (``~/.cache/remat/plans``); ``REMAT_CACHE_DIR=off`` (or
``cache=False``) turns the cache off. The device measurements remat stores
(:mod:`remat.cost.probes`) live beside it, in ``probes``, and the same ``off`` turns them off.

:func:`remat.solvers.cached.cached_solve` is :func:`remat.solve` through this cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..cost import probes
from ..cost.model import CostModel, default_cost_model
from ..cost.profiles import profile_key
from ..errors import PlanError, RematCacheWarning
from ..graph.fission import Fission
from ..graph.graph import Graph, Node
from .budget import Budget
from .outcome import OutOfReach
from .plan import Plan, _saved_value

CACHE_FORMAT = "remat-plan-cache"
CACHE_VERSION = 4
"""Bumped whenever the layout of an entry or what the key covers changes (2: plans of version
3, with fissions, swaps and the link as fields of their own; 3: the budget an entry was planned
for, and the plan run where that budget was out of reach; 4: the device profile's key,
:func:`remat.cost.profiles.profile_key`). It is part of the key, so an
entry of another version is never looked up; one found under a key anyway is ignored with a
warning."""

# $REMAT_CACHE_DIR and the values that turn the cache off: one setting for the plans and the
# device measurements stored beside them (remat.cost.probes)
ENV, OFF = probes.ENV, probes.OFF

_LIBRARIES = ("numpy", "scipy", "ortools", "highspy")
_CACHE_FIELDS = ("cache", "cache_file")
"""The plan's fields that say how it went through the cache: not stored."""
_CACHE_DETAILS = ("cache_seconds", "cached_solve_seconds")


class Uncacheable(ValueError):
    """A graph or an option that has no canonical JSON form (an arbitrary object): the plan is
    made without the cache."""


# -- canonical hashing ----------------------------------------------------------------------
def _canonical(x: Any) -> Any:
    """``x`` as plain JSON values, the same in every process; :class:`Uncacheable` if it has
    no such form."""
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)
    if isinstance(x, (list, tuple)):
        return [_canonical(v) for v in x]
    if isinstance(x, (dict, Mapping)):
        out = {}
        for k, v in x.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise Uncacheable(f"a key {k!r} of type {type(k).__name__}")
            out[str(k)] = _canonical(v)
        return out
    if isinstance(x, (set, frozenset)):
        return sorted((_canonical(v) for v in x), key=_dumps)
    if hasattr(x, "item") and callable(x.item) and not isinstance(x, (bytes, bytearray)):
        try:  # numpy scalars
            return _canonical(x.item())
        except (TypeError, ValueError):
            pass
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"__class__": f"{type(x).__module__}.{type(x).__qualname__}",
                **{f.name: _canonical(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    raise Uncacheable(f"a value {x!r} of type {type(x).__name__}")


def _dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha256(x: Any) -> str:
    return hashlib.sha256(_dumps(x).encode()).hexdigest()


_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(Node))


_PLAIN = (str, int, bool, type(None))


def _node_record(n: Node) -> list:
    out = []
    for name in _NODE_FIELDS:
        v = getattr(n, name)
        if name in ("flops", "cost") and v is not None and not isinstance(v, bool):
            v = float(v)  # 0 from a JSON file and 0.0 from capture are the same graph
        if type(v) in _PLAIN:
            out.append(v)
        elif type(v) is tuple and all(type(x) in _PLAIN for x in v):
            out.append(list(v))  # inputs, shape
        elif type(v) is dict and all(type(k) is str and type(x) in _PLAIN for k, x in v.items()):
            out.append(v)  # meta as capture writes it (json sorts its keys)
        else:
            out.append(_canonical(v))
    return out


def graph_hash(g: Graph) -> str:
    """sha256 of every node of ``g`` in topological order, every field of
    :class:`~remat.graph.Node` and its ``meta`` included, and the graph's own ``meta`` where it
    has one; not the graph's name. Raises :class:`Uncacheable` when a ``meta`` value has no
    JSON form.

    >>> from remat.graph.examples import cos_cos_graph
    >>> g = cos_cos_graph()
    >>> graph_hash(g) == graph_hash(Graph(g.nodes, name="another name"))
    True
    >>> n = g.nodes[-1]
    >>> graph_hash(g) == graph_hash(g.replace_nodes([*g.nodes[:-1], n.replace(bytes=n.bytes + 1)]))
    False
    """
    def compute(g: Graph) -> str:
        return _sha256({"fields": list(_NODE_FIELDS), "nodes": [_node_record(n) for n in g.nodes],
                        "meta": _canonical(getattr(g, "meta", None) or {})})

    return g._derived("cache.graph_hash", compute)


PLANNER = ("graph", "cost", "plans", "solvers", "transforms", "data")
"""The packages whose source decides a plan: every one a solver imports (the transforms swap,
search and re-ordering call included)."""


def source_hash(root: Path, packages: Iterable[str] = PLANNER) -> str:
    """sha256 of the top-level modules (``root/*.py``: the errors, the API) and every ``.py``
    file under ``root/PACKAGE`` for each package, names and contents: remat's one fingerprint of its own source (the plan cache's
    over :data:`PLANNER`; the partitioner's over every package, lowering included)."""
    h = hashlib.sha256()
    files = sorted(root.glob("*.py")) + [p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))]
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def planner_fingerprint() -> str:
    """remat's version, a hash of the planner's source (:data:`PLANNER`) and the numerical
    libraries' versions: what must match for a stored plan to be the plan this remat would
    make."""
    source = source_hash(Path(__file__).resolve().parents[1])
    return _sha256({"remat": _version("remat"), "source": source,
                    "libraries": {lib: _version(lib) for lib in _LIBRARIES}})


def _version(package: str) -> str | None:
    """An installed package's version (remat's own from its metadata: no import of the
    top-level package from here), or None."""
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cache_key(graph: Graph, solver: str, *, budget: Budget | str | float | None = None,
              cost_model: CostModel | None = None, time_limit: float | None = None,
              headroom: float = 0.0, options: Mapping[str, Any] | None = None) -> str:
    """The key of the plan ``solve(graph, solver, budget=..., ...)`` makes (see the module's
    docstring for what it covers). Raises :class:`Uncacheable` for an option with no JSON
    form, and :class:`~remat.errors.BudgetError` for a budget remat cannot read."""
    parsed = budget if budget is None or isinstance(budget, Budget) else Budget.parse(budget)
    cm = cost_model or default_cost_model(graph)
    return _sha256({
        "format": CACHE_FORMAT, "version": CACHE_VERSION, "planner": planner_fingerprint(),
        "graph": graph_hash(graph), "solver": str(solver),
        "budget": budget_record(parsed, graph, headroom),
        "headroom": float(headroom), "time_limit": None if time_limit is None else float(time_limit),
        "options": _canonical(dict(options or {})),
        "cost_model": {"class": f"{type(cm).__module__}.{type(cm).__qualname__}", **_canonical(cm)},
        "profile": profile_key(cm.device),
    })


# -- the store ------------------------------------------------------------------------------
def write_json_atomically(path: Path, value: Any, **dump: Any) -> None:
    """``value`` as JSON at ``path``, written to a temporary file beside it and renamed over it,
    so a reader never sees half a file (``dump``: :func:`json.dump`'s options). Raises what
    writing raises (OSError; TypeError or ValueError for a value with no JSON form) and leaves
    no temporary file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, allow_nan=False, **dump)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise



MAX_FILE_BYTES = 1 << 30
"""The largest cache file remat reads (1 GiB; a plan of a 100k-node graph takes about 15 MB):
a larger one is treated as corrupt."""


def read_json_file(path: Path) -> tuple[Any, str | None]:
    """What the JSON file at ``path`` holds, for a cache: ``(value, None)``; ``(None, None)``
    when there is no file; ``(None, why)`` when it cannot be read or parsed, for whatever
    reason (unreadable, larger than :data:`MAX_FILE_BYTES`, not UTF-8, not JSON, nested too
    deeply): a cache file never raises, it is only ignored and replaced."""
    try:
        if not path.exists():
            return None, None
        if not path.is_file():
            return None, "it is not a regular file"
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            return None, f"it is larger than {MAX_FILE_BYTES} bytes"
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as e:
        return None, f"it cannot be read ({e})"
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as e:
        return None, f"it is not UTF-8 text ({e.reason} at byte {e.start})"
    except RecursionError:
        return None, "it is nested too deeply to be JSON remat wrote"
    except ValueError as e:  # json.JSONDecodeError, or an integer of too many digits
        return None, f"it is not JSON ({e})"
    except Exception as e:  # noqa: BLE001 - whatever the file holds, the cache only ignores it
        return None, f"it cannot be parsed ({type(e).__name__}: {e})"


def default_directory() -> Path | None:
    """``$REMAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/remat/plans`` or ``~/.cache/remat/plans``;
    None when ``$REMAT_CACHE_DIR`` is ``off`` (or ``0``, ``false``, ``no``, ``none``)."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return None if env.lower() in OFF else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return Path(base).expanduser() / "remat" / "plans" if base else Path.home() / ".cache" / "remat" / "plans"


class PlanCache:
    """Plans stored as JSON files, one per key, in ``directory`` (created on the first
    :meth:`put`)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    @classmethod
    def default(cls) -> "PlanCache | None":
        """The cache at :func:`default_directory`, or None when it is turned off."""
        d = default_directory()
        return None if d is None else cls(d)

    def path(self, key: str) -> Path:
        if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
            raise ValueError(f"a cache key is a sha256 in hex, not {key!r}")
        return self.directory / f"{key}.json"

    def __repr__(self) -> str:
        return f"PlanCache({str(self.directory)!r})"

    def get(self, key: str, graph: Graph, *, budget: float | None = None,
            cost_model: CostModel | None = None,
            split: Callable[[Graph, Sequence[Fission]], Graph] | None = None,
            planned_for: Mapping[str, Any] | None = None) -> Plan | None:
        """The plan stored under ``key``, loaded against ``graph`` and judged by the simulator
        (against ``budget`` bytes, under ``cost_model``); None when there is none. A plan with
        fissions is loaded against ``split(graph, fissions)``
        (:func:`remat.transforms.fission.apply_fissions`, which the caller hands in: the cache
        sits below the transforms); without ``split`` such a plan is not served.
        ``planned_for``: the budget the entry must record (:func:`budget_record`); an entry
        stored for another is not served. An entry stored for a budget out of reach
        (``out_of_reach`` in :meth:`put`) holds the plan that ran instead, judged at its own
        peak; it comes back with ``plan.out_of_reach``. An entry that cannot be used,
        for any reason, is ignored with a :class:`~remat.errors.RematCacheWarning` and
        deleted: the next :meth:`put` replaces it, and planning goes on."""
        path = self.path(key)
        entry, why = read_json_file(path)
        if why is not None:
            return self._ignore(path, why)
        if entry is None:
            return None
        try:
            return self._load(path, entry, key, graph, budget, cost_model, split, planned_for)
        except Exception as e:  # noqa: BLE001 - a cache entry never takes planning down
            return self._ignore(path, f"its plan cannot be loaded ({type(e).__name__}: {e})")

    def _load(self, path: Path, entry: Any, key: str, graph: Graph, budget: float | None,
              cost_model: CostModel | None, split, planned_for) -> Plan | None:
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
            return self._ignore(path, f"it is not a remat plan cache entry (no \"format\": \"{CACHE_FORMAT}\")")
        if entry.get("version") != CACHE_VERSION:
            return self._ignore(path, f"it has version {entry.get('version')!r}; this remat reads "
                                      f"version {CACHE_VERSION}")
        if entry.get("key") != key:
            return self._ignore(path, "it holds another key")
        try:
            ghash = graph_hash(graph)
        except Uncacheable:
            return None
        if entry.get("graph_hash") != ghash:
            return self._ignore(path, "it was stored for another graph")
        if planned_for is not None and entry.get("budget") != _canonical(dict(planned_for)):
            return self._ignore(path, f"it was planned for the budget {_describe(entry.get('budget'))}, not "
                                      f"{_describe(planned_for)}")
        reach = entry.get("out_of_reach")
        if reach is not None and not (isinstance(reach, dict) and isinstance(reach.get("message"), str)):
            return self._ignore(path, "its record of a budget out of reach is malformed")
        try:
            stored = entry.get("plan")
            fissions = [Fission.from_dict(f) for f in stored.get("fissions") or ()]
            if fissions and split is None:
                return None
            plan = Plan.from_dict(stored, split(graph, fissions) if fissions else graph)
            # a plan run in place of a budget out of reach is judged at its own peak
            plan, why = _check(plan, plan.graph, None if reach is not None else budget, cost_model)
        except (PlanError, KeyError, TypeError, ValueError, AttributeError) as e:
            why = f"its plan does not load against the graph ({type(e).__name__}: {e})"
        if why:
            return self._ignore(path, why)
        out = plan.updated(graph_name=graph.name)
        return out if reach is None else out.updated(out_of_reach=OutOfReach.from_dict(reach))

    def put(self, key: str, plan: Plan, graph: Graph | None = None, *,
            planned_for: Mapping[str, Any] | None = None,
            out_of_reach: Mapping[str, Any] | None = None) -> Path | None:
        """Store ``plan`` under ``key`` (atomically; an entry already there is replaced), with
        the budget it was planned for (``planned_for``: :func:`budget_record`) and, where that
        budget was out of reach and ``plan`` is what ran instead, ``out_of_reach`` (the
        refusal's ``message`` and ``smallest_feasible``). Returns the file, or None (with a
        warning) when it cannot be written."""
        graph = graph if graph is not None else plan.graph
        if graph is None:
            raise PlanError("a plan is stored with the graph it was made for: pass graph=")
        path = self.path(key)
        try:
            d = plan.to_dict()
            d["details"] = {k: v for k, v in d.get("details", {}).items() if k not in _CACHE_DETAILS}
            d.update(dict.fromkeys(_CACHE_FIELDS))
            d["out_of_reach"] = None  # the entry's own record (out_of_reach=) says it
            entry = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "key": key,
                     "graph_hash": graph_hash(graph), "remat": _version("remat"),
                     "budget": None if planned_for is None else _canonical(dict(planned_for)),
                     "plan": d}
            if out_of_reach is not None:
                entry["out_of_reach"] = _canonical(dict(out_of_reach))
            write_json_atomically(path, entry, separators=(",", ":"))
        except (OSError, TypeError, ValueError, RecursionError, Uncacheable) as e:
            warnings.warn(f"remat could not store a plan in its cache at {path} ({type(e).__name__}: "
                          f"{e}); the next run plans again. Set {ENV} to a writable folder or to "
                          "'off'.", RematCacheWarning, stacklevel=2)
            return None
        return path

    def _ignore(self, path: Path, why: str) -> None:
        warnings.warn(f"remat ignores the cached plan {path}: {why}; planning again (the entry is "
                      "replaced)", RematCacheWarning, stacklevel=3)
        with contextlib.suppress(OSError):  # a bad entry is not read, nor warned about, twice
            path.unlink()
        return None


def budget_record(budget: Budget | None, graph: Graph, headroom: float = 0.0) -> dict | None:
    """The budget a plan of ``graph`` is made for, as the key covers it and an entry records it:
    the kind and value asked and the bytes the solver plans within (None: no budget)."""
    if budget is None:
        return None
    return {"kind": budget.kind, "value": budget.value, "planned_bytes": budget.planned_bytes(graph, headroom)}


def _describe(record: Any) -> str:
    if record is None:
        return "none"
    if isinstance(record, Mapping):
        return f"{record.get('kind')} {record.get('value')!r} ({record.get('planned_bytes')} bytes planned)"
    return repr(record)[:60]


def _check(plan: Plan, graph: Graph, budget: float | None,
           cost_model: CostModel | None) -> tuple[Plan, str]:
    """``plan`` (loaded against ``graph``) judged, and why it cannot be used, or ``""``."""
    if plan.statements is None:
        return plan, "it holds no schedule"
    names = [s.name for s in plan.saved] + list(plan.decisions) + plan.recomputed + plan.moved_to_backward
    unknown = [n for n in names if n not in graph]
    if unknown:
        return plan, f"it names {unknown[0]!r}, which is not in the graph"
    if any(_saved_value(graph[s.name]) != s for s in plan.saved):
        return plan, "its saved values differ from the graph's"
    stored_peak = plan.peak_bytes
    plan = plan.judge(budget, cost_model or default_cost_model(graph))
    if plan.status == "invalid":
        return plan, f"its schedule is not valid on the graph ({plan.message})"
    if not plan.feasible:
        return plan, f"its schedule does not fit ({plan.status}: {plan.message})"
    if stored_peak is not None and stored_peak != plan.peak_bytes:
        return plan, f"it was stored with a peak of {stored_peak} bytes, the simulator now finds {plan.peak_bytes}"
    return plan, ""


def resolve(cache: "PlanCache | str | os.PathLike | bool | None") -> PlanCache | None:
    """The cache ``cache`` stands for: True: :meth:`PlanCache.default`; False or None: none;
    a folder; or a :class:`PlanCache`."""
    if cache is True:
        return PlanCache.default()
    if cache is False or cache is None:
        return None
    if isinstance(cache, PlanCache):
        return cache
    if isinstance(cache, (str, os.PathLike)):
        return None if str(cache).strip().lower() in OFF else PlanCache(cache)
    raise TypeError(f"cache must be True, False, a folder or a PlanCache, not {cache!r}")


__all__ = ["CACHE_FORMAT", "CACHE_VERSION", "PlanCache", "Uncacheable", "budget_record", "cache_key",
           "default_directory", "graph_hash", "planner_fingerprint", "read_json_file", "resolve"]
