"""Checkpoints: model, optimizers, data position, schedule, RNG states; every file written atomically and checked.

Layout of a checkpoint directory::

    ckpt-00001000.pt     one file per save (``keep`` most recent are kept)
    ckpt-00001000.json   its manifest: {"step": 1000, "files": {"ckpt-00001000.pt": {"bytes": ..., "sha256": ...}}}
    latest.json          {"path": "ckpt-00001000.pt", "step": 1000}, replaced atomically after each save

A checkpoint is complete when its file and its manifest are on disk: the file is written first (temp file, fsync,
rename), then the manifest, then ``latest.json``, so a process killed at any moment leaves the last complete
checkpoint resumable. Every load checks the file against its manifest (:mod:`.integrity`) and names a damaged one;
resuming "the latest" (:func:`open_checkpoint` with ``fallback``) then takes the previous complete checkpoint,
with a warning. A file without a manifest beside it (copied alone) is loaded with a warning that it is unchecked.
The temporary files of a write that was killed (SIGKILL, power loss) are removed by the next run
(:func:`check_checkpoint_dir`). A full disk is reported with the space needed and free, and the previous
checkpoint named (:class:`~fuselab._io.NoSpaceError`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fuselab._io import (
    NoSpaceError,
    PathError,
    atomic_write,
    atomic_write_json,
    read_json,
    remove_stale_temp_files,
    writable_dir,
)

from . import integrity
from .integrity import DamagedCheckpoint
from .upgrade import upgrade_checkpoint

FORMAT_VERSION = 1
LATEST = "latest.json"
#: names of the files a checkpoint folder holds (the temporary files of their writes are cleaned by this pattern)
FILE_PATTERN = "ckpt-*"


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


def clean_checkpoint_dir(directory: str | Path) -> list[Path]:
    """Remove the temporary files that killed writes of checkpoint files left in ``directory`` (only those of
    :func:`~fuselab._io.atomic_write`'s pattern for this folder's files, of processes that are gone)."""
    return [*remove_stale_temp_files(directory, FILE_PATTERN), *remove_stale_temp_files(directory, LATEST)]


def manifest_path(path: str | Path) -> Path:
    """The manifest beside checkpoint file ``path``."""
    return Path(path).with_suffix(".json")


def _tensor_bytes(obj: Any, seen: set[int]) -> int:
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = storage.data_ptr() if storage.data_ptr() else id(storage)
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def state_bytes(state: Any) -> int:
    """About the bytes ``torch.save(state)`` writes: the tensors' storages plus 1 MiB for the rest."""
    return _tensor_bytes(state, set()) + (1 << 20)


def _previous(folder: Path) -> str:
    """What a failed save leaves to resume from: the checkpoint ``latest.json`` names, or that there is none."""
    try:
        index = read_json(folder / LATEST, "checkpoint index")
        return f"the previous checkpoint {folder / index['path']} (step {index['step']}) is intact"
    except (PathError, KeyError, TypeError):
        return f"there is no earlier checkpoint in {folder}"


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write ``payload`` (plus ``step``, RNG states) to ``directory/ckpt-<step>.pt`` atomically, then its manifest;
    update latest; keep the ``keep`` newest checkpoints (0: all).

    Raises :class:`~fuselab._io.NoSpaceError` (the space needed and free, the previous checkpoint, which is left as
    it was) when the disk is full, :class:`~fuselab._io.PathError` (naming the file) when the folder cannot be
    written.
    """
    folder = check_checkpoint_dir(directory)
    path = folder / f"ckpt-{step:08d}.pt"
    state = {"version": FORMAT_VERSION, "step": step, "rng": rng_state(), **payload}
    try:
        atomic_write(path, lambda f: torch.save(state, f), "checkpoint", size_hint=state_bytes(state))
        manifest = {"version": FORMAT_VERSION, "step": step, "files": integrity.records(folder, [path.name])}
        atomic_write_json(manifest_path(path), manifest, "checkpoint manifest")
    except NoSpaceError as err:
        path.unlink(missing_ok=True)  # a file without its manifest is no checkpoint: give its space back
        raise NoSpaceError(f"{err}; {_previous(folder)}", err.needed, err.free, err.folder) from None
    atomic_write_json(folder / LATEST, {"path": path.name, "step": step}, "checkpoint index")
    if keep > 0:
        for stale in sorted(folder.glob("ckpt-*.pt"))[:-keep]:
            if stale != path:
                stale.unlink(missing_ok=True)
                manifest_path(stale).unlink(missing_ok=True)
    return path


def resolve_checkpoint(resume: str | Path, directory: str | Path | None) -> Path:
    """``resume`` is a checkpoint file, a checkpoint directory or its ``latest.json`` (the checkpoint that index
    names), or ``"latest"`` (then ``directory`` is searched).

    Raises ``ValueError`` for ``"latest"`` without a directory, ``FileNotFoundError`` for a missing file or index,
    :class:`~fuselab._io.PathError` (naming the file) for a corrupt ``latest.json``.
    """
    path = _folder_of(resume, directory)
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


def _folder_of(resume: str | Path, directory: str | Path | None) -> Path:
    """The path ``resume`` names: ``"latest"`` is ``directory``, a ``latest.json`` its folder."""
    if str(resume) == "latest":
        if directory is None:
            raise ValueError("--resume without a file needs --checkpoint-dir")
        resume = directory
    path = Path(resume)
    if path.name == LATEST and path.is_file():
        path = path.parent
    return path


def verify_checkpoint(path: str | Path) -> bool:
    """Check checkpoint file ``path`` against its manifest: True when it matches, False when it has no manifest;
    :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` naming the file when it differs or the manifest is
    unreadable."""
    path = Path(path)
    manifest = manifest_path(path)
    if not manifest.is_file():
        return False
    try:
        files = read_json(manifest, "checkpoint manifest").get("files")
    except (PathError, AttributeError):
        raise DamagedCheckpoint(f"checkpoint manifest {manifest} is damaged (not the JSON written at save time)"
                                ) from None
    integrity.verify(path.parent, files, [path.name])
    return True


def newest_intact(folder: str | Path, skip: Path | None = None) -> Path | None:
    """The newest checkpoint file of ``folder`` that has a manifest and matches it (``skip``: not this one)."""
    for candidate in sorted(Path(folder).glob("ckpt-*.pt"), reverse=True):
        if candidate == skip or not manifest_path(candidate).is_file():
            continue
        try:
            verify_checkpoint(candidate)
        except DamagedCheckpoint:
            continue
        return candidate
    return None


def _resolve_intact(resume: str | Path, directory: str | Path | None, fallback: bool, log: Callable[[str], Any]
                    ) -> tuple[Path, bool]:
    """(checkpoint file, verified) for ``resume``; see :func:`open_checkpoint`."""
    folder = _folder_of(resume, directory)
    if not folder.is_dir():  # a file named explicitly: that one, checked, no fallback
        path = resolve_checkpoint(folder, None)
        return path, verify_checkpoint(path)
    try:
        path = resolve_checkpoint(folder, None)
        return path, verify_checkpoint(path)
    except (DamagedCheckpoint, PathError, FileNotFoundError) as err:
        previous = newest_intact(folder, skip=_latest_named(folder))
        if previous is None:
            raise
        step = int(previous.stem.split("-")[1])
        if not fallback:
            raise DamagedCheckpoint(f"{err}; the newest intact checkpoint in {folder} is {previous} (step {step}): "
                                    "name it to use it") from None
        log(f"warning: {err}; resuming from the previous complete checkpoint {previous} (step {step})")
        return previous, True


def _latest_named(folder: Path) -> Path | None:
    """The file ``latest.json`` names (None: no readable index)."""
    try:
        name = read_json(folder / LATEST, "checkpoint index").get("path")
    except (PathError, AttributeError):
        return None
    return folder / name if isinstance(name, str) else None


def open_checkpoint(resume: str | Path, directory: str | Path | None = None, *, fallback: bool = False,
                    log: Callable[[str], Any] = print, map_location: str | torch.device = "cpu"
                    ) -> tuple[Path, dict[str, Any]]:
    """Resolve ``resume`` (:func:`resolve_checkpoint`), check it against its manifest and load it: ``(path,
    state)``.

    When ``resume`` names a folder (or its ``latest.json``, or ``"latest"``) whose latest checkpoint is damaged or
    missing: with ``fallback`` the newest intact one is loaded instead and a warning is logged; without, the
    :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` names the damaged file and the intact one. A checkpoint
    file without a manifest is loaded with a warning that it is unchecked."""
    path, verified = _resolve_intact(resume, directory, fallback, log)
    if not verified:
        log(f"warning: checkpoint {path} has no manifest ({manifest_path(path).name}) beside it: loaded without "
            "checking it")
    return path, load_checkpoint(path, map_location=map_location)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint` (not checked: :func:`open_checkpoint` checks); ``ValueError``
    naming the file when it is not one."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise ValueError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                         ) from None
    if not isinstance(state, dict) or state.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a fuselab DLRM checkpoint (version {FORMAT_VERSION})")
    return upgrade_checkpoint(state)
