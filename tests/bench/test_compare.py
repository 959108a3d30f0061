"""`bench compare`: like with like only, noise (overlapping p20-p80 spreads) never called a regression."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuselab.bench import results as R
from fuselab.bench.compare import compare, warnings
from fuselab.cli import main


def _run(times: dict[str, tuple[float, float, float]], device: str = "AMD EPYC", **options) -> R.OpRun:
    """times: provider -> (p20, median, p80) in ms."""
    results = [R.Result("op", "n=2^20", "fp32", "fwd", p, 1 << 20, 8 << 20, 0, median_ms=m, p20_ms=lo, p80_ms=hi)
               for p, (lo, m, hi) in times.items()]
    return R.OpRun("op", "", "", {"device_type": "cpu", "device": device}, None, "host clock", options=options,
                   results=results)


def test_noise_is_not_a_regression():
    a = _run({"eager": (0.6, 1.0, 1.6), "tight": (0.98, 1.0, 1.02), "fast": (0.99, 1.0, 1.01)})
    b = _run({"eager": (0.9, 1.5, 2.0), "tight": (1.18, 1.2, 1.22), "fast": (0.495, 0.5, 0.505)})
    rows = {r.key[-1]: r for r in compare(a, b, threshold=0.05)}
    assert rows["eager"].verdict == "within noise" and not rows["eager"].is_regression and rows["eager"].noisy
    assert rows["tight"].verdict == "regression" and rows["tight"].is_regression and not rows["tight"].noisy
    assert rows["fast"].verdict == "improvement"
    lines = warnings(a, b, list(rows.values()))
    assert len(lines) == 1 and "1 result(s) have a p20-p80 spread over 10%" in lines[0]


def test_noisy_timings_are_never_a_regression():
    """A whole run slowed by a burst of load: outside the spreads, but the spreads are wide: not counted."""
    a = _run({"p": (0.5, 1.0, 1.5)})
    b = _run({"p": (70.0, 73.0, 76.0)})
    (row,) = compare(a, b)
    assert row.verdict == "slower (noisy)" and not row.is_regression and row.noisy


def test_threshold_still_applies_outside_the_spread():
    a, b = _run({"p": (0.999, 1.0, 1.001)}), _run({"p": (1.029, 1.03, 1.031)})
    assert compare(a, b, threshold=0.05)[0].verdict == "same"
    assert compare(a, b, threshold=0.01)[0].verdict == "regression"


@pytest.mark.parametrize("other", [dict(device="NVIDIA H100"), dict(cuda_graph=True)])
def test_unlike_runs_are_refused(other):
    a = _run({"p": (1, 1, 1)})
    b = _run({"p": (1, 1, 1)}, **other)
    with pytest.raises(ValueError, match="not comparable"):
        compare(a, b)
    rows = compare(a, b, allow_different=True)
    assert any("not comparable" in line for line in warnings(a, b, rows))


def test_cli_refuses_other_devices_and_warns_on_noise(tmp_path: Path, capsys):
    R.save(_run({"p": (1.0, 1.0, 1.0)}), tmp_path / "a")
    R.save(_run({"p": (1.0, 1.0, 1.0)}, device="NVIDIA H100"), tmp_path / "b")
    R.save(_run({"p": (0.5, 3.0, 4.0)}), tmp_path / "c")
    a, b, c = (str(tmp_path / x / "op.json") for x in "abc")
    assert main(["bench", "compare", a, b]) == 2
    err = capsys.readouterr().err
    assert "A ran on device 'AMD EPYC', B on 'NVIDIA H100'" in err and "Traceback" not in err
    assert main(["bench", "compare", a, b, "--any-device"]) == 0
    assert "not comparable" in capsys.readouterr().err
    assert main(["bench", "compare", a, c, "--fail-on-regression"]) == 0  # 3x slower median, inside the spread
    out, err = capsys.readouterr()
    assert "0 regression(s)" in out and "within noise" in out and "spread over 10%" in err
