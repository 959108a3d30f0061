"""Training: tiny reaches the generator's best AUC, checkpoints, options (resume: test_resume_device.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fuselab.dlrm.config import load_config
from fuselab.dlrm.train import train


def _quiet(*args, **kwargs):
    pass


def test_tiny_reaches_generator_best_auc(tmp_path):
    from fuselab.dlrm.data.synth import SynthSpec, write_synthetic

    write_synthetic(tmp_path, SynthSpec(rows=300_000, scale=1e-4, seed=1), shard_rows=1 << 17, workers=1)
    cfg = load_config("tiny", ["epochs=1.5"])  # bounded: 376 steps of 1024
    summary = train(cfg, tmp_path, progress=False, log=_quiet)
    best, auc = summary["best_auc"], summary["final"]["auc"]
    assert summary["steps"] == math.ceil(1.5 * (257_142 // 1024))
    assert 0.7 < best < 0.95
    assert auc > best - 0.02, f"AUC {auc:.4f} vs generator's best {best:.4f}"
    assert summary["losses"][-1] < summary["losses"][0]
    assert math.isfinite(summary["samples_per_s"])


def test_periodic_checkpoints_are_atomic_and_pruned(synth_dir, tmp_path):
    cfg = load_config("tiny", ["steps=9", "checkpoint_every=3", "batch_size=4096", "eval_batches=1"])
    train(cfg, synth_dir, checkpoint_dir=tmp_path, progress=False, log=_quiet)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-00000006.json", "ckpt-00000006.pt", "ckpt-00000009.json", "ckpt-00000009.pt",
                     "latest.json"]  # keep=2 (each with its manifest), no temp files left
    with pytest.raises(FileNotFoundError):
        train(cfg, synth_dir, resume=tmp_path / "missing.pt", progress=False, log=_quiet)


def test_bf16_breakdown_tensorboard_profile_and_eval_every(synth_dir, tmp_path):
    cfg = load_config("tiny", ["steps=8", "precision=bf16", "eval_every=4", "eval_batches=1", "batch_size=512"])
    logs = []
    summary = train(cfg, synth_dir, breakdown=True, tensorboard_dir=tmp_path / "tb", profile_dir=tmp_path / "prof",
                    progress=False, log=logs.append)
    assert all(math.isfinite(x) for x in summary["losses"])
    assert [e["step"] for e in summary["evals"]] == [4, 8]
    assert set(summary["breakdown_ms"]) == {"data", "step"}
    assert all(v >= 0 for v in summary["breakdown_ms"].values()) and summary["breakdown_ms"]["step"] > 0
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert (tmp_path / "prof" / "trace.json").stat().st_size > 0
    assert (tmp_path / "prof" / "kernels.txt").read_text().strip()
    assert list((tmp_path / "prof" / "tensorboard").glob("*.pt.trace.json*"))


def test_vocab_hashing(tmp_path):
    from fuselab.dlrm.data.synth import SynthSpec, write_synthetic
    from fuselab.dlrm.data.tsv import preprocess

    write_synthetic(tmp_path / "tsv", SynthSpec(rows=6000, scale=1e-4), fmt="tsv", shard_rows=3000, workers=1)
    preprocess(sorted((tmp_path / "tsv").glob("*.tsv")), tmp_path / "data", min_count=3)
    cfg = load_config("tiny", ["hashing=vocab", "steps=4", "batch_size=512"])
    summary = train(cfg, tmp_path / "data", progress=False, log=_quiet)
    meta = json.loads((tmp_path / "data" / "metadata.json").read_text())
    assert summary["table_sizes"] == [n + 1 for n in meta["vocab_sizes"]]
    assert summary["best_auc"] is None and 0 <= summary["final"]["auc"] <= 1


def test_train_rejects_a_cuda_device_without_cuda(synth_dir):

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="CUDA is not available"):
        train(load_config("tiny", ["device=cuda", "steps=1"]), synth_dir, progress=False, log=_quiet)
