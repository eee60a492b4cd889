"""Progress of long planning on stderr (issue 30): :func:`remat.solvers.progress.delayed` is
silent for its first seconds, then shows the stage it is in and every stage after it; what
``remat.compile`` uses unless ``verbose=True`` (which shows every stage from the start)."""

from __future__ import annotations

import threading
import time

import pytest

from remat.solvers import progress
from remat.solvers.progress import delayed, report


def test_silent_before_the_delay_then_every_stage(capsys):
    now = [0.0]
    with delayed("plan", delay=2.0, clock=lambda: now[0], timer=False):
        report("frontier")
        now[0] = 1.9
        report("descent")
        now[0] = 2.1
        report("search")
        report("re-ordering")
    assert capsys.readouterr().err.splitlines() == ["plan: search", "plan: re-ordering"]


def test_nothing_at_all_when_planning_is_quick(capsys):
    with delayed("plan", delay=5.0):
        report("frontier")
        report("search")
    time.sleep(0.05)
    assert capsys.readouterr().err == ""


def test_the_timer_shows_the_current_stage_when_the_delay_passes_between_reports(capsys):
    with delayed("plan", delay=0.05):
        report("a long stage")
        time.sleep(0.3)  # no report meanwhile: the timer shows the stage it is in
        shown_by_timer = capsys.readouterr().err
        report("the next stage")
    assert shown_by_timer == "plan: a long stage\n"
    assert capsys.readouterr().err == "plan: the next stage\n"


def test_listeners_stay_per_thread(capsys):
    heard = []
    with progress.listening(heard.append):
        t = threading.Thread(target=report, args=("another thread",))
        t.start()
        t.join()
        report("this thread")
    assert heard == ["this thread"]


def test_compile_shows_the_stages_of_long_planning_on_stderr(capfd, monkeypatch):
    """remat.compile without verbose: past the delay (0 here) the partitioner's stages appear."""
    torch = pytest.importorskip("torch")
    import remat

    monkeypatch.setattr(progress, "DELAY", 0.0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    step = remat.compile(model, budget="min", compiler="eager", cache=False, time_limit=5)
    step(torch.randn(4, 8)).sum().backward()
    err = capfd.readouterr().err
    assert "remat: planning" in err and "starting plans" in err
