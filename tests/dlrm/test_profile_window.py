"""`--profile`: the window of recorded steps (clear of periodic work, fitted to short runs) and the per-step table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from profile_table import table_rows

from fuselab.dlrm.runtime import ProfileWindow, StepProfiler, profile_window


def _recorded_periodic(window: ProfileWindow, first: int) -> range:
    """Steps whose periodic work (run after the step) falls inside the recorded window."""
    start = first + window.wait + window.warmup
    return range(start, start + window.active)


@pytest.mark.parametrize("first, left, periods", [
    (0, 100, ()), (0, 100, (7,)), (0, 12, (6, 0)), (40, 100, (10, 4)), (0, 100, (3,)), (0, 9, (5,)),
    (3, 1000, (997, 991)),
])
def test_window_avoids_periodic_work_and_fits_the_run(first, left, periods):
    window = profile_window(first, left, periods)
    assert window.wait + window.warmup + window.active <= left
    assert window.warmup >= 1 and window.active >= 1
    assert window.clean
    assert not [n for n in _recorded_periodic(window, first) for p in periods if p and n % p == 0]
    if not periods:
        assert window == ProfileWindow(2, 2, 5)
        assert window.steps(first) == range(first + 5, first + 10)


def test_window_prefers_the_full_length_then_shortens():
    assert profile_window(0, 100, (7,)) == ProfileWindow(6, 2, 5)  # steps 9-13: periodic work after 8..12
    assert profile_window(0, 100, (3,)).active == 2  # every third step: two steps fit between
    assert profile_window(0, 100, (1,)) == ProfileWindow(2, 2, 5, clean=False)  # nothing avoids it


@pytest.mark.parametrize("left, expected", [(2, ProfileWindow(0, 1, 1)), (3, ProfileWindow(0, 2, 1)),
                                            (6, ProfileWindow(0, 2, 4)), (8, ProfileWindow(1, 2, 5))])
def test_short_runs_give_up_the_wait_then_recorded_steps(left, expected):
    assert profile_window(0, left) == expected
    assert profile_window(0, 1) is None and profile_window(5, 0) is None


def _work(x: torch.Tensor) -> None:
    torch.tanh(x * 2)
    torch.sigmoid(x)


def test_step_profiler_writes_a_per_step_table(tmp_path: Path):
    x, logs = torch.randn(4096), []
    with StepProfiler(tmp_path, torch.device("cpu"), logs.append, ProfileWindow(1, 1, 3), first_step=10) as prof:
        for _ in range(8):
            _work(x)
            torch.tanh(x)
            prof.step()
    text = (tmp_path / "kernels.txt").read_text()
    assert "DLRM training steps 13-15: CPU ops per step" in text and "averages over 3 steps" in text
    rows = table_rows(text)
    assert rows["aten::tanh"][0] == 2 and rows["aten::sigmoid"][0] == 1 and rows["aten::mul"][0] == 1
    assert set(rows) == {"aten::tanh", "aten::sigmoid", "aten::mul"}
    assert sum(r[3] for r in rows.values()) == pytest.approx(100, abs=0.05 * len(rows) + 0.01)  # each rounded to 0.1
    per_step = [r[1] for r in rows.values()]
    assert per_step == sorted(per_step, reverse=True)
    for calls, us_step, us_call, _ in rows.values():
        assert us_step == pytest.approx(calls * us_call, rel=0.02, abs=0.2)
    assert (tmp_path / "trace.json").stat().st_size > 0 and list((tmp_path / "tensorboard").iterdir())
    assert any(str(tmp_path / "kernels.txt") in line for line in logs)


def test_step_profiler_stopped_early(tmp_path: Path):
    x, logs = torch.randn(256), []
    with StepProfiler(tmp_path / "a", torch.device("cpu"), logs.append, ProfileWindow(0, 1, 5), first_step=0) as p:
        for _ in range(3):  # warm-up step 1, then steps 2 and 3 recorded before the run ends
            _work(x)
            p.step()
    text = (tmp_path / "a" / "kernels.txt").read_text()
    assert "steps 2-3" in text and table_rows(text)["aten::sigmoid"][0] == 1
    logs.clear()
    with StepProfiler(tmp_path / "b", torch.device("cpu"), logs.append, ProfileWindow(2, 2, 5), first_step=0) as p:
        _work(x)
        p.step()
    assert logs == ["profile: nothing recorded: the run stopped after step 1, before the profiled steps 5-9"]
    assert not (tmp_path / "b" / "kernels.txt").exists()
