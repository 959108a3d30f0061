"""Putting the owners' blocks of pooled rows back in table order: ways to write the DLRM exchange's last step.

After the all_to_all of :class:`fuselab.dlrm.distributed.embedding.ShardedEmbeddingCollection`'s static path, rank
r holds one block per owner q, ``(B, K_q, D)`` (q's tables for r's samples), back to back; the interaction wants
``(B, F, D)`` with the tables in their own order. Forward: that permutation; backward: its inverse on the gradient.
Same bytes in every formulation (read and write B x F x D elements once each way); they differ in the kernel
PyTorch picks:

* ``rows``: ``index_select(0)`` of the D-wide rows with a (B, F) row index; backward ``index_copy_(0)``;
* ``rows64``: the same with each row viewed as 64-bit words (D x 2 bytes / 8 per row for bf16);
* ``columns``: per owner, ``out.index_copy_(1, tables_q, block_q)``; backward ``index_select(1)`` into the flat
  buffer's block (``out=``);
* ``columns64``: ``columns`` on 64-bit words.

Default: the Kaggle split at 2 ranks (B = 65536, tables 13 + 13, D = 16, bf16). Time: ``triton.testing.do_bench``
medians; every formulation is checked equal to ``rows`` first. Results: ``--out DIR/table_order.json``.

    python3 benchmarks/table_order.py --out benchmarks/results/h200     # one GPU, seconds
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

import torch

from fuselab import envinfo
from fuselab._io import atomic_write_json, writable_dir


def _words(t: torch.Tensor, wide: bool) -> torch.Tensor:
    """``t`` with its last dim viewed as 64-bit words when ``wide`` (its bytes allow it)."""
    return t.view(torch.int64) if wide else t


def make_case(batch: int, owners: list[list[int]], dim: int, dtype: torch.dtype, device: str) -> dict:
    tables = sorted(f for ts in owners for f in ts)
    assert tables == list(range(len(tables))), "owners must hold every table once"
    counts = [len(ts) for ts in owners]
    flat = torch.randn(batch * sum(counts) * dim, device=device).to(dtype)
    grad = torch.randn(batch, len(tables), dim, device=device).to(dtype)
    # rows: (B, F) index into flat viewed as (rows, D): owner q's block starts at B * (tables before q)
    block_start, width, local = {}, {}, {}
    for q, ts in enumerate(owners):
        for k, f in enumerate(ts):
            block_start[f], width[f], local[f] = sum(counts[:q]), counts[q], k
    vec = lambda d: torch.tensor([d[f] for f in tables], device=device)
    row_index = batch * vec(block_start) + torch.arange(batch, device=device)[:, None] * vec(width) + vec(local)
    table_index = [torch.tensor(ts, device=device) for ts in owners]
    return {"flat": flat, "grad": grad, "row_index": row_index, "table_index": table_index, "counts": counts,
            "batch": batch, "dim": dim}


def rows_forward(c: dict, wide: bool) -> torch.Tensor:
    flat = _words(c["flat"].view(-1, c["dim"]), wide)
    out = flat.index_select(0, c["row_index"].reshape(-1))
    return out.view(c["batch"], -1, flat.shape[1])


def rows_backward(c: dict, wide: bool) -> torch.Tensor:
    grad = _words(c["grad"], wide)
    out = grad.new_empty(c["flat"].numel() // c["dim"], grad.shape[-1])
    return out.index_copy_(0, c["row_index"].reshape(-1), grad.reshape(-1, grad.shape[-1]))


def columns_forward(c: dict, wide: bool) -> torch.Tensor:
    b, d = c["batch"], c["dim"]
    out = _words(c["grad"].new_empty(b, sum(c["counts"]), d), wide)
    start = 0
    for k, index in zip(c["counts"], c["table_index"]):
        block = _words(c["flat"][start: start + b * k * d].view(b, k, d), wide)
        out.index_copy_(1, index, block)
        start += b * k * d
    return out


def columns_backward(c: dict, wide: bool) -> torch.Tensor:
    b, d = c["batch"], c["dim"]
    grad = _words(c["grad"], wide)
    out = c["flat"].new_empty(c["flat"].shape)
    start = 0
    for k, index in zip(c["counts"], c["table_index"]):
        torch.index_select(grad, 1, index, out=_words(out[start: start + b * k * d].view(b, k, d), wide))
        start += b * k * d
    return out


FORMULATIONS = {
    "rows": (rows_forward, rows_backward, False),
    "rows64": (rows_forward, rows_backward, True),
    "columns": (columns_forward, columns_backward, False),
    "columns64": (columns_forward, columns_backward, True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=2, help="tables dealt round-robin to this many owners")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("table_order.py times CUDA kernels: no GPU here", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    dtype = getattr(torch, args.dtype)
    owners = [list(range(q, args.tables, args.ranks)) for q in range(args.ranks)]
    case = make_case(args.batch, owners, args.dim, dtype, "cuda")
    moved = 2 * case["flat"].numel() * case["flat"].element_size()  # read + write, each way
    ref_fwd, ref_bwd = rows_forward(case, False), rows_backward(case, False).reshape(-1)
    rows = []
    for name, (fwd, bwd, wide) in FORMULATIONS.items():
        same = (torch.equal(fwd(case, wide).view(dtype), ref_fwd)
                and torch.equal(bwd(case, wide).view(dtype).reshape(-1), ref_bwd))
        t_fwd = do_bench(lambda f=fwd, w=wide: f(case, w), return_mode="median")
        t_bwd = do_bench(lambda f=bwd, w=wide: f(case, w), return_mode="median")
        rows.append({"formulation": name, "equal": same, "forward_us": 1e3 * t_fwd, "backward_us": 1e3 * t_bwd,
                     "forward_gbps": moved / t_fwd / 1e6, "backward_gbps": moved / t_bwd / 1e6})
        print(f"{name:>10} equal={same!s:5} forward {1e3 * t_fwd:8.1f} us ({moved / t_fwd / 1e6:6.0f} GB/s)  "
              f"backward {1e3 * t_bwd:8.1f} us ({moved / t_bwd / 1e6:6.0f} GB/s)")
    record = {"command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(),
              "environment": envinfo.environment(), "case": {**vars(args), "owners": owners, "bytes_moved": moved},
              "rows": rows}
    atomic_write_json(writable_dir(args.out) / "table_order.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
