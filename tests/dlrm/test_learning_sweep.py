"""benchmarks/dlrm_learning.py: the CPU smoke run writes every field of every run, finite; grid, loss record."""

from __future__ import annotations

import json
import math
from types import ModuleType

import pytest
from bench_scripts import load_benchmark

from fuselab.dlrm.config import OPTIMIZERS, load_config

NUMBERS = ("test_auc", "best_auc", "gap", "test_logloss", "first_loss", "max_loss_after_first", "max_over_first",
           "last10_loss", "final_loss", "max_over_untrained", "samples_per_s", "train_s", "wall_s")


@pytest.fixture(scope="module")
def sweep() -> ModuleType:
    return load_benchmark("dlrm_learning")


@pytest.mark.slow
def test_cpu_quick_run_records_every_field(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep.main(["--device", "cpu", "--quick", "--out", str(out)]) == 0
    result = json.loads((out / "dlrm_learning.json").read_text())
    assert result["status"] == "done" and result["benchmark"] == "dlrm_learning" and result["not_run"] == []
    assert result["environment"]["device_type"] == "cpu" and math.isfinite(result["best_auc_test"])
    runs = result["runs"]
    grid = sweep.quick_grid()
    assert [r["optimizer"] for r in runs[:len(grid)]] == [c.optimizer for c in grid]
    assert len(runs) <= len(grid) + 1 and all(r["seed"] == 1 for r in runs[len(grid):])
    for seed, untrained in result["untrained"].items():
        assert untrained["status"] == "ok" and untrained["lr_dense"] == untrained["lr_sparse"] == 0
        assert untrained["seed"] == int(seed) and len(untrained["losses"]) == untrained["steps"]
    for r in runs:
        assert r["status"] == "ok", r
        for key in NUMBERS:
            assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r[key])
        assert r["steps"] == len(r["losses"]) > 1
        assert r["first_loss"] == r["losses"][0] and r["final_loss"] == r["losses"][-1]
        assert r["max_loss_after_first"] == max(r["losses"][1:])
        assert r["loss_rose"] == (r["max_loss_after_first"] > r["first_loss"])
        # same initial model and batches as the untrained run of its seed: the same first loss, then the ratios
        untrained = result["untrained"][str(r["seed"])]
        assert r["first_loss"] == untrained["first_loss"]
        ratios = [a / b for a, b in zip(r["losses"], untrained["losses"], strict=True)]
        assert r["max_over_untrained"] == max(ratios)
        assert r["rose_above_untrained"] == (max(ratios) > 1 + 1e-6)
        assert r["gap"] == pytest.approx(r["best_auc"] - r["test_auc"]) and 0.5 < r["test_auc"] <= 1
        assert r["meets_target"] == (r["gap"] <= sweep.TARGET_GAP and not r["rose_above_untrained"])
        assert isinstance(r["jump"], bool)
    # the data folder is reused (same rows, scale, seed) and refused for another spec
    assert sweep.main(["--device", "cpu", "--quick", "--out", str(out), "--optimizers", "sgd", "--budget-s", "0"]) == 0
    again = json.loads((out / "dlrm_learning.json").read_text())
    assert again["runs"] == [] and [c["optimizer"] for c in again["not_run"]] == ["sgd"]
    assert "reusing" in capsys.readouterr().out
    with pytest.raises(ValueError, match="rows/scale/seed"):
        sweep.main(["--device", "cpu", "--quick", "--out", str(out), "--rows", "31000"])


def _row(optimizer, gap, *, rose=False, seed=0, lr=0.1, status="ok"):
    return {"optimizer": optimizer, "lr_dense": lr, "lr_sparse": 1.0, "warmup_steps": 0, "decay_start_step": 0,
            "decay_steps": 0, "seed": seed, "status": status, "gap": gap, "rose_above_untrained": rose,
            "loss_rose": rose}


def test_confirmations_pick_the_best_steady_run_of_each_optimizer(sweep):
    runs = [_row("sgd", 0.05), _row("sgd", 0.04, lr=0.2), _row("adagrad", 0.01, rose=True),
            _row("adagrad", 0.02), _row("rowwise_adagrad", 0.015), _row("rowwise_adagrad", 0.016, lr=0.3),
            _row("rowwise_adagrad", 0.001, status="error"), _row("adagrad", 0.0, seed=1)]
    picked = sweep.confirmations(runs, 4)
    assert [(c.optimizer, c.lr_dense) for c in picked] == [("rowwise_adagrad", 0.1), ("rowwise_adagrad", 0.3),
                                                           ("adagrad", 0.1), ("sgd", 0.2)]
    assert all(c.seed == 1 for c in picked)
    assert [c.optimizer for c in sweep.confirmations(runs, 2)] == ["rowwise_adagrad", "adagrad"]
    assert sweep.confirmations([], 3) == []


def test_loss_record(sweep):
    rec = sweep.loss_record([0.5, 0.49, 0.52, 0.4])
    assert rec["first_loss"] == 0.5 and rec["max_loss_after_first"] == 0.52 and rec["loss_rose"]
    assert rec["max_over_first"] == pytest.approx(1.04) and rec["jump"] and rec["final_loss"] == 0.4
    assert rec["last10_loss"] == pytest.approx((0.5 + 0.49 + 0.52 + 0.4) / 4)
    assert not rec["diverged"] and "max_over_untrained" not in rec
    flat = sweep.loss_record([0.5, 0.5, 0.45], untrained=[0.5, 0.51, 0.5])
    assert not flat["loss_rose"] and not flat["jump"] and not flat["rose_above_untrained"]
    assert flat["max_over_untrained"] == 1.0
    above = sweep.loss_record([0.5, 0.5, 0.45], untrained=[0.5, 0.49, 0.5])
    assert above["rose_above_untrained"] and above["max_over_untrained"] == pytest.approx(0.5 / 0.49)
    for bad in (math.nan, math.inf):  # wherever it is, a non-finite loss is the largest and marks divergence
        diverged = sweep.loss_record([0.5, bad, 0.4], untrained=[0.5, 0.5, 0.5])
        assert diverged["diverged"] and diverged["max_loss_after_first"] == math.inf and diverged["loss_rose"]
        assert diverged["max_over_untrained"] == math.inf and diverged["rose_above_untrained"]


def test_grid_starts_with_candidates_of_every_optimizer_and_holds_the_baselines(sweep):
    grid = sweep.default_grid()
    assert len(grid) == len(set(grid)) and 20 <= len(grid) <= 45
    assert {c.optimizer for c in grid[:len(OPTIMIZERS)]} == set(OPTIMIZERS)
    for optimizer in OPTIMIZERS:
        cfg = load_config("kaggle", optimizer=optimizer)
        assert any(c.key() == (optimizer, cfg.lr_dense, cfg.lr_sparse, cfg.warmup_steps, cfg.decay_start_step,
                               cfg.decay_steps, 0, cfg.adagrad_eps, cfg.interaction.kind,
                               cfg.interaction.self_interaction)
                   for c in grid)
    for c in grid:  # every candidate is a valid config
        load_config("kaggle", **c.overrides())


def test_grid_file_and_bad_grid(sweep, tmp_path):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps([{"optimizer": "sgd", "lr_dense": 0.1, "lr_sparse": 32, "warmup_steps": 10,
                                 "decay_start_step": 60, "decay_steps": 44}]))
    args = sweep.parse_args(["--out", str(tmp_path / "o"), "--grid", str(path), "--device", "cpu"])
    assert sweep.candidates(args) == [sweep.Candidate("sgd", 0.1, 32, 10, 60, 44)]
    assert args.confirm == 4 and args.kernels == "torch" and not args.cuda_graph
    path.write_text(json.dumps([{"optimizer": "sgd"}]))
    with pytest.raises(ValueError, match="--grid"):
        sweep.candidates(args)
