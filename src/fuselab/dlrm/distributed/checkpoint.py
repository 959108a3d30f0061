"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), loadable at another world size.

Layout under ``root``::

    step-00000100/          one complete checkpoint (DCP files: every rank writes its own rows)
        .metadata           DCP's index (written last by DCP)
        meta.json           step, world size, the plan, the caller's ``extra``
    latest                  the name of the newest complete checkpoint (written last, atomically)

Embedding tables are stored as logically whole tensors, ``emb/t<table>/weight`` ``(rows, D)`` and
``emb/t<table>/state`` (the optimizer state, ``(rows,)`` or ``(rows, D)``): each rank contributes its row ranges
as a ``ShardedTensor`` (shard offsets = the rows' global offsets), so DCP records which rows each file holds and a
loader with another plan (other world size) reads exactly its rows from whichever files hold them. The dense
module and its optimizer are replicated; DCP writes them once.

Atomicity: DCP writes into ``.tmp-step-N``; after every rank has finished, the ranks hash the files (each a share
of them), rank 0 writes ``meta.json`` (with ``files``: ``{name: {"bytes", "sha256"}}`` of every other file of the
folder), renames the folder to ``step-N`` and then replaces ``latest``. A crash at any point leaves the previous
``latest`` and its folder intact; the ``.tmp-step-*`` folders it leaves are removed by the next run
(:func:`clean_root`). The folder must be on a file system every rank sees (one host, or a shared one).

Integrity: every load checks the files against ``meta.json`` (the ranks share the hashing) and names a damaged
file (:class:`~fuselab.dlrm.integrity.DamagedCheckpoint`); loading "the latest" with ``fallback`` takes the newest
intact checkpoint instead, with a warning. A full disk is checked before the save (the ranks' bytes against the
free space) and recognised during it (:class:`~fuselab._io.NoSpaceError`, naming the previous checkpoint, which
is left as it was).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard as TensorShard
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fuselab._io import NoSpaceError, atomic_write_json, atomic_write_text

from ..integrity import DamagedCheckpoint
from .checkpoint_files import (
    LATEST,
    barrier,
    clean_root,
    file_records,
    gathered,
    is_distributed,
    local_bytes,
    no_space_in,
    on_rank0,
    previous_text,
    rank_world,
    space_error,
    verify_checkpoint,
)
from .embedding import ShardedEmbeddingCollection

__all__ = ["LATEST", "clean_root", "embedding_state", "latest_checkpoint", "load_checkpoint", "resolve_intact",
           "save_checkpoint", "verify_checkpoint"]


def _placement(rank: int, device: torch.device) -> str:
    # this rank's device for every shard: ShardedTensor checks only the local shards' placements
    return f"rank:{rank}/{device}"


def _sharded(local: list[tuple[int, Tensor]], shards: list[tuple[int, int, int]], full: tuple[int, ...],
             device: torch.device, dtype: torch.dtype) -> ShardedTensor:
    """A ShardedTensor of global shape ``full`` from this rank's (row_start, rows view) and every shard's (rank,
    row_start, rows) (no communication: the plan gives the global layout)."""
    tail = list(full[1:])

    def meta(rank: int, start: int, rows: int) -> ShardMetadata:
        return ShardMetadata([start] + [0] * len(tail), [rows, *tail], _placement(rank, device))

    global_meta = ShardedTensorMetadata([meta(r, s, n) for r, s, n in shards], torch.Size(full),
                                        TensorProperties(dtype=dtype))
    mine = [TensorShard(view, meta(dist.get_rank(), start, view.shape[0])) for start, view in local]
    return ShardedTensor._init_from_local_shards_and_global_metadata(mine, global_meta)


def embedding_state(sparse: ShardedEmbeddingCollection) -> dict[str, Any]:
    """``{"t<table>/weight": ..., "t<table>/state": ...}``: ShardedTensors over this rank's rows when distributed,
    else plain whole tensors (one rank holds every row). Views: loading into them writes the module."""
    plan, dim = sparse.plan, sparse.dim
    local: dict[int, list[tuple[int, Tensor, Tensor | None]]] = {}
    for shard, weight, state in sparse.shard_states():
        local.setdefault(shard.table, []).append((shard.row_start, weight, state))
    out: dict[str, Any] = {}
    replicas = [] if sparse.replicas is None else sparse.replicas.table_states()
    for t, weight, state in replicas:  # every rank holds them: plain tensors, which DCP saves once
        out[f"t{t}/weight"] = weight
        if state is not None:
            out[f"t{t}/state"] = state
    for t, n in enumerate(plan.table_sizes):
        if t in plan.replicated:
            continue
        mine = local.get(t, [])
        layout = [(s.rank, s.row_start, s.rows) for s in plan.shards_of_table(t)]
        template = sparse.local.state if sparse.local is not None else None
        has_state = template is not None and template.numel() > 0
        if not is_distributed():
            (_, weight, state), = mine  # one rank: the table is one shard
            out[f"t{t}/weight"] = weight
            if has_state:
                out[f"t{t}/state"] = state
            continue
        device = sparse.local.weight.device if sparse.local is not None else sparse.shard_table.device
        out[f"t{t}/weight"] = _sharded([(s, w) for s, w, _ in mine], layout, (n, dim), device, torch.float32)
        if has_state:
            shape = (n, *template.shape[1:])
            out[f"t{t}/state"] = _sharded([(s, m) for s, _, m in mine], layout, shape, device, template.dtype)
    return out


#: the dense optimizer: a torch optimizer, or its state tensors by name (replicated, e.g. the foreach Adagrad's)
DenseOptimizer = torch.optim.Optimizer | dict[str, Tensor] | None


def _state(sparse: ShardedEmbeddingCollection, dense: nn.Module, optimizer: DenseOptimizer) -> dict:
    if isinstance(optimizer, dict):  # tensors loaded in place
        return {"emb": embedding_state(sparse), "dense": dense.state_dict(), "dense_optim": dict(optimizer)}
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(dense, optimizer)
        # the tensors only: param_groups (lr, momentum, ...) come from the caller's config and schedule
        return {"emb": embedding_state(sparse), "dense": model_sd, "dense_optim": {"state": optim_sd["state"]},
                "_param_groups": optim_sd["param_groups"]}
    return {"emb": embedding_state(sparse), "dense": dense.state_dict()}


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence DCP's notes that are expected here: the ShardedTensor deprecation (it stays the one layout DCP
    reshards with arbitrary row ranges) and "assuming ... a single process" (one rank, no process group)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecating ShardedTensor.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process.*")
        yield


def save_checkpoint(root: str | os.PathLike, step: int, sparse: ShardedEmbeddingCollection, dense: nn.Module,
                    optimizer: DenseOptimizer = None, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Save a complete checkpoint of ``step`` under ``root`` (collective: every rank calls it) and point
    ``latest`` at it; keep the newest ``keep`` checkpoints (``0``: keep all). ``dense`` is the unwrapped dense module
    (not the DDP wrapper); ``extra`` (JSON-serialisable: data position, RNG seeds, schedule) is saved in
    ``meta.json``. Returns the checkpoint folder. Raises ``ValueError`` for a negative step,
    :class:`~fuselab._io.NoSpaceError` on every rank when the disk is (or gets) full."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    root = Path(root)
    name = f"step-{step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    rank, _ = rank_world()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash during an earlier save of this step
    barrier()
    state = _state(sparse, dense, optimizer)
    state.pop("_param_groups", None)
    needed = sum(gathered(local_bytes(state, rank))) + (1 << 20)
    if min(gathered(shutil.disk_usage(root).free)) < needed:
        raise space_error(root, final, needed)
    try:
        with _quiet():
            dcp.save(state, checkpoint_id=tmp)
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if no_space_in(exc):
            raise space_error(root, final, needed) from None
        raise
    barrier()
    meta = {"step": step, "world_size": sparse.world, "plan": sparse.plan.to_dict(), "extra": extra or {},
            "files": file_records(tmp)}
    on_rank0(lambda: _publish(root, tmp, final, meta, keep))
    barrier()
    return final


def _publish(root: Path, tmp: Path, final: Path, meta: dict[str, Any], keep: int) -> None:
    """Rank 0: ``meta.json`` into the saved folder, the folder renamed into place, ``latest`` pointed at it, the
    oldest checkpoints removed."""
    try:
        atomic_write_json(tmp / "meta.json", meta, "checkpoint metadata", indent=None)
    except NoSpaceError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise NoSpaceError(f"{err}; {previous_text(root)}", err.needed, err.free, err.folder) from None
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / LATEST, final.name, "checkpoint pointer")
    if keep > 0:
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The folder ``latest`` names under ``root``, or None when there is none. Raises ``FileNotFoundError`` when
    ``latest`` names a missing folder."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / "meta.json").is_file():
        raise FileNotFoundError(f"{pointer} names {path}, which is not a complete checkpoint")
    return path


def _newest_intact(root: Path, skip: Path | None) -> Path | None:
    """The newest complete checkpoint folder under ``root`` whose files match its ``meta.json`` (collective)."""
    for folder in sorted(root.glob("step-*"), reverse=True):
        if folder == skip or not (folder / "meta.json").is_file():
            continue
        try:
            if verify_checkpoint(folder):
                return folder
        except DamagedCheckpoint:
            continue
    return None


def resolve_intact(path: str | os.PathLike, fallback: bool = False, log: Callable[[str], Any] = print) -> Path:
    """The checkpoint folder ``path`` names (a checkpoint folder, or a root: its ``latest``), checked against its
    ``meta.json`` (collective). For a root whose latest checkpoint is damaged or missing, ``fallback`` takes the
    newest intact one with a warning; without, :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` names the damaged
    file. A checkpoint whose ``meta.json`` records no checksums is used with a warning that it is unchecked."""
    path = Path(path)
    if (path / "meta.json").is_file():
        return _checked(path, log)
    found = None
    try:
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {path} (no meta.json, no {LATEST} pointer)")
        return _checked(found, log)
    except (FileNotFoundError, DamagedCheckpoint) as err:
        previous = _newest_intact(path, found) if fallback else None
        if previous is None:
            raise
        log(f"warning: {err}; resuming from the previous complete checkpoint {previous}")
        return previous


def _checked(folder: Path, log: Callable[[str], Any]) -> Path:
    if not verify_checkpoint(folder):
        log(f"warning: checkpoint {folder} records no checksums: loaded without checking it")
    return folder


def load_checkpoint(path: str | os.PathLike, sparse: ShardedEmbeddingCollection, dense: nn.Module,
                    optimizer: DenseOptimizer = None, *, fallback: bool = False,
                    log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Load a checkpoint folder, or the ``latest`` one of a root folder, into modules built for any world size
    with the same tables and dim (collective), after checking its files (:func:`resolve_intact`, ``fallback`` and
    ``log`` as there). Returns ``meta.json`` (``step``, ``world_size``, ``plan``, ``extra``) and ``path`` (the
    folder loaded). Raises ``FileNotFoundError`` when there is no checkpoint, ``ValueError`` when the tables differ,
    :class:`~fuselab.dlrm.integrity.DamagedCheckpoint` for a damaged one."""
    path = resolve_intact(path, fallback, log)
    meta = json.loads((path / "meta.json").read_text())
    saved = meta["plan"]
    if saved["table_sizes"] != sparse.plan.table_sizes or saved["dim"] != sparse.dim:
        raise ValueError(f"checkpoint {path} has tables {saved['table_sizes'][:8]} x D={saved['dim']}, the model "
                         f"{sparse.plan.table_sizes[:8]} x D={sparse.dim}")
    state = _state(sparse, dense, optimizer)
    groups = state.pop("_param_groups", None)
    with _quiet():
        dcp.load(state, checkpoint_id=path)
    if isinstance(optimizer, dict):
        dense.load_state_dict(state["dense"])
    elif optimizer is not None:
        optim_sd = {"state": state["dense_optim"]["state"], "param_groups": groups}
        set_state_dict(dense, optimizer, model_state_dict=state["dense"], optim_state_dict=optim_sd)
    else:
        dense.load_state_dict(state["dense"])
    barrier()
    return {**meta, "path": str(path)}
