"""`fuselab dlrm train` / `evaluate` end to end: flags reach the config, output paths checked before training,
SIGINT/SIGTERM/SIGKILL mid-training, resume to the same losses, corrupt files named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuselab.dlrm.cli import configure_parser, main
from fuselab.dlrm.config import load_config
from fuselab.dlrm.train import train

# the subprocess runs: small batches so that a few hundred steps take a second or two
RUN = ["--steps", "900", "--batch-size", "256", "--checkpoint-every", "5", "--quiet", "--set", "eval_batches=1",
       "--set", "warmup_steps=20", "--set", "decay_start_step=300", "--set", "decay_steps=600"]


def _cfg_of(argv: list[str]):
    import argparse

    from fuselab.dlrm.cli import _train_config

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return _train_config(parser.parse_args(["train", *argv]))


def test_cli_defaults_are_the_configs():
    assert _cfg_of([]) == load_config("tiny")
    assert _cfg_of(["--config", "kaggle"]) == load_config("kaggle")
    cfg = _cfg_of(["--kernels", "torch", "--optimizer", "rowwise_adagrad", "--precision", "tf32", "--cuda-graph",
                   "--data-on-device", "--checkpoint-every", "7"])
    assert (cfg.kernels, cfg.optimizer, cfg.precision, cfg.cuda_graph, cfg.data_on_device, cfg.checkpoint_every) == (
        "torch", "rowwise_adagrad", "tf32", True, True, 7)
    assert _cfg_of(["--bf16"]).precision == "bf16"


def test_cli_flags_reach_run_json(synth_dir, tmp_path, capsys):
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    assert main(["train", "--data", str(synth_dir), "--steps", "4", "--batch-size", "512", "--kernels", "torch",
                 "--optimizer", "rowwise_adagrad", "--precision", "bf16", "--data-on-device", "--checkpoint-every",
                 "2", "--checkpoint-dir", str(ckpt), "--run-dir", str(run), "--quiet", "--set", "eval_batches=1"]) == 0
    cfg = json.loads((run / "run.json").read_text())["config"]
    assert (cfg["kernels"], cfg["optimizer"], cfg["precision"], cfg["data_on_device"], cfg["checkpoint_every"]) == (
        "torch", "rowwise_adagrad", "bf16", True, 2)
    assert sorted(p.name for p in ckpt.glob("ckpt-*.pt")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    assert "trained 4 steps" in capsys.readouterr().out
    assert main(["train", "--data", str(synth_dir), "--cuda-graph", "--device", "cpu", "--run-dir", str(run)]) == 2
    assert "cuda_graph needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--json", "--run-dir", "--tensorboard"])
def test_unwritable_outputs_fail_before_training(synth_dir, tmp_path, capsys, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad = blocker / "out"  # a path under a file: cannot be created, even by root
    argv = ["train", "--data", str(synth_dir), "--steps", "3", "--batch-size", "512", "--quiet",
            "--run-dir", str(tmp_path / "run"), flag, str(bad)]
    t0 = time.perf_counter()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err or str(blocker) in err, err
    assert "trained" not in captured.out and not (tmp_path / "run" / "checkpoints").exists()
    assert time.perf_counter() - t0 < 30


def test_data_file_and_corrupt_latest_json_are_named(synth_dir, tmp_path, capsys):
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("1\t" + "\t".join(["1"] * 13 + ["0a"] * 26) + "\n")
    assert main(["train", "--data", str(tsv), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "is a file, not a dataset directory" in err and "fuselab dlrm preprocess" in err
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "latest.json").write_text('{"path": "ckpt-00000004.pt",\n')
    assert main(["train", "--data", str(synth_dir), "--checkpoint-dir", str(ckpt), "--resume", "--quiet",
                 "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(ckpt / "latest.json") in err and len(err.splitlines()) == 1


def test_evaluate_a_checkpoint(synth_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    summary = train(load_config("tiny", ["steps=8", "batch_size=4096"]), synth_dir, checkpoint_dir=ckpt,
                    progress=False, log=lambda *a: None)
    out = tmp_path / "eval.json"
    assert main(["evaluate", str(ckpt), "--data", str(synth_dir), "--json", str(out)]) == 0
    assert "calibration" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["step"] == 8 and result["split"] == "test"
    assert result["auc"] == pytest.approx(summary["final"]["auc"], abs=1e-6)
    assert result["logloss"] == pytest.approx(summary["final"]["logloss"], rel=1e-5)
    assert result["calibration"] == pytest.approx(result["mean_prediction"] / result["positive_rate"])
    assert 0.5 < result["calibration"] < 2 and 0 < result["accuracy"] <= 1
    assert main(["evaluate", str(tmp_path / "nope.pt"), "--data", str(synth_dir)]) == 2


# --------------------------------------------------------------------------- signals, in a subprocess


def _cli(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    code = "import torch, sys; torch.set_num_threads(1); from fuselab.dlrm.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(ckpt: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.perf_counter()
    while not (ckpt / "latest.json").is_file():
        if proc.poll() is not None:
            pytest.fail(f"training ended before its first checkpoint: {proc.communicate()}")
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            pytest.fail("no checkpoint within the timeout")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def straight_losses(synth_dir, tmp_path_factory) -> list[float]:
    """The uninterrupted run of RUN, in a subprocess like the interrupted ones."""
    out = tmp_path_factory.mktemp("straight")
    proc = _cli(["train", "--data", str(synth_dir), *RUN, "--json", str(out / "s.json"), "--run-dir", str(out)])
    assert proc.wait(timeout=300) == 0, proc.communicate()
    return json.loads((out / "s.json").read_text())["losses"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_signal_mid_training_then_resume_gives_the_same_losses(synth_dir, tmp_path, straight_losses, signum):
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    base = ["train", "--data", str(synth_dir), *RUN, "--checkpoint-dir", str(ckpt), "--run-dir", str(run)]
    proc = _cli(base)
    _wait_for_checkpoint(ckpt, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + signum, err
        assert "checkpoint written to" in err and "--resume" in err
    stopped = json.loads((ckpt / "latest.json").read_text())["step"]
    assert 5 <= stopped < 900 and (ckpt / f"ckpt-{stopped:08d}.pt").is_file()
    if signum != signal.SIGKILL:  # the checkpoint is of the step that was running when the signal came
        assert stopped % 5 or f"step {stopped}" in err
    resumed = _cli([*base, "--resume", "--json", str(tmp_path / "r.json")])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["first_step"] == stopped and summary["steps"] == 900
    assert summary["losses"] == straight_losses[stopped:]
    assert f"trained {900 - stopped} steps (steps {stopped + 1}-900 of the run; 900 in total)" in out
