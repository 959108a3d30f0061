"""Sharded (DCP) checkpoints: every file's checksum in meta.json, checked on every load; a damaged latest
checkpoint named, or skipped for the previous one when resuming the latest; a full disk named with the space and
the previous checkpoint; what a killed save leaves removed. One process (the collectives are no-ops)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from dist_workers import BATCH, build, train_steps

from fuselab._io import NoSpaceError
from fuselab.dlrm.distributed import ParallelContext
from fuselab.dlrm.distributed import checkpoint as dckpt
from fuselab.dlrm.integrity import DamagedCheckpoint


@pytest.fixture
def saved(tmp_path):
    """Checkpoints of steps 2 and 4 under tmp_path/ck, and the model that wrote them."""
    ctx = ParallelContext(0, 1, 0, torch.device("cpu"), "none")
    model, opt = build(ctx, {"batch": BATCH})
    root = tmp_path / "ck"
    for step in (2, 4):
        train_steps(ctx, model, opt, step - 2, step, BATCH)
        dckpt.save_checkpoint(root, step, model.sparse, model.dense_module, opt)
    return ctx, root


def _load(ctx, path, **kw):
    model, opt = build(ctx, {"batch": BATCH})
    return dckpt.load_checkpoint(path, model.sparse, model.dense_module, opt, **kw)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_meta_json_records_every_file(saved):
    _, root = saved
    folder = root / "step-00000004"
    files = json.loads((folder / "meta.json").read_text())["files"]
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != "meta.json")
    assert sorted(files) == on_disk and ".metadata" in files and any(n.endswith(".distcp") for n in files)
    assert all(len(f["sha256"]) == 64 and f["bytes"] == (folder / n).stat().st_size for n, f in files.items())
    assert dckpt.verify_checkpoint(folder)


def test_a_damaged_file_is_named_and_latest_falls_back(saved):
    ctx, root = saved
    damaged = sorted((root / "step-00000004").glob("*.distcp"))[0]
    _flip(damaged)
    with pytest.raises(DamagedCheckpoint, match=f"{damaged} is damaged"):
        _load(ctx, root)
    with pytest.raises(DamagedCheckpoint, match=f"{damaged} is damaged"):  # the folder named: no fallback
        _load(ctx, root / "step-00000004", fallback=True)
    warnings: list[str] = []
    meta = _load(ctx, root, fallback=True, log=warnings.append)
    assert meta["step"] == 2 and meta["path"] == str(root / "step-00000002")
    assert len(warnings) == 1 and f"{damaged} is damaged" in warnings[0]
    assert f"resuming from the previous complete checkpoint {root / 'step-00000002'}" in warnings[0]


def test_missing_file_and_broken_meta(saved):
    ctx, root = saved
    (root / "step-00000004" / ".metadata").unlink()
    with pytest.raises(DamagedCheckpoint, match=r"\.metadata is missing"):
        _load(ctx, root)
    (root / "step-00000002" / "meta.json").write_text("{")
    with pytest.raises(DamagedCheckpoint, match="not valid JSON"):
        _load(ctx, root / "step-00000002")
    with pytest.raises(DamagedCheckpoint):  # no intact checkpoint left to fall back to
        _load(ctx, root, fallback=True, log=lambda m: None)


def test_full_disk_before_and_during_a_save(saved, monkeypatch):
    ctx, root = saved
    model, opt = build(ctx, {"batch": BATCH})
    usage = shutil.disk_usage(root)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1000))
    with pytest.raises(NoSpaceError, match=f"sharded checkpoint {root / 'step-00000006'}: it needs about") as info:
        dckpt.save_checkpoint(root, 6, model.sparse, model.dense_module, opt)
    assert f"the previous checkpoint {root / 'step-00000004'} is intact" in str(info.value)
    monkeypatch.undo()

    from torch.distributed.checkpoint.api import CheckpointException

    def full(state, checkpoint_id):
        Path(checkpoint_id).mkdir(parents=True, exist_ok=True)
        (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"x" * 100)
        raise CheckpointException("save failed", {0: (OSError(errno.ENOSPC, "No space left on device"), None)})

    monkeypatch.setattr(dckpt.dcp, "save", full)
    with pytest.raises(NoSpaceError, match="no space left on the device"):
        dckpt.save_checkpoint(root, 6, model.sparse, model.dense_module, opt)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000004"]
    assert dckpt.verify_checkpoint(root / "step-00000004")


def test_what_a_killed_save_left_is_removed(saved):
    _, root = saved
    (root / ".tmp-step-00000006").mkdir()
    (root / ".tmp-step-00000006" / "__0_0.distcp").write_bytes(b"partial")
    dead = _dead_pid()
    (root / f".latest.{dead}.abcdefgh.tmp").write_text("step-00000006")
    (root / "notes.tmp").write_text("not ours")
    removed = dckpt.clean_root(root)
    assert sorted(p.name for p in removed) == [f".latest.{dead}.abcdefgh.tmp", ".tmp-step-00000006"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "notes.tmp", "step-00000002", "step-00000004"]


def _dead_pid() -> int:
    """The id of a process that has ended."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""}, check=True)
    return int(proc.stdout)
