"""Result files: JSON round-trip, CSV, atomic writes, unwritable folders; compare marks regressions."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from fuselab._io import PathError, json_safe
from fuselab.bench import results as R
from fuselab.bench.ceilings import Ceilings
from fuselab.bench.compare import compare, compare_files

CEIL = Ceilings(device_type="cpu", copy_gbps=50.0, copy_bytes=2**28, copy_method="fake", copy_check_gbps=48.0)


def make_run(times: dict[str, float], statuses: dict[str, str] | None = None) -> R.OpRun:
    statuses = statuses or {}
    results = [R.Result("op", "n=2^10", "fp32", "fwd", p, 1024, 8192, 1024, status=statuses.get(p, R.OK),
                        median_ms=t, p20_ms=t, p80_ms=t, rel_error=1e-7, tolerance=1e-5) for p, t in times.items()]
    R.derive_figures(results, CEIL, baseline="eager")
    return R.OpRun(op="op", summary="s", command="fuselab bench op", env={"device": "test"}, ceilings=CEIL,
                   timer="fake", results=results, created="now")


def test_json_round_trip(tmp_path: Path):
    run = make_run({"eager": 1.0, "fast": 0.5})
    run.results.append(R.Result("op", "n=2^10", "fp32", "fwd", "bad", 1024, 8192, 1024, status=R.FAILED,
                                detail="check: RuntimeError: x", rel_error=float("inf")))
    paths = R.save(run, tmp_path)
    assert [p.name for p in paths] == ["op.json", "op.csv"]
    back = R.load(tmp_path / "op.json")
    assert back.to_dict() == json_safe(run.to_dict())  # strict JSON: the infinite error is written as null
    assert back.results[2].rel_error is None
    json.loads((tmp_path / "op.json").read_text(), parse_constant=_reject)  # no NaN/Infinity tokens
    mask = os.umask(0)
    os.umask(mask)
    for path in paths:
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path  # the usual permissions, not mkstemp's 0600
    assert back.results[1].speedup_vs_baseline == pytest.approx(2.0)
    assert back.ceilings.copy_agreement == pytest.approx(50 / 48)
    csv_lines = (tmp_path / "op.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 3 and csv_lines[0].startswith("op,case,dtype,mode,provider")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def _reject(token: str):
    raise AssertionError(f"invalid JSON token {token}")


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path, monkeypatch):
    target = tmp_path / "op.json"
    R.write_atomic(target, b"old")

    def fail(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(PathError, match=f"no space left on the device for result file {target}"):
        R.write_atomic(target, b"new half-written")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["op.json"]


def test_unwritable_out_dir_is_a_clear_error(tmp_path: Path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(PathError, match=f"output folder {blocker / 'results'} is not writable"):
        R.check_writable(blocker / "results")


def test_load_rejects_other_json(tmp_path: Path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a fuselab bench result"):
        R.load(path)


def test_compare_marks_regressions_and_improvements(tmp_path: Path):
    a = make_run({"eager": 1.0, "fast": 0.5, "same": 1.0, "broke": 1.0, "gone": 1.0})
    b = make_run({"eager": 1.10, "fast": 0.40, "same": 1.02, "broke": 1.0, "new": 1.0}, statuses={"broke": R.WRONG})
    rows = {row.key[-1]: row for row in compare(a, b, threshold=0.05)}
    assert rows["eager"].verdict == "regression" and rows["eager"].ratio == pytest.approx(1.1)
    assert rows["fast"].verdict == "improvement"
    assert rows["same"].verdict == "same" and not rows["same"].is_regression
    assert rows["broke"].is_regression and "WRONG" in rows["broke"].verdict
    assert rows["gone"].verdict == "gone" and rows["new"].verdict == "new"
    loose = {row.key[-1]: row for row in compare(a, b, threshold=0.2)}
    assert loose["eager"].verdict == "same"
    R.save(a, tmp_path / "a")
    R.save(b, tmp_path / "b")
    _, _, file_rows = compare_files(tmp_path / "a" / "op.json", tmp_path / "b" / "op.json")
    assert sum(r.is_regression for r in file_rows) == 2
    with pytest.raises(ValueError):
        compare(a, b, threshold=-1)
