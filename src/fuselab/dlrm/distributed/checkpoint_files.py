"""The files of a sharded checkpoint (:mod:`.checkpoint`): their checksums, the space a save needs, what a killed
save leaves behind, and the collectives these checks share between the ranks.

Every function that takes no ``rank`` argument is collective when a process group of several ranks is up: every
rank calls it with the same arguments and gets the same answer (or the same exception), so that no rank is left
waiting in a collective another rank skipped.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor
from torch.distributed._shard.sharded_tensor import ShardedTensor

from fuselab._io import NoSpaceError, PathError, fmt_bytes, read_json, remove_stale_temp_files

from .. import integrity
from ..integrity import DamagedCheckpoint

LATEST = "latest"


def is_distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)


def gathered(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (one process: ``[obj]``)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def on_rank0(fn: Callable[[], Any]) -> None:
    """Run ``fn`` on rank 0 and let every rank raise when it failed (collective: no rank is left waiting)."""
    rank, _ = rank_world()
    error = None
    try:
        if rank == 0:
            fn()
    except Exception as exc:  # raised again below, on every rank
        error = exc
    messages = gathered(None if error is None else str(error))
    if error is not None:
        raise error
    if messages[0] is not None:
        raise PathError(messages[0])


def file_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "meta.json")


def file_records(folder: Path) -> dict[str, Any]:
    """``{name: {"bytes", "sha256"}}`` of every file of ``folder`` but ``meta.json`` (collective: each rank hashes a
    share of the files)."""
    rank, world = rank_world()
    merged: dict[str, Any] = {}
    for part in gathered(integrity.records(folder, file_names(folder)[rank::world])):
        merged.update(part)
    return merged


def verify_checkpoint(path: str | os.PathLike) -> bool:
    """Check checkpoint folder ``path`` against its ``meta.json`` (collective: each rank hashes a share of the
    files): True when every file matches, False when ``meta.json`` records no checksums;
    :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` naming the first file that differs."""
    path = Path(path)
    try:
        meta = read_json(path / "meta.json", "checkpoint metadata")
        files = meta.get("files") if isinstance(meta, dict) else {}
    except PathError as err:
        raise DamagedCheckpoint(f"checkpoint {path}: {err}") from None
    if files is None:
        return False
    rank, world = rank_world()
    names = sorted(files) if isinstance(files, dict) else []
    local = [p for n in names[rank::world] if (p := integrity.problem(path, n, files[n])) is not None]
    problems = sorted(p for part in gathered(local) for p in part)
    if not names:
        problems = [f"checkpoint {path}: meta.json records no files"]
    if problems:
        raise DamagedCheckpoint(problems[0] + (f" (and {len(problems) - 1} more file(s))" if len(problems) > 1
                                               else ""))
    return True


def clean_root(root: str | os.PathLike) -> list[Path]:
    """Remove what killed saves left under ``root``: ``.tmp-step-*`` folders and the pointer's temporary files (call
    it on one rank, before this job's first save)."""
    root = Path(root)
    removed = []
    for tmp in sorted(root.glob(".tmp-step-*")):
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed + remove_stale_temp_files(root, LATEST)


def local_bytes(state: Any, rank: int) -> int:
    """Bytes this rank writes of ``state``: its shards, and (rank 0) the replicated tensors."""
    if isinstance(state, ShardedTensor):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in state.local_shards())
    if isinstance(state, Tensor):
        return state.numel() * state.element_size() if rank == 0 else 0
    if isinstance(state, dict):
        return sum(local_bytes(v, rank) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(local_bytes(v, rank) for v in state)
    return 0


def no_space_in(exc: BaseException) -> bool:
    """Whether ``exc`` (DCP wraps each rank's error in a ``CheckpointException``) comes from a full disk."""
    seen, todo = set(), [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        failures = getattr(err, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [err.__cause__, err.__context__]
    return "No space left on device" in str(exc)


def previous_text(root: Path) -> str:
    pointer = root / LATEST
    if pointer.is_file():
        return f"the previous checkpoint {root / pointer.read_text().strip()} is intact"
    return f"there is no earlier checkpoint in {root}"


def space_error(root: Path, final: Path, needed: int) -> NoSpaceError:
    free = shutil.disk_usage(root).free
    return NoSpaceError(f"no space left on the device for the sharded checkpoint {final}: it needs about "
                        f"{fmt_bytes(needed)}, {fmt_bytes(free)} are free in {root}; {previous_text(root)}",
                        needed, free, root)
