"""What the GPUs of one host move between them: the floor under the DLRM's exchanges.

Per size (default: the DLRM's per-GPU exchanges at W = 2, see ``benchmarks/notes/dlrm_scaling.md``, and a sweep):

- ``peer_copy``: one process, ``dst.copy_(src)`` from GPU 0 to GPU 1 (one direction) and both directions at once
  (two streams): the link's copy-engine bandwidth;
- ``all_to_all``: ``all_to_all_single`` of the size per rank (bf16), one process per GPU over NCCL, eager and
  replayed from a CUDA graph (10 calls per graph);
- ``all_reduce``: fp32 ``all_reduce`` of the size, eager and in a graph.

Times: CUDA events, the slowest rank's median of ``--windows`` windows of ``--iters`` calls, after warm-up.
Bandwidth: the bytes that cross between GPUs per rank and call (all_to_all: size x (W-1)/W; all_reduce: NCCL's bus
bandwidth 2 x size x (W-1)/W) over the time. The topology (``nvidia-smi topo -m``) is recorded with the numbers.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Results: ``--out DIR/collectives.json``.

    python3 benchmarks/collectives.py --out benchmarks/results/h100x2     # two or more GPUs, ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fuselab import envinfo
from fuselab._io import atomic_write_json, writable_dir

#: bytes per rank: the DLRM's ids (int64, 6.8 MB cross of 13.6), pooled rows / their gradients (bf16, 54.5 MB),
#: its dense gradients (1.9 MB fp32), then a sweep
DEFAULT_SIZES_MB = (1.9, 13.6, 54.5, 0.25, 4.0, 16.0, 64.0, 256.0)


def _time_ms(fn, iters: int, windows: int) -> list[float]:
    """Per-call ms of ``fn`` in each of ``windows`` windows of ``iters`` calls (CUDA events on this device)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(windows):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / iters)
    return out


def _both_ways(a0, a1, b0, b1, s0, s1) -> None:
    """a0 -> a1 on GPU 0's side stream and b1 -> b0 on GPU 1's, joined into GPU 0's current stream."""
    with torch.cuda.stream(s0):
        a1.copy_(a0)
    with torch.cuda.stream(s1):
        b0.copy_(b1)
    torch.cuda.current_stream("cuda:0").wait_stream(s0)
    torch.cuda.current_stream("cuda:0").wait_stream(s1)


def peer_copy(sizes_mb, iters: int, windows: int) -> list[dict]:
    """GPU 0 -> GPU 1 copies, and both directions at once, in one process."""
    rows = []
    s0, s1 = torch.cuda.Stream("cuda:0"), torch.cuda.Stream("cuda:1")
    for mb in sizes_mb:
        n = int(mb * 1e6) // 4
        bufs = [torch.empty(n, device=f"cuda:{d}") for d in (0, 1, 0, 1)]  # a0, a1, b0, b1
        one = statistics.median(_time_ms(partial(bufs[1].copy_, bufs[0]), iters, windows))
        two = statistics.median(_time_ms(partial(_both_ways, *bufs, s0, s1), iters, windows))
        rows.append({"what": "peer_copy", "mb": mb, "one_way_ms": one, "one_way_gbps": mb / one,
                     "both_ways_ms": two, "per_direction_gbps": mb / two})
    return rows


def _collective(what: str, mb: float, world: int):
    """(the call, bytes that cross between GPUs per rank and call)."""
    if what == "all_to_all":
        n = (int(mb * 1e6) // 2 // world) * world
        send = torch.randn(n, device="cuda").bfloat16()
        recv = torch.empty_like(send)
        return partial(dist.all_to_all_single, recv, send), n * 2 * (world - 1) / world
    n = int(mb * 1e6) // 4
    return partial(dist.all_reduce, torch.randn(n, device="cuda")), 2 * n * 4 * (world - 1) / world


def _worker(rank: int, world: int, port: int, spec: dict, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    rows = []
    for what in ("all_to_all", "all_reduce"):
        for mb in spec["sizes_mb"]:
            call, crossing = _collective(what, mb, world)
            row = {"what": what, "mb": mb, "ranks": world}
            for mode in ("eager", "cuda_graph"):
                fn = call
                if mode == "cuda_graph":
                    call()  # NCCL's first call outside the capture
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for _ in range(10):
                            call()
                    fn = graph.replay
                dist.barrier()
                times = _time_ms(fn, spec["iters"] if mode == "eager" else max(1, spec["iters"] // 10),
                                 spec["windows"])
                t = torch.tensor([statistics.median(times) / (10 if mode == "cuda_graph" else 1)], device="cuda")
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                row[f"{mode}_ms"] = float(t)
                row[f"{mode}_gbps"] = crossing / 1e6 / float(t)
                if mode == "cuda_graph":
                    del graph
            rows.append(row)
    if rank == 0:  # the whole record, before the process group goes (a hang there keeps it)
        record = json.loads(Path(result).read_text())
        record["rows"] += rows
        atomic_write_json(Path(result).with_name("collectives.json"), record)
        print_table(record["rows"])
    dist.destroy_process_group()


def _topology() -> str:
    if not shutil.which("nvidia-smi"):
        return "nvidia-smi not found"
    out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() or out.stderr.strip()


def print_table(rows: list[dict]) -> None:
    print(f"{'what':>10} {'MB':>6} {'eager ms':>9} {'GB/s':>6} {'graph ms':>9} {'GB/s':>6}")
    for r in rows:
        if r["what"] == "peer_copy":
            print(f"{'peer copy':>10} {r['mb']:>6.1f} {r['one_way_ms']:>9.3f} {r['one_way_gbps']:>6.0f} "
                  f"{r['both_ways_ms']:>9.3f} {r['per_direction_gbps']:>6.0f}  (one way | both ways)")
        else:
            print(f"{r['what']:>10} {r['mb']:>6.1f} {r['eager_ms']:>9.3f} {r['eager_gbps']:>6.0f} "
                  f"{r['cuda_graph_ms']:>9.3f} {r['cuda_graph_gbps']:>6.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=list(DEFAULT_SIZES_MB))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--port", type=int, default=29631)
    parser.add_argument("--out", required=True, help="folder of collectives.json")
    args = parser.parse_args(argv)
    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world < 2:
        print("collectives.py needs two or more GPUs", file=sys.stderr)
        return 2
    out = writable_dir(args.out)
    spec = {"sizes_mb": args.sizes_mb, "iters": args.iters, "windows": args.windows}
    record = {"command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(),
              "environment": envinfo.environment(), "topology": _topology(), "spec": spec, "ranks": world}
    print(record["topology"])
    record["rows"] = peer_copy(args.sizes_mb, args.iters, args.windows)
    partial_record = out / ".collectives_peer.json"
    partial_record.write_text(json.dumps(record))
    try:
        mp.spawn(_worker, args=(world, args.port, spec, str(partial_record)), nprocs=world, join=True)
    finally:
        partial_record.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
