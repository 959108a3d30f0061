"""Checkpoints: model, optimizers, data position, schedule, RNG states; every file written atomically.

Layout of a checkpoint directory::

    ckpt-00001000.pt     one file per save (``keep`` most recent are kept)
    latest.json          {"path": "ckpt-00001000.pt", "step": 1000}, replaced atomically after each save

A checkpoint file is complete or absent (temp file, fsync, rename), and ``latest.json`` is replaced only after
its checkpoint is on disk, so a process killed at any moment leaves the last complete checkpoint resumable.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fuselab._io import PathError, atomic_write, atomic_write_json, read_json, writable_dir

from .upgrade import upgrade_checkpoint

FORMAT_VERSION = 1
LATEST = "latest.json"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    # RNG states are CPU byte tensors; a checkpoint loaded with map_location="cuda" moved them
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def check_checkpoint_dir(directory: str | Path) -> Path:
    """Create ``directory`` if needed and check it is writable (:class:`~fuselab._io.PathError` naming it)."""
    return writable_dir(directory, "checkpoint folder")


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write ``payload`` (plus ``step``, RNG states) to ``directory/ckpt-<step>.pt`` atomically; update latest.

    Raises :class:`~fuselab._io.PathError` (naming the file) when the folder cannot be written.
    """
    folder = check_checkpoint_dir(directory)
    path = folder / f"ckpt-{step:08d}.pt"
    state = {"version": FORMAT_VERSION, "step": step, "rng": rng_state(), **payload}
    atomic_write(path, lambda f: torch.save(state, f), "checkpoint")
    atomic_write_json(folder / LATEST, {"path": path.name, "step": step}, "checkpoint index")
    if keep > 0:
        for stale in sorted(folder.glob("ckpt-*.pt"))[:-keep]:
            if stale != path:
                stale.unlink(missing_ok=True)
    return path


def resolve_checkpoint(resume: str | Path, directory: str | Path | None) -> Path:
    """``resume`` is a checkpoint file, a checkpoint directory or its ``latest.json`` (the checkpoint that index
    names), or ``"latest"`` (then ``directory`` is searched).

    Raises ``ValueError`` for ``"latest"`` without a directory, ``FileNotFoundError`` for a missing file or index,
    :class:`~fuselab._io.PathError` (naming the file) for a corrupt ``latest.json``.
    """
    if str(resume) == "latest":
        if directory is None:
            raise ValueError("--resume without a file needs --checkpoint-dir")
        resume = directory
    path = Path(resume)
    if path.name == LATEST and path.is_file():
        path = path.parent
    if path.is_dir():
        latest = path / LATEST
        if not latest.is_file():
            raise FileNotFoundError(f"no checkpoint in {path} ({LATEST} missing)")
        index = read_json(latest, "checkpoint index")
        if not isinstance(index, dict) or not isinstance(index.get("path"), str):
            raise PathError(f"checkpoint index {latest} is not valid: expected {{\"path\": ..., \"step\": ...}}")
        path = path / index["path"]
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`; ``ValueError`` naming the file when it is not one."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise ValueError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                         ) from None
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a fuselab DLRM checkpoint (version {FORMAT_VERSION})")
    return upgrade_checkpoint(state)
