"""Device probes measured once per device and torch version, kept on disk beside the plan cache.

Measuring a device (:func:`remat.cost.calibrate.cpu_profile`, ``cuda_profile``, and the
dispatch overhead of selective checkpointing, ``calibrate.sac_overhead``) takes 3-13 s; a
process that reads the stored result takes milliseconds. :func:`stored` returns the value
stored for a probe on this device, measuring and storing it when there is none.

An entry is one JSON file per probe and device::

    {"format": "remat-probe", "version": 1, "kind": "profile",
     "identity": {"device": "cpu", "cpu": "...", "threads": 2, "torch": "2.13.0+cpu", ...},
     "value": ...}

named ``<kind>-<hash of kind, version and identity>.json``. The *identity* is everything the
measurement depends on: the device's name (a CPU's model and core count, a GPU's name,
compute capability and memory), torch's version, the threads or matmul precision, the dtype,
:data:`PROBE_VERSION` and a hash of the probing code. Another device, torch or probe gives
another file, so a stale measurement is never read. A device profile's entry is a profile file
too (:func:`remat.cost.profiles.load_profile` reads it).

The folder (:func:`probe_directory`) is ``$REMAT_CACHE_DIR/probes`` when that is set, else
``$XDG_CACHE_HOME/remat/probes`` (``~/.cache/remat/probes``), beside the plan cache's
``plans``; ``REMAT_CACHE_DIR=off`` (the plan cache's off switch) turns it off too: every
process measures. A file that cannot be read, parsed or used is measured again with a
:class:`~remat.errors.RematCacheWarning` and replaced; a folder that cannot be written warns
once and the value is used unstored. Nothing here ever stops a step.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import RematCacheWarning

PROBE_FORMAT = "remat-probe"
PROBE_VERSION = 1
"""Bumped whenever what a probe measures or how it stores it changes (it is in every key)."""

ENV = "REMAT_CACHE_DIR"
OFF = ("off", "0", "false", "no", "none")
"""``$REMAT_CACHE_DIR`` and the values that turn remat's caches off (the plan cache reads the
same: :mod:`remat.plans.cache`)."""

MAX_BYTES = 1 << 20
"""The largest probe file read (a profile takes about 2 kB): a larger one is re-measured."""

T = TypeVar("T")
_warned: set[str] = set()


def cache_root() -> Path | None:
    """remat's cache folder: ``$REMAT_CACHE_DIR`` (None when it is ``off``), else
    ``$XDG_CACHE_HOME/remat`` or ``~/.cache/remat``; with the variable unset, the plan cache
    lives in its ``plans`` folder."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return None if env.lower() in OFF else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "remat"


def probe_directory() -> Path | None:
    """Where probes are stored (the module's docstring), or None when remat's caches are off."""
    root = cache_root()
    return None if root is None else root / "probes"


def probe_path(kind: str, identity: dict, directory: Path | None = None) -> Path | None:
    """The file of probe ``kind`` on the device ``identity`` describes (None: caches off)."""
    directory = directory if directory is not None else probe_directory()
    if directory is None:
        return None
    key = hashlib.sha256(json.dumps({"kind": kind, "version": PROBE_VERSION, "identity": identity},
                                    sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:24]
    return directory / f"{kind}-{key}.json"


def stored(kind: str, identity: dict, measure: Callable[[], T], encode: Callable[[T], Any],
           decode: Callable[[Any], T]) -> T:
    """The value of probe ``kind`` for ``identity``: read from its file when one is there and
    usable (``decode(value)``; an exception there means unusable), else ``measure()``d and
    stored (``encode(value)``: plain JSON values)."""
    path = probe_path(kind, identity)
    if path is None:
        return measure()
    entry, why = _read(path)
    if entry is not None:
        try:
            if not isinstance(entry, dict) or entry.get("format") != PROBE_FORMAT:
                raise ValueError(f'it is not a remat probe (no "format": "{PROBE_FORMAT}")')
            if entry.get("version") != PROBE_VERSION or entry.get("kind") != kind or entry.get("identity") != identity:
                raise ValueError("it was measured for another device, torch or probe")
            return decode(entry["value"])
        except Exception as e:  # noqa: BLE001 - a probe file never takes a step down
            why = f"{type(e).__name__}: {e}"
    if why is not None:
        warnings.warn(f"remat cannot use its stored device measurement {path} ({why}); measuring again "
                      "(the file is replaced)", RematCacheWarning, stacklevel=3)
    value = measure()
    _write(path, {"format": PROBE_FORMAT, "version": PROBE_VERSION, "kind": kind, "identity": identity,
                  "value": encode(value)})
    return value


def _read(path: Path) -> tuple[Any, str | None]:
    """``(value, None)``; ``(None, None)`` without a file; ``(None, why)`` when it is unusable."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except OSError as e:
        return None, f"it cannot be read: {e}"
    if len(raw) > MAX_BYTES:
        return None, f"it is larger than {MAX_BYTES} bytes"
    try:
        return json.loads(raw.decode("utf-8")), None
    except Exception as e:  # noqa: BLE001 - not UTF-8, not JSON, nested too deeply
        return None, f"it is not JSON ({type(e).__name__}: {e})"


def _write(path: Path, entry: dict) -> None:
    """``entry`` at ``path``, atomically (a temporary file renamed over it: processes measuring
    at once never read half a file); a failure warns once per folder."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f, indent=1, allow_nan=False)
        os.replace(tmp, path)
        tmp = None
    except (OSError, TypeError, ValueError) as e:
        if str(path.parent) not in _warned:
            _warned.add(str(path.parent))
            warnings.warn(f"remat could not store a device measurement in {path.parent} ({type(e).__name__}: "
                          f"{e}); each process measures again. Set {ENV} to a writable folder, or to 'off'.",
                          RematCacheWarning, stacklevel=4)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


__all__ = ["PROBE_FORMAT", "PROBE_VERSION", "cache_root", "probe_directory", "probe_path", "stored"]
