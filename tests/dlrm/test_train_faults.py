"""Faults of `fuselab dlrm train` that must cost no work: Ctrl-C while the output pipe is gone (item 1), divergence
(item 2), damaged checkpoints (item 3), a full disk during a checkpoint (item 4), temporary files of a killed
write (item 5). Tiny config, a few steps each."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fuselab.dlrm.checkpoint import manifest_path, verify_checkpoint
from fuselab.dlrm.cli import main
from fuselab.dlrm.config import load_config
from fuselab.dlrm.health import DIVERGED_EXIT, TrainingDiverged
from fuselab.dlrm.trainer import RunOptions, Trainer

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def _train(synth_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(synth_dir), "--batch-size", "512", "--quiet", "--run-dir", str(tmp_path / "run"),
            "--set", "eval_batches=1", *extra]


def _flip(path: Path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = bytes(b ^ 0xFF for b in data[offset:offset + 4])
    path.write_bytes(bytes(data))


# ------------------------------------------------------------------ 1. Ctrl-C with the output pipe gone
def test_sigint_after_the_pipe_closed_still_checkpoints_and_exits_130(synth_dir, tmp_path):
    """`train ... 2>&1 | tee log`, Ctrl-C: tee dies first. Here the reader closes both pipes, then the run gets
    SIGINT: it must finish its step, write the interrupt checkpoint and exit 130 (not 1 on a BrokenPipeError)."""
    ckpt = tmp_path / "ckpt"
    argv = [*_train(synth_dir, tmp_path, "--steps", "100000", "--checkpoint-dir", str(ckpt), "--checkpoint-every",
                    "5", "--set", "eval_every=3")]
    argv[argv.index("--batch-size") + 1] = "64"
    argv.remove("--quiet")  # the progress bar writes too
    proc = subprocess.Popen([sys.executable, "-m", "fuselab", "dlrm", *argv], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while not (ckpt / "latest.json").is_file():
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        assert time.monotonic() - t0 < 240, "no checkpoint"
        time.sleep(0.05)
    proc.stdout.close()  # the reader is gone: every later write to stdout/stderr fails with EPIPE
    before = json.loads((ckpt / "latest.json").read_text())["step"]
    time.sleep(0.5)  # a few evaluations log into the closed pipe
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=240) == 130
    step = json.loads((ckpt / "latest.json").read_text())["step"]
    assert step >= before and verify_checkpoint(ckpt / f"ckpt-{step:08d}.pt")  # complete, with its manifest


# ------------------------------------------------------------------ 2. divergence
def test_divergence_stops_with_exit_3_and_writes_no_checkpoint(synth_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    code = main(_train(synth_dir, tmp_path, "--steps", "6", "--lr-dense", "1e30", "--checkpoint-dir", str(ckpt),
                       "--checkpoint-every", "2"))
    err = capsys.readouterr().err
    assert code == DIVERGED_EXIT == 3, err
    assert "training diverged" in err and "not finite (nan or inf) at step 2" in err and "learning rate" in err
    assert "Traceback" not in err
    assert not list(ckpt.glob("ckpt-*"))  # step 2's weights are not finite: never saved


def test_divergence_never_replaces_the_last_good_checkpoint(synth_dir, tmp_path):
    """The weights turn NaN in step 5: the checkpoints of steps 2 and 4 stay, none of step 6 is written, and the
    error names step 5 and the last good checkpoint."""

    class Poisoned(Trainer):
        def step(self, batch):
            loss = super().step(batch)
            if self.step_count == 5:
                with torch.no_grad():
                    # a weight with elements (the sparse arch's empty grad anchor holds none)
                    next(p for p in self.model.parameters() if p.numel()).fill_(float("nan"))
            return loss

    ckpt = tmp_path / "ckpt"
    cfg = load_config("tiny", ["steps=8", "batch_size=512", "eval_batches=1", "checkpoint_every=2"])
    with pytest.raises(TrainingDiverged) as info:
        Poisoned(cfg, synth_dir, RunOptions(checkpoint_dir=ckpt, progress=False), log=lambda *a: None).run()
    assert info.value.step in (5, 6)  # the weights after step 5 (checked at the checkpoint of step 6), or loss 6
    assert info.value.last_good == (ckpt / "ckpt-00000004.pt", 4)
    assert json.loads((ckpt / "latest.json").read_text())["step"] == 4
    assert sorted(p.name for p in ckpt.glob("ckpt-*.pt")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    assert verify_checkpoint(ckpt / "ckpt-00000004.pt")
    assert f"the last checkpoint, {ckpt / 'ckpt-00000004.pt'} (step 4), holds finite weights" in str(info.value)


# ------------------------------------------------------------------ 3. damaged checkpoints
@pytest.fixture
def two_checkpoints(synth_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    assert main(_train(synth_dir, tmp_path, "--steps", "4", "--checkpoint-dir", str(ckpt), "--checkpoint-every",
                       "2")) == 0
    assert sorted(p.name for p in ckpt.glob("ckpt-*.pt")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    return ckpt


def test_a_damaged_checkpoint_is_named_by_evaluate_export_and_resume(synth_dir, tmp_path, two_checkpoints, capsys):
    ckpt = two_checkpoints
    damaged = ckpt / "ckpt-00000004.pt"
    _flip(damaged)
    capsys.readouterr()
    for argv in (["evaluate", str(ckpt), "--data", str(synth_dir)], ["evaluate", str(damaged), "--data",
                                                                       str(synth_dir)],
                 ["export", "--checkpoint", str(ckpt), "--onnx", str(tmp_path / "m.onnx"), "--no-check"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{damaged} is damaged" in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "m.onnx").exists()
    # resuming "the latest" takes the previous complete checkpoint, with a warning
    assert main(_train(synth_dir, tmp_path, "--steps", "6", "--checkpoint-dir", str(ckpt), "--resume",
                       "--json", str(tmp_path / "r.json"))) == 0
    out = capsys.readouterr().out
    assert f"warning: {damaged} is damaged" in out
    assert f"resuming from the previous complete checkpoint {ckpt / 'ckpt-00000002.pt'} (step 2)" in out
    assert json.loads((tmp_path / "r.json").read_text())["first_step"] == 2
    # naming the damaged file itself: refused, no fallback
    assert main(_train(synth_dir, tmp_path, "--steps", "6", "--resume", str(damaged))) == 2


def test_a_truncated_or_missing_manifest(synth_dir, tmp_path, two_checkpoints, capsys):
    ckpt = two_checkpoints
    latest = ckpt / "ckpt-00000004.pt"
    latest.write_bytes(latest.read_bytes()[:-100])
    assert main(["evaluate", str(latest), "--data", str(synth_dir)]) == 2
    assert "truncated or replaced" in capsys.readouterr().err
    manifest_path(latest).unlink()  # a file copied alone: loaded, with a warning that it is not checked
    older = ckpt / "ckpt-00000002.pt"
    manifest_path(older).write_text("{not json")
    assert main(["evaluate", str(older), "--data", str(synth_dir)]) == 2
    assert f"checkpoint manifest {manifest_path(older)} is damaged" in capsys.readouterr().err


# ------------------------------------------------------------------ 4. a full disk during a checkpoint
def _disk_full_after(monkeypatch, written: int) -> None:
    """torch.save writes ``written`` bytes, then the disk is full: the OSError in the chain of torch's RuntimeError,
    as PyTorch's stream writer raises it."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if not hasattr(f, "write"):
            return real_save(obj, f, *args, **kwargs)
        f.write(b"\0" * written)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc] PytorchStreamWriter failed writing file "
                               "data/0: file write failed") from None

    monkeypatch.setattr(torch, "save", save)


def test_full_disk_during_a_checkpoint_names_the_space_and_keeps_the_previous(synth_dir, tmp_path, monkeypatch,
                                                                             capsys):
    ckpt = tmp_path / "ckpt"
    assert main(_train(synth_dir, tmp_path, "--steps", "2", "--checkpoint-dir", str(ckpt))) == 0
    capsys.readouterr()
    _disk_full_after(monkeypatch, 1000)
    code = main(_train(synth_dir, tmp_path, "--steps", "4", "--checkpoint-dir", str(ckpt), "--resume"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"no space left on the device for checkpoint {ckpt / 'ckpt-00000004.pt'}: it needs about" in err
    assert f"free in {ckpt}" in err
    assert f"the previous checkpoint {ckpt / 'ckpt-00000002.pt'} (step 2) is intact" in err
    assert sorted(p.name for p in ckpt.iterdir()) == ["ckpt-00000002.json", "ckpt-00000002.pt", "latest.json"]


def test_too_little_space_is_found_before_writing(synth_dir, tmp_path, monkeypatch, capsys):
    import shutil as real_shutil

    from fuselab import _io

    usage = real_shutil.disk_usage(tmp_path)

    class Fake:
        @staticmethod
        def disk_usage(path):
            return usage._replace(free=4096)

    ckpt = tmp_path / "ckpt"
    monkeypatch.setattr(_io, "shutil", Fake)
    assert main(_train(synth_dir, tmp_path, "--steps", "2", "--checkpoint-dir", str(ckpt))) == 2
    err = capsys.readouterr().err
    assert "no space for checkpoint" in err and "4.0 KiB are free" in err and "there is no earlier checkpoint" in err
    assert not list(ckpt.iterdir())


# ------------------------------------------------------------------ 5. temporary files of a killed write
def test_temp_files_of_a_killed_checkpoint_write_are_removed_by_the_next_run(synth_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    # a run killed (SIGKILL) in the middle of writing its checkpoint at step 2
    code = ("import os, signal, sys, torch\n"
            "def dying_save(obj, f, *a, **k):\n"
            "    f.write(b'x' * 4096); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
            "torch.save = dying_save\n"
            "from fuselab.dlrm.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *_train(synth_dir, tmp_path, "--steps", "2",
                                                                "--checkpoint-dir", str(ckpt))],
                          env=ENV, capture_output=True, timeout=240)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode(errors="replace")
    left = [p.name for p in ckpt.iterdir()]
    assert len(left) == 1 and left[0].startswith(".ckpt-00000002.pt.") and left[0].endswith(".tmp"), left
    # not ours to remove: another program's file, and a temp file of a process that is alive
    foreign = ckpt / ".ckpt-00000002.pt.notes.tmp"
    foreign.write_text("x")
    live = ckpt / f".ckpt-00000009.pt.{os.getppid()}.abcdefgh.tmp"
    live.write_text("x")
    assert main(_train(synth_dir, tmp_path, "--steps", "2", "--checkpoint-dir", str(ckpt))) == 0
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [foreign.name, live.name, "ckpt-00000002.json", "ckpt-00000002.pt", "latest.json"])
