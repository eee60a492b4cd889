"""Launching a worker script on several processes for the gloo tests
(``tests/test_distributed.py``, ``tests/test_eager_distributed.py``): each rank's stdout and
stderr go to ``out/stderr-<rank>.txt``; a failure or a timeout fails the test with every
rank's log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 6000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(none)"


def run_ranks(worker: Path, args: list[str], out: Path, world: int, timeout: float, what: str,
              results: list[Path], **env: str) -> None:
    """Run ``worker args`` as ``world`` ranks on this machine (gloo's environment variables
    set, plus ``env``); fails with every rank's log unless all exit 0 and ``results`` exist."""
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(world), REMAT_CACHE_DIR="off", **env)
    base.pop("TORCHELASTIC_RUN_ID", None)
    procs = []
    for rank in range(world):
        log = open(out / f"stderr-{rank}.txt", "w")
        procs.append((subprocess.Popen([sys.executable, str(worker), "--out", str(out), *args],
                                       env={**base, "RANK": str(rank)}, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    codes: list = []
    try:
        for p, _ in procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    if any(c != 0 for c in codes) or not all(r.exists() for r in results):
        logs = "\n".join(f"--- rank {r} (exit {codes[r]}) ---\n{tail(out / f'stderr-{r}.txt')}"
                         for r in range(world))
        pytest.fail(f"{what} failed\n{logs}", pytrace=False)
