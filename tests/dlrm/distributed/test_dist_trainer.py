"""`fuselab dlrm train --nproc N` end to end on CPU processes (gloo): the hybrid-parallel loss curve equals one
process on the same global batches, a checkpoint written at 2 ranks resumes at 1, a signal stops every rank at one
step with a checkpoint, a killed rank stops the job and leaves the last checkpoint resumable, bad input is named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuselab.dlrm.cli import _without_nproc, main
from fuselab.dlrm.distributed.hybrid import HybridParallel
from fuselab.dlrm.trainer import Trainer

SRC = Path(__file__).resolve().parents[3] / "src"
#: a short run: global batch 256 (128 per rank at 2 ranks), a checkpoint every 8 steps
RUN = ["--batch-size", "256", "--device", "cpu", "--quiet", "--set", "eval_batches=1", "--set",
       "eval_batch_size=1000", "--set", "warmup_steps=4"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}


def _fuselab(argv: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fuselab", "dlrm", "train", *argv], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _losses(path: Path) -> list[float]:
    return json.loads(path.read_text())["losses"]


def _close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) > 0
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    assert worst < 1e-5, f"loss curves differ by up to {worst:.2e} (relative)"


@pytest.mark.slow
def test_two_ranks_train_like_one_and_resume_at_one(synth_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    two = _fuselab(["--nproc", "2", "--data", str(synth_dir), "--steps", "24", *RUN, "--checkpoint-dir", str(ckpt),
                    "--checkpoint-every", "12", "--run-dir", str(tmp_path / "run2"),
                    "--json", str(tmp_path / "2.json")])
    code, out, err = _finish(two)
    assert code == 0, err
    assert "x 2 ranks" in out and "sharding plan over 2 rank(s)" in out
    one = _fuselab(["--nproc", "1", "--data", str(synth_dir), "--steps", "24", *RUN,
                    "--run-dir", str(tmp_path / "run1"), "--json", str(tmp_path / "1.json")])
    code, _, err = _finish(one)
    assert code == 0, err
    straight = _losses(tmp_path / "1.json")
    _close(_losses(tmp_path / "2.json"), straight)
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000012", "step-00000024"]
    meta = json.loads((ckpt / "step-00000012" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["step"] == 12
    record = json.loads((tmp_path / "run2" / "run.json").read_text())
    assert record["world_size"] == 2 and record["summary"]["world_size"] == 2
    # the 2-rank checkpoint of step 12, resumed by one process: the uninterrupted curve from step 12 on
    resumed = _fuselab(["--nproc", "1", "--data", str(synth_dir), "--steps", "24", *RUN, "--resume",
                        str(ckpt / "step-00000012"), "--run-dir", str(tmp_path / "run3"),
                        "--json", str(tmp_path / "3.json")])
    code, out, err = _finish(resumed)
    assert code == 0, err
    assert "steps 13-24 of the run" in out
    _close(_losses(tmp_path / "3.json"), straight[12:])


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    t0 = time.perf_counter()
    while not path.is_file():
        if proc.poll() is not None:
            pytest.fail(f"training ended early: {proc.communicate()}")
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            pytest.fail(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    """Process ids of ``pid``'s children (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _workers(launcher: int) -> list[int]:
    """The rank processes under a ``--nproc`` launcher (its children running ``-m fuselab``)."""
    out = []
    for pid in _children(launcher):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"fuselab" in cmd and b"-m" in cmd:
            out.append(pid)
    return out


def _long_run_checkpointed(synth_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A 2-rank run far longer than any test, once its first checkpoint (every 8 steps) is complete."""
    ckpt = tmp_path / "ckpt"
    proc = _fuselab(["--nproc", "2", "--data", str(synth_dir), "--steps", "100000", *RUN, "--checkpoint-dir",
                     str(ckpt), "--checkpoint-every", "8", "--run-dir", str(tmp_path / "run")])
    _wait_for(ckpt / "latest", proc)
    return proc, ckpt


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the rank processes through Linux /proc")
def test_sigterm_stops_every_rank_at_one_step_and_the_checkpoint_resumes(synth_dir, tmp_path):
    proc, ckpt = _long_run_checkpointed(synth_dir, tmp_path)
    proc.send_signal(signal.SIGTERM)  # the launcher forwards it to the ranks
    code, _, err = _finish(proc)
    assert code == 143, err
    assert "SIGTERM at step" in err and "--resume" in err
    name = (ckpt / "latest").read_text().strip()
    meta = json.loads((ckpt / name / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["step"] % HybridParallel.AGREE_EVERY == 0 and meta["step"] >= 8
    assert not list(ckpt.glob(".tmp-*"))
    again = _fuselab(["--nproc", "2", "--data", str(synth_dir), "--steps", str(meta["step"] + 2), *RUN,
                      "--checkpoint-dir", str(ckpt), "--resume", "--run-dir", str(tmp_path / "run")])
    code, out, err = _finish(again)
    assert code == 0, err
    assert f"steps {meta['step'] + 1}-{meta['step'] + 2} of the run" in out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the rank processes through Linux /proc")
def test_a_killed_rank_stops_the_job_and_the_last_checkpoint_resumes(synth_dir, tmp_path):
    proc, ckpt = _long_run_checkpointed(synth_dir, tmp_path)
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[-1], signal.SIGKILL)
    code, _, err = _finish(proc)
    assert code != 0
    assert "training on 2 processes failed" in err
    name = (ckpt / "latest").read_text().strip()
    step = json.loads((ckpt / name / "meta.json").read_text())["step"]
    resumed = _fuselab(["--nproc", "1", "--data", str(synth_dir), "--steps", str(step + 2), *RUN,
                        "--checkpoint-dir", str(ckpt), "--resume", "--run-dir", str(tmp_path / "run")])
    code, out, err = _finish(resumed)
    assert code == 0, err
    assert f"steps {step + 1}-{step + 2} of the run" in out


def test_bad_nproc_and_batch(synth_dir, tmp_path, capsys, monkeypatch):
    assert main(["train", "--nproc", "0", "--data", str(synth_dir), "--run-dir", str(tmp_path)]) == 2
    assert "argument --nproc: expected an integer >= 1" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--nproc", "2", "--data", str(synth_dir), "--run-dir", str(tmp_path)]) == 2
    assert "drop it when running under torchrun" in capsys.readouterr().err
    assert _without_nproc(["dlrm", "train", "--nproc", "2", "--steps", "3", "--nproc=4"]) == [
        "dlrm", "train", "--steps", "3"]


def test_global_batch_must_divide_over_the_ranks(synth_dir, tmp_path):
    import torch

    from fuselab.dlrm.config import load_config
    from fuselab.dlrm.distributed import ParallelContext

    two = ParallelContext(0, 2, 0, torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match="multiple of the 2 ranks"):
        Trainer(load_config("tiny", batch_size=255, device="cpu"), synth_dir, parallelism=HybridParallel(two))


@pytest.mark.slow
def test_dcn_multi_hot_two_ranks_train_like_one(tmp_path):
    """The DLRM-DCNv2 config (fixed-size bags through the static exchange, the cross network data-parallel) at 2
    ranks gives the 1-rank loss curve."""
    from fuselab.dlrm.config import load_config
    from fuselab.dlrm.data.synth import SynthSpec, write_synthetic

    cfg = load_config("mlperf-v2")
    cards = tuple(max(2, round(n * 1e-5)) for n in cfg.cardinalities)
    write_synthetic(tmp_path / "data", SynthSpec(rows=20_000, seed=4, cardinalities=cards,
                                                 multi_hot_sizes=tuple(cfg.multi_hot_sizes)), workers=1)
    small = ["--config", "mlperf-v2", "--data", str(tmp_path / "data"), "--steps", "12", *RUN, "--set",
             "embedding_dim=4", "--set", "bottom_mlp=[8,4]", "--set", "top_mlp=[8,1]", "--set", "dcn_low_rank=2",
             "--precision", "fp32"]
    for n in (1, 2):
        code, _, err = _finish(_fuselab(["--nproc", str(n), *small, "--run-dir", str(tmp_path / f"run{n}"),
                                         "--json", str(tmp_path / f"{n}.json")]))
        assert code == 0, err
    _close(_losses(tmp_path / "2.json"), _losses(tmp_path / "1.json"))
