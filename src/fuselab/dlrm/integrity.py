"""Checksums of checkpoint files: recorded when a checkpoint is saved, verified every time one is loaded.

A checkpoint records, for each of its files, ``{"bytes": size, "sha256": hex digest}`` (the single-process
format in its manifest ``ckpt-<step>.json``, the sharded format in its ``meta.json``). :func:`verify` compares the
files on disk with that record and raises :class:`DamagedCheckpoint` naming the first file that differs (missing,
another size, another digest), so a flipped byte, a truncated copy or a file swapped for another is found before
the weights reach a model. The digests are SHA-256: ``sha256sum`` checks them by hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: bytes read at a time while hashing
_CHUNK = 1 << 22


class DamagedCheckpoint(ValueError):
    """A checkpoint whose files differ from what was recorded when it was saved (or whose record is missing or
    unreadable); the message names the file."""


def file_record(path: str | Path) -> dict[str, Any]:
    """``{"bytes": ..., "sha256": ...}`` of the file at ``path``."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": digest.hexdigest()}


def records(folder: str | Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """:func:`file_record` of each of ``names`` in ``folder``, by name."""
    return {name: file_record(Path(folder) / name) for name in names}


def problem(folder: str | Path, name: str, recorded: Any) -> str | None:
    """Why file ``name`` of ``folder`` differs from ``recorded`` (None: it matches)."""
    path = Path(folder) / name
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sha256"), str) or not isinstance(
            recorded.get("bytes"), int):
        return f"{path}: no valid checksum recorded for it"
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != recorded.get("bytes"):
        return f"{path} has {size:,} bytes, {recorded.get('bytes'):,} when it was saved (truncated or replaced)"
    if file_record(path)["sha256"] != recorded["sha256"]:
        return f"{path} is damaged: its SHA-256 differs from the one recorded when it was saved"
    return None


def verify(folder: str | Path, recorded: Any, names: Iterable[str] | None = None) -> None:
    """Check the files of ``recorded`` (``{name: {"bytes", "sha256"}}``; ``names``: only those) in ``folder``;
    raise :class:`DamagedCheckpoint` naming the first that differs."""
    if not isinstance(recorded, dict) or not recorded:
        raise DamagedCheckpoint(f"checkpoint {folder}: no file checksums recorded")
    for name in recorded if names is None else names:
        reason = problem(folder, name, recorded.get(name))
        if reason is not None:
            raise DamagedCheckpoint(reason)
