"""benchmarks/dlrm_scaling.py on CPU (gloo, tiny tables): both world sizes run, the JSON holds each run's
throughput and the efficiency against one rank, and a second call with another spec (SGD tables, one rank) starts
a new file. (The DCNv2 model's hybrid step on CPU takes minutes under the interpreter here: test_dist_trainer.py's
test_dcn_multi_hot_two_ranks_train_like_one trains it through the same build_hybrid.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dlrm_scaling.py"), "--device", "cpu",
                           "--quick", "--no-profile", *args], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_scaling_smoke(tmp_path):
    done = _run("--nproc", "1,2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "dlrm_scaling.json").read_text())
    runs = {(r["ranks"], r["mode"], r["overlap"]): r for r in record["runs"]}
    assert set(runs) == {(w, "eager", overlap) for w in (1, 2) for overlap in (False, True)}
    for run in runs.values():
        assert run["samples_per_s"] > 0 and run["global_batch"] == run["ranks"] * run["batch_per_rank"]
    for overlap in (False, True):
        assert runs[(1, "eager", overlap)]["efficiency"] == 1.0 and runs[(2, "eager", overlap)]["efficiency"] > 0
    # the overlapped step (split forward, one flat all-reduce) ends with the plain step's (DDP's) weights
    assert runs[(2, "eager", True)]["same_weights_as_plain"] is True
    assert runs[(2, "eager", True)]["weights_digest"] != runs[(1, "eager", True)]["weights_digest"]
    assert not any(r["pipeline"] for r in runs.values())
    assert "ranks" in done.stdout and "samples/s" in done.stdout and "same w" in done.stdout
    # a new file; strong scaling (the global batch split over the ranks), each mode's own overlap default, the next
    # batch's ids sent ahead
    again = _run("--nproc", "1", "--optimizer", "sgd", "--overlap", "auto", "--global-batch", "768", "--pipeline",
                 "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    record = json.loads((tmp_path / "dlrm_scaling.json").read_text())
    assert [r["ranks"] for r in record["runs"]] == [1] and record["spec"]["optimizer"] == "sgd"
    run = record["runs"][0]
    assert run["batch_per_rank"] == run["global_batch"] == 768 and run["overlap"] is False  # eager: DDP's own
    assert run["pipeline"] is True and record["spec"]["pipeline"] is True
    assert run["speedup"] == run["efficiency"] == 1.0
    refused = _run("--nproc", "1,2", "--global-batch", "1025", "--out", str(tmp_path))
    assert refused.returncode == 2 and "multiple of every world size" in refused.stderr
