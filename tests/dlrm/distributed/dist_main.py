"""Run by the launcher test in every rank: join the group from torchrun's variables, all-reduce rank + 1 over the
embedding group, gather rank + 1 rows of ``rank`` from every rank, write ``<out>/rank<r>.json``."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fuselab.dlrm.distributed import gather_rows, init_from_env, shutdown

if __name__ == "__main__":
    ctx = init_from_env(backend="gloo", timeout_s=60)  # CPU processes, also on a GPU machine
    value = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(value, group=ctx.embedding_group)
    rows = gather_rows(torch.full((ctx.rank + 1, 2), ctx.rank, dtype=torch.int64))
    Path(sys.argv[1], f"rank{ctx.rank}.json").write_text(json.dumps(
        {"world": ctx.world_size, "sum": float(value), "backend": ctx.backend, "rows": rows.tolist()}))
    shutdown()
