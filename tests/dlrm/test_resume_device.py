"""Exact resume (schedule included) for every optimizer, device-resident data vs the streaming loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.device import DeviceBatches
from fuselab.dlrm.data.loader import BatchLoader, open_dataset
from fuselab.dlrm.train import train
from fuselab.dlrm.trainer import RunOptions, Trainer

# warm-up over the first 4 steps, decay from step 8 to 0 at step 20: the resume at step 10 is inside the decay
SCHEDULE = ["warmup_steps=4", "decay_start_step=8", "decay_steps=12", "decay_power=2"]


def _quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_resume_continues_losses_and_schedule_exactly(synth_dir, tmp_path, optimizer):
    over = [f"optimizer={optimizer}", "batch_size=8192", "steps=18", "eval_batches=1", *SCHEDULE]
    straight = train(load_config("tiny", over), synth_dir, progress=False, log=_quiet)
    ckpt = tmp_path / "ckpt"
    train(load_config("tiny", [*over, "steps=10"]), synth_dir, checkpoint_dir=ckpt, progress=False, log=_quiet)
    resumed = train(load_config("tiny", over), synth_dir, checkpoint_dir=ckpt, resume="latest", progress=False,
                    log=_quiet)
    assert (resumed["first_step"], resumed["steps"], resumed["steps_this_run"]) == (10, 18, 8)
    assert resumed["losses"] == straight["losses"][10:]  # bitwise on the CPU
    for a, b in zip(resumed["model"].parameters(), straight["model"].parameters(), strict=True):
        assert torch.equal(a, b)


def test_trainer_applies_the_schedule_per_step(synth_dir):
    cfg = load_config("tiny", ["optimizer=sgd", "lr_dense=0.4", "lr_sparse=0.8", "batch_size=4096", "steps=6",
                               *SCHEDULE])
    trainer = Trainer(cfg, synth_dir, RunOptions(progress=False), log=_quiet).build()
    batches = trainer.train_batches.epoch(0)
    seen = []
    for _ in range(5):
        trainer.step(next(batches))
        seen.append((float(trainer.optimizers.lr["dense"]), float(trainer.optimizers.lr["sparse"])))
    batches.close()
    assert seen == [(0.4 * f, 0.8 * f) for f in (0.25, 0.5, 0.75, 1.0, 1.0)]


@pytest.mark.parametrize("shuffle", ["none", "batch"])
def test_device_batches_equal_the_streaming_loader(synth_dir, shuffle, monkeypatch):
    monkeypatch.setattr(DeviceBatches, "LOAD_ROWS", 6999)  # loaded in 9 blocks, the last one short
    ds = open_dataset(synth_dir)
    stream = BatchLoader(ds, 1000, 61_000, 7000, "cpu", shuffle=shuffle, seed=3, drop_last=True, prefetch=0)
    held = DeviceBatches(ds, 1000, 61_000, 7000, "cpu", shuffle=shuffle, seed=3, drop_last=True,
                         max_id=int(max(ds.cardinalities)))
    assert len(held) == len(stream) == 8 and held.sparse.dtype == torch.int32  # ids fit int32
    for epoch in (0, 1):
        for a, b in zip(held.epoch(epoch, 2), stream.epoch(epoch, 2), strict=True):
            assert torch.equal(a.dense, b.dense) and torch.equal(a.sparse, b.sparse)
            assert torch.equal(a.labels, b.labels) and a.sparse.dtype == torch.int64


def test_device_row_shuffle_covers_each_row_once_and_repeats(synth_dir):
    ds = open_dataset(synth_dir)
    held = DeviceBatches(ds, 1000, 61_000, 7000, "cpu", shuffle="row", seed=3)
    first = list(held.epoch(1))
    assert sorted(len(b) for b in first) == [4000] + [7000] * 8
    labels = ds.read_column("labels", 1000, 61_000)
    assert torch.cat([b.labels for b in first]).sum().item() == labels.sum()
    dense = torch.cat([b.dense for b in first])
    order = np.lexsort(dense.numpy().T[::-1])  # the same multiset of rows
    want = ds.read_column("dense", 1000, 61_000)
    np.testing.assert_array_equal(dense.numpy()[order], want[np.lexsort(want.T[::-1])])
    again = list(held.epoch(1, start_batch=3))  # a function of (seed, epoch): resume sees the same batches
    assert all(torch.equal(a.sparse, b.sparse) for a, b in zip(again, first[3:], strict=True))
    other = next(iter(held.epoch(2)))
    assert not torch.equal(other.sparse, first[0].sparse)


def test_data_on_device_trains_like_streaming_and_resumes(synth_dir, tmp_path):
    over = ["batch_size=8192", "steps=16", "eval_batches=1", "shuffle=batch", *SCHEDULE]
    streaming = train(load_config("tiny", over), synth_dir, progress=False, log=_quiet)
    held = train(load_config("tiny", [*over, "data_on_device=true"]), synth_dir, progress=False, log=_quiet)
    assert held["losses"] == streaming["losses"]
    ckpt = tmp_path / "ckpt"
    row = [*over, "data_on_device=true", "shuffle=row"]
    straight = train(load_config("tiny", row), synth_dir, progress=False, log=_quiet)
    train(load_config("tiny", [*row, "steps=7"]), synth_dir, checkpoint_dir=ckpt, progress=False, log=_quiet)
    resumed = train(load_config("tiny", row), synth_dir, checkpoint_dir=ckpt, resume="latest", progress=False,
                    log=_quiet)
    assert resumed["losses"] == straight["losses"][7:]


def test_resume_keeps_the_checkpoints_schedule(synth_dir, tmp_path):
    over = ["optimizer=sgd", "batch_size=8192", "steps=14", "eval_batches=1", *SCHEDULE]
    straight = train(load_config("tiny", over), synth_dir, progress=False, log=_quiet)
    ckpt = tmp_path / "ckpt"
    train(load_config("tiny", [*over, "steps=6"]), synth_dir, checkpoint_dir=ckpt, progress=False, log=_quiet)
    logs: list[str] = []
    changed = load_config("tiny", [*over, "warmup_steps=0", "decay_steps=0"])
    resumed = train(changed, synth_dir, checkpoint_dir=ckpt, resume="latest", progress=False, log=logs.append)
    assert any("keeping the learning-rate schedule" in line for line in logs)
    assert resumed["losses"] == straight["losses"][6:]
