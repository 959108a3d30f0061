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

Atomicity: DCP writes into ``.tmp-step-N``; after every rank has finished, rank 0 writes ``meta.json``, renames
the folder to ``step-N`` and then replaces ``latest``. A crash at any point leaves the previous ``latest`` and its
folder intact. The folder must be on a file system every rank sees (one host, or a shared one).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
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

from .embedding import ShardedEmbeddingCollection

LATEST = "latest"


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


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
    for t, n in enumerate(plan.table_sizes):
        mine = local.get(t, [])
        layout = [(s.rank, s.row_start, s.rows) for s in plan.shards_of_table(t)]
        template = sparse.local.state if sparse.local is not None else None
        has_state = template is not None and template.numel() > 0
        if not _distributed():
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


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def save_checkpoint(root: str | os.PathLike, step: int, sparse: ShardedEmbeddingCollection, dense: nn.Module,
                    optimizer: DenseOptimizer = None, extra: dict[str, Any] | None = None,
                    keep: int = 2) -> Path:
    """Save a complete checkpoint of ``step`` under ``root`` (collective: every rank calls it) and point
    ``latest`` at it; keep the newest ``keep`` checkpoints (``0``: keep all). ``dense`` is the unwrapped dense module
    (not the DDP wrapper); ``extra`` (JSON-serialisable: data position, RNG seeds, schedule) is saved in
    ``meta.json``. Returns the checkpoint folder. Raises ``ValueError`` for a negative step."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    root = Path(root)
    name = f"step-{step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    rank = dist.get_rank() if _distributed() else 0
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash during an earlier save of this step
    _barrier()
    state = _state(sparse, dense, optimizer)
    state.pop("_param_groups", None)
    with _quiet():
        dcp.save(state, checkpoint_id=tmp)
    _barrier()
    if rank == 0:
        meta = {"step": step, "world_size": sparse.world, "plan": sparse.plan.to_dict(), "extra": extra or {}}
        (tmp / "meta.json").write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(name)
        os.replace(pointer, root / LATEST)
        if keep > 0:
            for old in sorted(root.glob("step-*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


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


def load_checkpoint(path: str | os.PathLike, sparse: ShardedEmbeddingCollection, dense: nn.Module,
                    optimizer: DenseOptimizer = None) -> dict[str, Any]:
    """Load a checkpoint folder, or the ``latest`` one of a root folder, into modules built for any world size
    with the same tables and dim (collective). Returns ``meta.json`` (``step``, ``world_size``, ``plan``,
    ``extra``). Raises ``FileNotFoundError`` when there is no checkpoint, ``ValueError`` when the tables differ."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"no checkpoint in {path} (no meta.json, no {LATEST} pointer)")
        path = found
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
    _barrier()
    return meta
