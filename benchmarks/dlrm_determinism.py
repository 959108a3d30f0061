"""Two DLRM training runs with the same seed must give bit-identical weights (``kernels="fuselab"``, deterministic
embedding update). Also the small run that ``compute-sanitizer --tool memcheck`` checks the fused kernels with.

    python3 benchmarks/dlrm_determinism.py --steps 100 --batch 65536            # ~1 min on one H100
    compute-sanitizer --tool memcheck python3 benchmarks/dlrm_determinism.py --steps 2 --batch 2048 --scale 1e-3

Prints one line per run with the SHA-256 of every parameter and buffer (weights and optimizer state) after the last
step, and exits 1 when the runs differ. Random Kaggle-shaped batches (power-law ids), bf16 autocast, row-wise Adagrad.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import torch

from fuselab.dlrm.config import load_config
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES
from fuselab.dlrm.model import DLRM
from fuselab.dlrm.optim import Optimizers
from fuselab.dlrm.step import TrainStep


def batches(sizes: list[int], batch: int, count: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """``count`` seeded batches: power-law ids (rank r with probability ~ 1/r), uniform dense, 25% positives."""
    gen = torch.Generator(device=device).manual_seed(1234)
    n = torch.tensor(sizes, device=device)
    out = []
    for _ in range(count):
        u = torch.rand(batch, len(sizes), device=device, generator=gen, dtype=torch.float64)
        ids = ((n.double() ** u).floor().long() - 1).clamp(0, None).minimum(n - 1)
        dense = torch.rand(batch, 13, device=device, generator=gen)
        labels = (torch.rand(batch, device=device, generator=gen) < 0.25).float()
        out.append((dense, ids, labels))
    return out


def run_once(args: argparse.Namespace, sizes: list[int], device: torch.device) -> str:
    """Train ``args.steps`` steps from seed 0; the SHA-256 of the whole state_dict afterwards."""
    cfg = load_config("kaggle", optimizer="rowwise_adagrad", seed=0)  # D 16, bottom 512-256-64-16, top 512-256-1
    model = DLRM.from_config(cfg, sizes, kernels="fuselab").to(device)  # the fused update is deterministic
    opts = Optimizers(model, lr_dense=0.02, lr_sparse=0.05)
    step = TrainStep(model, opts, precision=args.precision, mode=args.mode)
    data = batches(sizes, args.batch, 8, device)
    for i in range(args.steps):
        loss = step(*data[i % len(data)])
    torch.cuda.synchronize(device)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    print(f"steps {args.steps} batch {args.batch} {args.precision} {args.mode}: final loss {float(loss):.6f} "
          f"state sha256 {digest.hexdigest()[:32]}", flush=True)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--scale", type=float, default=1.0, help="times the Kaggle cardinalities")
    p.add_argument("--precision", default="bf16", choices=("fp32", "tf32", "bf16"))
    p.add_argument("--mode", default="eager", choices=("eager", "cuda_graph"))
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    sizes = [max(2, round(n * args.scale)) for n in KAGGLE_CARDINALITIES]
    digests = {run_once(args, sizes, device) for _ in range(args.runs)}
    print("bit-identical" if len(digests) == 1 else f"DIFFERENT: {len(digests)} distinct states", flush=True)
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
