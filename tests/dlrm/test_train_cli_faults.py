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
from profile_table import table_rows

from fuselab.dlrm.cli import configure_parser, main
from fuselab.dlrm.config import load_config
from fuselab.dlrm.train import train

# the subprocess runs: small batches so that a few hundred steps take a second or two
STEPS = 300
RUN = ["--steps", str(STEPS), "--batch-size", "256", "--checkpoint-every", "10", "--quiet", "--set", "eval_batches=1",
       "--set", "eval_batch_size=4096", "--set", "warmup_steps=20", "--set", "decay_start_step=100", "--set",
       "decay_steps=200"]


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
    assert len(err.splitlines()) == 1 and str(blocker) in err, err  # names the path, or its folder (a file)
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
    assert main(["evaluate", str(ckpt / "latest.json"), "--data", str(synth_dir), "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == result  # the index names the same checkpoint
    assert main(["evaluate", str(tmp_path / "nope.pt"), "--data", str(synth_dir)]) == 2


# --------------------------------------------------------------------------- signals, in a subprocess


def _cli(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    code = ("import sys, torch; torch.set_num_threads(1); from fuselab.dlrm.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
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
    """The uninterrupted run of RUN (in this process, one thread like the subprocesses)."""
    import torch

    out = tmp_path_factory.mktemp("straight")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", "--data", str(synth_dir), *RUN, "--json", str(out / "s.json"), "--run-dir",
                     str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "s.json").read_text())["losses"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
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
    assert 10 <= stopped < STEPS and (ckpt / f"ckpt-{stopped:08d}.pt").is_file()
    if signum != signal.SIGKILL:  # the checkpoint is of the step that was running when the signal came
        assert f"at step {stopped}: checkpoint written to {ckpt / f'ckpt-{stopped:08d}.pt'}" in err
    resumed = _cli([*base, "--resume", "--json", str(tmp_path / "r.json")])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["first_step"] == stopped and summary["steps"] == STEPS
    assert summary["losses"] == straight_losses[stopped:]
    assert f"trained {STEPS - stopped} steps (steps {stopped + 1}-{STEPS} of the run; {STEPS} in total)" in out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_step_and_checkpoints(synth_dir, tmp_path, signum):
    """In-process: the signal comes during step 7; step 7 finishes, its checkpoint is written, 128 + signum."""
    from fuselab.dlrm.trainer import RunOptions, Trainer, TrainingInterrupted

    class SignalAtStep7(Trainer):
        def step(self, batch):
            if self.step_count == 6:
                os.kill(os.getpid(), signum)
            return super().step(batch)

    cfg = load_config("tiny", ["steps=20", "batch_size=1024", "eval_batches=1"])
    options = RunOptions(run_dir=tmp_path / "run", progress=False)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(TrainingInterrupted) as stop:
        SignalAtStep7(cfg, synth_dir, options, log=lambda *a: None).run()
    assert (stop.value.step, stop.value.exit_code) == (7, 128 + signum)
    assert stop.value.checkpoint == tmp_path / "run" / "checkpoints" / "ckpt-00000007.pt"
    assert json.loads((tmp_path / "run" / "checkpoints" / "latest.json").read_text())["step"] == 7
    assert {s: signal.getsignal(s) for s in before} == before  # the trainer's handlers are taken down again


def test_checkpoint_every_without_a_folder_uses_the_run_dir(synth_dir, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--data", str(synth_dir), "--steps", "6", "--batch-size", "512", "--checkpoint-every", "3",
            "--quiet", "--run-dir", str(run), "--set", "eval_batches=1"]
    assert main(argv) == 0
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 6
    assert main([*argv[:4], "8", *argv[5:], "--resume"]) == 0  # --resume finds RUN_DIR/checkpoints
    out = capsys.readouterr().out
    assert "trained 2 steps (steps 7-8 of the run; 8 in total)" in out and "nan" not in out
    assert main([*argv[:4], "8", *argv[5:], "--resume"]) == 0  # already at the end: evaluates, no rate
    out = capsys.readouterr().out
    assert "trained 0 steps" in out and "too few steps to measure" in out and "nan" not in out


def test_profile_prints_the_table_path_and_nothing_on_stderr(synth_dir, tmp_path):
    """`train --profile DIR` in a process of its own (kineto writes its lines to file descriptor 2): stderr stays
    empty, DIR/kernels.txt holds one training step (here the tiny model's four linear layers and one loss), clear
    of the evaluation that runs every 6 steps, and stdout names it."""
    prof = tmp_path / "prof"
    proc = _cli(["train", "--device", "cpu", "--data", str(synth_dir), "--steps", "14", "--batch-size", "512",
                 "--quiet", "--profile",
                 str(prof), "--run-dir", str(tmp_path / "run"), "--set", "eval_every=6", "--set", "eval_batches=2"])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert err == ""
    assert f"per-op table of one step: {prof / 'kernels.txt'}" in out
    text = (prof / "kernels.txt").read_text()
    assert "DLRM training steps 8-12: CPU ops per step" in text  # steps 5-9 would hold the evaluation after step 6
    rows = table_rows(text)
    assert rows["aten::linear"][0] == 4 and rows["aten::binary_cross_entropy_with_logits"][0] == 1
    assert sum(r[3] for r in rows.values()) == pytest.approx(100, abs=0.05 * len(rows) + 0.01)  # each rounded to 0.1
    assert [r[1] for r in rows.values()] == sorted((r[1] for r in rows.values()), reverse=True)


def test_synth_train_export_print_no_warning_and_no_traceback(tmp_path):
    """The README's DLRM commands as a user runs them, each in a process of its own with every warning shown
    (``-W always``: also the DeprecationWarnings Python hides outside ``__main__``): stderr stays empty."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    commands = [
        ["synth", "--out", str(data), "--rows", "20000", "--scale", "1e-4", "--workers", "2", "--quiet"],
        ["train", "--data", str(data), "--steps", "6", "--batch-size", "512", "--checkpoint-dir", str(ckpt),
         "--run-dir", str(tmp_path / "run"), "--quiet", "--set", "eval_batches=1"],
        ["evaluate", str(ckpt), "--data", str(data)],
        ["export", "--checkpoint", str(ckpt), "--onnx", str(tmp_path / "m.onnx")],
    ]
    for argv in commands:
        proc = subprocess.run([sys.executable, "-W", "always", "-m", "fuselab", "dlrm", *argv], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (argv[0], proc.stderr)
        assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, (argv[0], proc.stderr)
        assert proc.stderr == "", (argv[0], proc.stderr)
    assert (tmp_path / "m.onnx").is_file() and f"wrote {tmp_path / 'm.onnx'}" in proc.stdout
