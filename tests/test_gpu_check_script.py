"""``benchmarks/gpu_check.sh`` never changes the environment of the python it is given: where
remat does not import there, it runs remat from the tree and puts missing dependencies in a
venv under OUT (before, it pip-installed remat into whatever ``python`` came first on PATH)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def _fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A ``python`` that records every call and in which nothing imports."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\nexit 1\n')
    fake.chmod(0o755)
    return fake, log


def test_a_python_without_remat_is_left_as_it_is(tmp_path):
    fake, log = _fake_python(tmp_path)
    env = {**os.environ, "PYTHON": str(fake), "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    env.pop("REMAT_WHEELS", None)
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), "--cpu"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "do not import" in r.stderr and "REMAT_WHEELS" in r.stderr
    calls = log.read_text()
    assert "pip" not in calls and "install" not in calls, calls
