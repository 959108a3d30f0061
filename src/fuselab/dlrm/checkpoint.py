"""Checkpoints: model, optimizers, data position, RNG states; written atomically (temp file + rename).

Layout of a checkpoint directory::

    ckpt-00001000.pt     one file per save (``keep`` most recent are kept)
    latest.json          {"path": "ckpt-00001000.pt", "step": 1000}, replaced atomically after each save
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1


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


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write ``payload`` (plus ``step``, RNG states) to ``directory/ckpt-<step>.pt`` atomically; update latest."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-{step:08d}.pt"
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"version": FORMAT_VERSION, "step": step, "rng": rng_state(), **payload}, tmp)
    os.replace(tmp, path)
    latest_tmp = folder / "latest.json.tmp"
    latest_tmp.write_text(json.dumps({"path": path.name, "step": step}))
    os.replace(latest_tmp, folder / "latest.json")
    if keep > 0:
        old = sorted(folder.glob("ckpt-*.pt"))[:-keep]
        for stale in old:
            stale.unlink(missing_ok=True)
    return path


def resolve_checkpoint(resume: str | Path, directory: str | Path | None) -> Path:
    """``resume`` is a file, a checkpoint directory, or ``"latest"`` (then ``directory`` is searched)."""
    if str(resume) == "latest":
        if directory is None:
            raise ValueError("--resume without a file needs --checkpoint-dir")
        resume = directory
    path = Path(resume)
    if path.is_dir():
        latest = path / "latest.json"
        if not latest.is_file():
            raise FileNotFoundError(f"no checkpoint in {path} (latest.json missing)")
        path = path / json.loads(latest.read_text())["path"]
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise ValueError(f"cannot read checkpoint {path}: {exc}") from None
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a fuselab DLRM checkpoint (version {FORMAT_VERSION})")
    return state
