"""The MLPerf DLRM-DCNv2 embedding collection on one GPU: fuselab's lookup + fused row-wise Adagrad update against
FBGEMM's TBE (when importable), side by side, with bytes moved and the fraction of the copy bandwidth.

B 65536, 26 features with MLPerf's bag sizes, D 128, power-law ids over the tables (Criteo 1TB cardinalities capped
at 40M, times ``--scale``), fp32 weights, fp32 output gradient. Prints a table; writes JSON to $OUT when set.
Run from the repository root: ``python3 benchmarks/gpu_checks/multihot_embedding.py [--scale 0.01 0.1]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
import triton.testing

from fuselab.core.embedding_optimizer import ROWWISE_ADAGRAD
from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES
from fuselab.ops.embedding import EmbeddingConfig
from fuselab.ops.embedding.module import EmbeddingBagCollection

#: update knobs tried at the Kaggle shapes (one id per feature): the segment kernel against the items
KAGGLE_CONFIGS = {
    "default": EmbeddingConfig(),
    "items": EmbeddingConfig(segment_dim=0),
    "segments 2048": EmbeddingConfig(segment_dim=256, segment_elements=2048),
    "segments 4096": EmbeddingConfig(segment_dim=256, segment_elements=4096),
    "segments 4096 chunk 1024": EmbeddingConfig(segment_dim=256, segment_elements=4096, update_chunk=1024),
}


def power_law_ids(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` ids in [0, n) with density ~ 1/rank, ranks scrambled by a multiplicative bijection mod n."""
    u = torch.rand(count, device="cuda", generator=gen, dtype=torch.float64)
    rank = torch.floor(torch.exp(u * math.log(n))).to(torch.int64) - 1
    return (rank * 2_654_435_761) % n


def batch(sizes, bags, b, gen):
    """Feature-major ids (for the TBE) and batch-major CSR (for fuselab): (ids, offsets) each."""
    per_feature = [power_law_ids(n, b * k, gen).view(b, k) for n, k in zip(sizes, bags)]
    tbe_ids = torch.cat([t.reshape(-1) for t in per_feature])
    tbe_lengths = torch.cat([torch.full((b,), k, device="cuda") for k in bags])
    tbe_offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), tbe_lengths.cumsum(0)])
    fl_ids = torch.cat(per_feature, dim=1).reshape(-1)  # row b: feature 0's bag, feature 1's bag, ...
    fl_lengths = torch.tensor(bags, device="cuda").repeat(b)
    fl_offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), fl_lengths.cumsum(0)])
    return (tbe_ids, tbe_offsets), (fl_ids, fl_offsets)


def count_bytes(sizes, bags, tbe_ids, d, b):
    """Fewest bytes of a lookup and of an update step: ids once, each touched row once (lookup: read; update:
    read + write, weight and row-wise state), the output once, the gradient once."""
    counts = torch.tensor([b * k for k in bags], device="cuda")
    feature = torch.repeat_interleave(torch.arange(len(sizes), device="cuda"), counts)
    unique = int(torch.unique(tbe_ids + (feature << 40)).numel())  # distinct (table, row) pairs
    n = tbe_ids.numel()
    lookup = n * 8 + unique * d * 4 + b * len(sizes) * d * 4
    update = n * 8 + b * len(sizes) * d * 4 + unique * (d * 4 * 2 + 4 * 2)
    return lookup, update, unique


def time_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def fuselab_case(sizes, d, ids, offsets, grad, config):
    m = EmbeddingBagCollection(sizes, d, optimizer=ROWWISE_ADAGRAD, lr=0.01, device="cuda",
                               generator=torch.Generator(device="cuda").manual_seed(0), config=config)
    fwd = lambda: m(ids, offsets)

    def train():
        m(ids, offsets).backward(grad)

    return time_ms(fwd), time_ms(train)


def tbe_case(sizes, d, ids, offsets, grad):
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except ImportError as e:
        return None, f"fbgemm_gpu not importable: {e}"
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(n, d, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for n in sizes],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, eps=1e-8,
        weights_precision=SparseType.FP32, output_dtype=SparseType.FP32, pooling_mode=PoolingMode.SUM)
    g2 = grad.reshape(grad.shape[0], -1)
    fwd = lambda: tbe(ids, offsets)

    def train():
        tbe(ids, offsets).backward(g2)

    return (time_ms(fwd), time_ms(train)), ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, nargs="+", default=[0.01, 0.1])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--config", default="mlperf-v2", help="mlperf-v2 (multi-hot, D 128) or kaggle (one id, D 16)")
    ap.add_argument("--dim", type=int, help="embedding dim (default: the config's)")
    args = ap.parse_args()
    cfg = load_config(args.config)
    one_id = cfg.multi_hot_sizes is None
    cards = cfg.cardinalities or list(KAGGLE_CARDINALITIES)
    d, bags = args.dim or cfg.embedding_dim, [1] * len(cards) if one_id else list(cfg.multi_hot_sizes)
    copy_bw = measure_copy()
    rows = []
    E = EmbeddingConfig
    configs = KAGGLE_CONFIGS if one_id else {"fuselab": E(),
               "warp/item u8": E(update_elements=1024, update_unroll=8, update_warps=1, lookup_elements=1024,
                                 lookup_unroll=8, bag_warps=1),
               "warp/item u4": E(update_elements=512, update_unroll=4, update_warps=1, lookup_elements=512,
                                 lookup_unroll=4, bag_warps=1),
               "warp/item u16": E(update_elements=2048, update_unroll=16, update_warps=1, lookup_elements=2048,
                                  lookup_unroll=16, bag_warps=1),
               "2 warps, 2 items": E(update_elements=2048, update_unroll=8, update_warps=2, lookup_elements=2048,
                                     lookup_unroll=4, bag_warps=2),
               "warp/item u8 chunk 1024": E(update_elements=1024, update_unroll=8, update_warps=1, update_chunk=1024,
                                            lookup_elements=4096, lookup_unroll=1)}
    for scale in args.scale:
        sizes = [max(2, round(min(n, cfg.max_rows_per_table or n) * scale)) for n in cards]
        gen = torch.Generator(device="cuda").manual_seed(0)
        (t_ids, t_off), (f_ids, f_off) = batch(sizes, bags, args.batch, gen)
        if one_id:  # the DLRM's one id per feature: (B, F) ids, no offsets
            f_ids, f_off = f_ids.view(args.batch, len(sizes)), None
        grad = torch.randn(args.batch, len(sizes), d, device="cuda", generator=gen)
        lookup_b, update_b, unique = count_bytes(sizes, bags, t_ids, d, args.batch)
        for name, config in configs.items():
            try:
                fwd, train = fuselab_case(sizes, d, f_ids, f_off, grad, config)
            except Exception as error:  # a probe reports a failing variant and goes on
                print(f"{name}: {type(error).__name__}: {str(error)[:300]}")
                continue
            rows.append(dict(scale=scale, provider=name, lookup_ms=fwd, update_ms=train - fwd, step_ms=train))
            torch.cuda.empty_cache()
        res, why = tbe_case(sizes, d, t_ids, t_off, grad)
        torch.cuda.empty_cache()
        if res is not None:
            rows.append(dict(scale=scale, provider="fbgemm tbe", lookup_ms=res[0], update_ms=res[1] - res[0],
                             step_ms=res[1]))
        else:
            print(why)
        for r in rows:
            if r["scale"] == scale:
                r.update(ids=f_ids.numel(), unique_rows=unique, rows=sum(sizes),
                         lookup_frac=lookup_b / (r["lookup_ms"] * 1e-3) / copy_bw,
                         update_frac=update_b / (max(r["update_ms"], 1e-6) * 1e-3) / copy_bw)
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}; {args.config}, D {d}")
    print(f"{'scale':>6} {'provider':20s} {'ids':>10} {'unique':>9} {'lookup ms':>10} {'frac':>5} "
          f"{'update ms':>10} {'frac':>5} {'fwd+bwd ms':>10}")
    for r in rows:
        print(f"{r['scale']:6.2f} {r['provider']:20s} {r['ids']:10d} {r['unique_rows']:9d} {r['lookup_ms']:10.3f} "
              f"{r['lookup_frac']:5.2f} {r['update_ms']:10.3f} {r['update_frac']:5.2f} {r['step_ms']:10.3f}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"embedding_{args.config}_D{d}.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_bw=copy_bw,
                           config=args.config, dim=d, batch=args.batch, rows=rows), f, indent=1)


def measure_copy() -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy."""
    a = torch.empty(1 << 28, device="cuda")
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (ms * 1e-3)


if __name__ == "__main__":
    main()
