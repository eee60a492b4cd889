"""Measure the host <-> device link an offloading plan copies over, once per device.

:func:`measure_link` times pinned host memory copied to a CUDA device and back (CUDA events,
the median of a few copies after a warm-up) and returns a JSON-ready dict::

    {"bandwidth": 5.4e10, "h2d": 5.45e10, "d2h": 5.5e10, "latency": 9e-06,
     "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu128", "source": "measured"}

``bandwidth`` (bytes/s) is the slower direction's: a reload costs as much as an offload in
:class:`remat.cost.transfer.Link`. ``h2d`` and ``d2h`` are each direction's best rate over
:data:`SIZES`; ``latency`` (seconds) is the slower direction's time for a
:data:`SMALL`-byte copy. On a CPU there is no link to measure (remat's CPU lowering copies
with a memcpy, priced by the cost model's memory bandwidth) and it returns None.

:func:`link_for_device` is what planning calls: the link measured once per device and torch
version, kept in ``links.json`` beside remat's plan cache (:func:`links_path`)::

    {"format": "remat-links", "version": 1,
     "links": {"NVIDIA H100 80GB HBM3 | torch 2.11.0+cu128": {<a measure_link dict>}}}

The file is ``$REMAT_CACHE_DIR/links.json`` when that is set, else
``$XDG_CACHE_HOME/remat/links.json`` (``~/.cache/remat/links.json``, the parent of the plans'
folder); ``REMAT_CACHE_DIR=off`` (or ``cache=False``) measures without reading or writing it.
A file that cannot be read or parsed, for any reason, or has another format is ignored
with a :class:`~remat.errors.RematCacheWarning` and rewritten; writes are atomic (a temporary file,
then ``os.replace``). The planner reads the result from ``graph.meta["device"]["link"]``
(:func:`remat.cost.transfer.link_for_graph`).

``benchmarks/link_bandwidth.py`` prints a measurement as a table.
"""

from __future__ import annotations

import os
import statistics
import warnings
from pathlib import Path
from typing import Callable

import torch

from ..errors import RematCacheWarning
from ..plans.cache import ENV, default_directory, read_json_file, write_json_atomically

SIZES = (16 << 20, 64 << 20)
"""Bytes per copy whose rates are measured (large enough that the latency is under 1%)."""

SMALL = 4 << 10
"""Bytes of the copy whose time is taken as the latency."""

REPEATS = 5
"""Timed copies per size and direction (after one warm-up); their median counts."""

LINKS_FORMAT = "remat-links"
LINKS_VERSION = 1

TimeCopy = Callable[[str, int, int], "list[float]"]
"""``time_copy(direction, nbytes, repeats)``: seconds of ``repeats`` copies of ``nbytes``,
``direction`` ``"h2d"`` or ``"d2h"``."""


def link_from_timings(time_copy: TimeCopy, *, sizes: tuple[int, ...] = SIZES, small: int = SMALL,
                      repeats: int = REPEATS) -> dict:
    """``bandwidth``, ``h2d``, ``d2h`` and ``latency`` (see the module docstring) from the
    copy times ``time_copy`` gives, one warm-up copy of each size first (its time unused).

    >>> def time_copy(direction, nbytes, repeats):  # 10 us + 50 GB/s up, 40 GB/s down
    ...     return [1e-5 + nbytes / (50e9 if direction == "h2d" else 40e9)] * repeats
    >>> {k: round(v, 6 if k == "latency" else -9) for k, v in link_from_timings(time_copy).items()}
    {'bandwidth': 40000000000.0, 'h2d': 50000000000.0, 'd2h': 40000000000.0, 'latency': 1e-05}
    """
    out: dict = {}
    latency = 0.0
    for direction in ("h2d", "d2h"):
        rates = []
        for n in (small, *sizes):
            time_copy(direction, n, 1)
            t = statistics.median(time_copy(direction, n, repeats))
            if n == small:
                latency = max(latency, t)
            elif t > 0:
                rates.append(n / t)
        out[direction] = max(rates)
    return {"bandwidth": min(out["h2d"], out["d2h"]), **out, "latency": latency}


def _cuda_time_copy(device: torch.device, top: int) -> TimeCopy:
    """Times copies of up to ``top`` bytes between a pinned host buffer and ``device`` with CUDA
    events."""
    host = torch.empty(top, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(top, dtype=torch.uint8, device=device)

    def time_copy(direction: str, nbytes: int, repeats: int) -> list[float]:
        src, dst = (host, dev) if direction == "h2d" else (dev, host)
        src, dst = src[:nbytes], dst[:nbytes]
        events = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            events.append((a, b))
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) / 1e3 for a, b in events]

    return time_copy


def measure_link(device: torch.device | str = "cuda", *, sizes: tuple[int, ...] = SIZES,
                 repeats: int = REPEATS) -> dict | None:
    """The host <-> ``device`` link as measured now (the module docstring's dict), or None on a
    device without one (a CPU). Takes well under a second once CUDA is initialized."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(device):
        link = link_from_timings(_cuda_time_copy(device, max(*sizes, SMALL)), sizes=sizes, repeats=repeats)
    return {**link, "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "source": "measured"}


def links_path() -> Path | None:
    """``links.json`` in ``$REMAT_CACHE_DIR`` when set, else beside the plan cache's folder
    (:func:`remat.plans.cache.default_directory`); None when the cache is off."""
    plans = default_directory()
    if plans is None:
        return None
    return (plans if os.environ.get(ENV, "").strip() else plans.parent) / "links.json"


def _read(path: Path) -> dict:
    """The links stored at ``path`` (empty when there is no file). A file that cannot be read or
    parsed for any reason (:func:`remat.plans.cache.read_json_file`), or is not a links file,
    warns and is measured again and replaced: it never raises."""
    d, why = read_json_file(path)
    if why is None and d is not None and not (
            isinstance(d, dict) and d.get("format") == LINKS_FORMAT and d.get("version") == LINKS_VERSION
            and isinstance(d.get("links"), dict)):
        why = f"it is not a {LINKS_FORMAT} file of version {LINKS_VERSION}"
    if why is not None:
        warnings.warn(f"remat ignores its corrupt link measurements at {path} ({why}); measuring again "
                      "and replacing them.", RematCacheWarning, stacklevel=3)
        return {}
    return {} if d is None else d["links"]


def _write(path: Path, links: dict) -> None:
    """``links`` stored at ``path`` atomically (a warning when it cannot be written)."""
    try:
        write_json_atomically(path, {"format": LINKS_FORMAT, "version": LINKS_VERSION, "links": links},
                              indent=1, sort_keys=True)
    except (OSError, TypeError, ValueError, RecursionError) as e:
        warnings.warn(f"remat could not store its link measurement at {path} ({type(e).__name__}: {e}); "
                      f"the next process measures again. Set {ENV} to a writable folder or to 'off'.",
                      RematCacheWarning, stacklevel=3)


def _usable(link) -> bool:
    bw = link.get("bandwidth") if isinstance(link, dict) else None
    return isinstance(bw, (int, float)) and 0 < bw < float("inf")


def cached_link(name: str, measure: Callable[[], dict | None], *, cache: bool = True,
                path: str | os.PathLike | None = None) -> dict | None:
    """The link of the device called ``name`` under this torch: the one stored at ``path``
    (:func:`links_path` by default), else ``measure()``, stored there. ``cache=False`` or no
    path (``REMAT_CACHE_DIR=off``): ``measure()``, nothing read or written."""
    path = Path(path) if path is not None else links_path() if cache else None
    if not cache or path is None:
        return measure()
    key = f"{name} | torch {torch.__version__}"
    links = _read(path)
    if _usable(links.get(key)):
        return links[key]
    link = measure()
    if link is not None:
        _write(path, {**links, key: link})
    return link


def link_for_device(device: torch.device | str, *, cache: bool = True) -> dict | None:
    """The measured link of ``device`` (:func:`measure_link`), measured once per device name and
    torch version and kept in :func:`links_path`; None on a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return cached_link(name, lambda: measure_link(device), cache=cache)
