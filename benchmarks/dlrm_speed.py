"""DLRM training-step speed, every provider side by side in one process (issue 26's proof on the GPU).

Providers (Kaggle shapes: the 26 Kaggle cardinalities, D=16, bottom 13-512-256-64-16, top 367-512-256-1):

* ``fb-eager`` / ``fb-compile``: a facebookresearch/dlrm-style step written here: 26 ``nn.EmbeddingBag(sum,
  sparse=True)``, ``bmm`` + lower-triangle gather interaction, Linear+ReLU MLPs ending in a sigmoid, ``BCELoss``,
  one ``torch.optim.SGD`` (lr 0.1). Stronger than the original: the pair indices and bag offsets are device
  tensors made once, the loss never goes to the host. ``fb-compile`` compiles everything after the lookup.
* ``torch-eager`` / ``torch-compile``: ``DLRM(kernels="torch")`` through :class:`fuselab.dlrm.step.TrainStep`.
* ``fuselab-eager`` / ``fuselab-compile`` / ``fuselab-graph``: ``DLRM(kernels="fuselab")``, eager, compiled and
  captured in one CUDA graph. The fuselab providers use ``--optimizer`` (default row-wise Adagrad).

Each run: warm-up (compilation or capture included: ``warmup_s``), then ``--windows`` windows of ``--steps`` steps
on device-resident random batches (power-law or uniform ids, cycling through 4 batches), timed with CUDA events
and no synchronization inside a window: samples/s = batch / median window step time. Then, per (provider, batch,
precision) on the power-law case: a step-time breakdown of the eager providers (CUDA events between the pieces,
backward split by gradient hooks), and a torch.profiler count of kernels, launch API calls and kernel time per
step; peak memory of the run. Results: ``--out DIR/dlrm_speed.json`` (rewritten after every run).

    python3 benchmarks/dlrm_speed.py --out benchmarks/results/<gpu>           # ~5-6 min on one H100
    python3 benchmarks/dlrm_speed.py --device cpu --quick --out /tmp/speed   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile

from fuselab import envinfo

envinfo.enable_interpreter_if_no_cuda()  # before anything imports triton: the fuselab kernels on a CPU

from fuselab._io import atomic_write_json, writable_dir  # noqa: E402
from fuselab.dlrm.data.random import ID_DISTRIBUTIONS, random_batches  # noqa: E402
from fuselab.dlrm.data.shards import KAGGLE_CARDINALITIES  # noqa: E402
from fuselab.dlrm.model import DLRM, MLP_IMPLS  # noqa: E402
from fuselab.dlrm.optim import OPTIMIZERS, Optimizers  # noqa: E402
from fuselab.dlrm.step import PRECISIONS, TrainStep, float32_matmul_precision  # noqa: E402

PROVIDERS = ("fb-eager", "fb-compile", "torch-eager", "torch-compile", "fuselab-eager", "fuselab-compile",
             "fuselab-graph")
IDS = ID_DISTRIBUTIONS
DIM, BOTTOM, TOP = 16, [512, 256, 64, 16], [512, 256, 1]


@dataclass(frozen=True)
class Case:
    batch: int
    ids: str
    precision: str


def lean_cases(batches: list[int]) -> list[Case]:
    """Largest batch: every precision and id distribution; smaller ones: power-law, bf16 and fp32. Grouped by
    (batch, precision) so compiled and captured steps are reused; the headline cases first."""
    big, cases = max(batches), []
    for precision in ("bf16", "fp32"):
        cases += [Case(big, ids, precision) for ids in IDS]
    for batch in sorted(set(batches) - {big}, reverse=True):
        cases += [Case(batch, "powerlaw", p) for p in ("bf16", "fp32")]
    return cases + [Case(big, ids, "tf32") for ids in IDS]


# -- the facebookresearch/dlrm-style provider ----------------------------------------------------------------
def _fb_mlp(widths: list[int], sigmoid_last: bool, device) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k in range(len(widths) - 1):
        layers.append(nn.Linear(widths[k], widths[k + 1], device=device))
        layers.append(nn.Sigmoid() if sigmoid_last and k == len(widths) - 2 else nn.ReLU())
    return nn.Sequential(*layers)


class FbDLRM(nn.Module):
    """The reference's model: per-table EmbeddingBags, bmm interaction, MLPs ending in a sigmoid (probabilities)."""

    def __init__(self, sizes: list[int], device):
        super().__init__()
        self.emb_l = nn.ModuleList(nn.EmbeddingBag(n, DIM, mode="sum", sparse=True, device=device) for n in sizes)
        for bag, n in zip(self.emb_l, sizes):
            nn.init.uniform_(bag.weight, -math.sqrt(1 / n), math.sqrt(1 / n))
        self.bot_l = _fb_mlp([13, *BOTTOM], False, device)
        width = DIM + (len(sizes) + 1) * len(sizes) // 2
        self.top_l = _fb_mlp([width, *TOP], True, device)
        li, lj = torch.tril_indices(len(sizes) + 1, len(sizes) + 1, offset=-1, device=device)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)

    def lookup(self, sparse: Tensor) -> list[Tensor]:
        cols = sparse.t().contiguous()
        offsets = torch.arange(sparse.shape[0], device=sparse.device)
        return [bag(cols[k], offsets) for k, bag in enumerate(self.emb_l)]

    def interact(self, x: Tensor, ly: list[Tensor]) -> Tensor:
        t = torch.cat([x, *ly], dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self.li, self.lj]], dim=1)

    def dense_loss(self, dense: Tensor, ly: list[Tensor], labels: Tensor, bf16: bool) -> Tensor:
        with torch.autocast(dense.device.type, dtype=torch.bfloat16, enabled=bf16):
            prob = self.top_l(self.interact(self.bot_l(dense), ly))
        return F.binary_cross_entropy(prob.float().squeeze(1), labels)  # BCELoss on probabilities


class FbStep:
    """forward, loss, zero_grad, backward, SGD step; ``mode="compile"`` compiles :meth:`FbDLRM.dense_loss`."""

    def __init__(self, model: FbDLRM, precision: str, mode: str):
        self.model, self.precision = model, precision
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.dense_loss = torch.compile(model.dense_loss, dynamic=False) if mode == "compile" else model.dense_loss

    def __call__(self, dense: Tensor, sparse: Tensor, labels: Tensor) -> Tensor:
        with _matmul_precision(self.precision):
            loss = self.dense_loss(dense, self.model.lookup(sparse), labels, self.precision == "bf16")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return loss.detach()


def _matmul_precision(precision: str):
    if precision == "bf16":
        return contextlib.nullcontext()
    return float32_matmul_precision("highest" if precision == "fp32" else "high")


# -- inputs, clocks ----------------------------------------------------------------------------------------
def make_batches(case: Case, sizes: list[int], device: torch.device, count: int = 4) -> list[tuple[Tensor, ...]]:
    """``count`` random batches of the case on the device (:func:`fuselab.dlrm.data.random.random_batches`)."""
    return random_batches(case.batch, sizes, device, case.ids, count)


class Clock:
    """CUDA events on a GPU (no synchronization until :meth:`sync`), perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def throughput(step, batches, clock: Clock, warmup: int, windows: int, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    for k in range(warmup):
        loss = step(*batches[k % len(batches)])
    clock.sync()
    warmup_s = time.perf_counter() - t0
    marks, k = [], 0
    for _ in range(windows):
        marks.append(clock.mark())
        for _ in range(steps):
            loss = step(*batches[k % len(batches)])
            k += 1
        marks.append(clock.mark())
    clock.sync()
    per_step = [clock.ms(marks[i], marks[i + 1]) / steps for i in range(0, len(marks), 2)]
    median = statistics.median(per_step)
    return {"warmup_s": round(warmup_s, 3), "step_ms_windows": [round(t, 4) for t in per_step],
            "step_ms_median": median, "samples_per_s": batches[0][0].shape[0] / median * 1e3,
            "loss": float(loss)}


# -- breakdown and profile -----------------------------------------------------------------------------------
PIECES = ("embedding_fwd", "bottom_mlp_fwd", "interaction_fwd", "top_mlp_fwd+loss", "top_mlp_bwd",
          "interaction_bwd", "rest_bwd", "update")


def _pieces_once(family: str, step, batch, clock: Clock, marks: list) -> None:
    """One eager step split by marks (CUDA events; hooks mark the backward's pieces from the autograd thread)."""
    def mark(name):
        if name not in {m[0] for m in marks}:
            marks.append((name, clock.mark()))

    dense, sparse, labels = batch
    model, bf16 = step.model, step.precision == "bf16"
    auto = torch.autocast(dense.device.type, dtype=torch.bfloat16, enabled=bf16)
    with _matmul_precision(step.precision):
        marks.append(("start", clock.mark()))
        if family == "fb":
            step.opt.zero_grad(set_to_none=True)
            emb = model.lookup(sparse)
            mark("embedding_fwd")
            with auto:
                x = model.bot_l(dense)
                mark("bottom_mlp_fwd")
                z = model.interact(x, emb)
                mark("interaction_fwd")
                out = model.top_l(z).float().squeeze(1)
            loss = F.binary_cross_entropy(out, labels)
            update = step.opt.step
        else:
            step.optimizers.zero_grad()
            emb = model.sparse_arch(sparse)
            mark("embedding_fwd")
            with auto:
                x = model.dense_arch(dense)
                mark("bottom_mlp_fwd")
                z = model.interaction_arch(x, emb)
                mark("interaction_fwd")
                out = model.over_arch(z).float().squeeze(1)
            loss = F.binary_cross_entropy_with_logits(out, labels)
            update = step.optimizers.step
        mark("top_mlp_fwd+loss")
        z.register_hook(lambda g: mark("top_mlp_bwd"))
        x.register_hook(lambda g: mark("interaction_bwd"))
        loss.backward()
        mark("rest_bwd")
        update()
        mark("update")


def breakdown(family: str, step, batches, clock: Clock, repeats: int) -> dict[str, float]:
    runs = []
    for k in range(repeats):
        marks: list = []
        _pieces_once(family, step, batches[k % len(batches)], clock, marks)
        runs.append(marks)
    clock.sync()
    out = dict.fromkeys(PIECES, 0.0)
    for marks in runs:
        for (_, a), (name, b) in itertools.pairwise(marks):
            out[name] += clock.ms(a, b) / repeats
    return {k: round(v, 4) for k, v in out.items()}


_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cudaMemcpyAsync", "cudaMemsetAsync")


def profile_counts(step, batches, device: torch.device, steps: int = 3) -> dict[str, Any]:
    """Kernels, copies/sets, launch API calls and kernel time per step, from torch.profiler."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for k in range(steps):
            step(*batches[k % len(batches)])
        if device.type == "cuda":
            torch.cuda.synchronize()
    kernels = copies = calls = 0
    kernel_us = 0.0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            if evt.name.startswith(("Memcpy", "Memset")):
                copies += 1
            else:
                kernels += 1
                kernel_us += evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
        elif evt.name in _LAUNCH_CALLS:
            calls += 1
    return {"kernels_per_step": kernels / steps, "copies_per_step": copies / steps,
            "launch_calls_per_step": calls / steps, "kernel_ms_per_step": round(kernel_us / 1e3 / steps, 4)}


# -- the runs ------------------------------------------------------------------------------------------------
class Bench:
    """Models (one per family, built on first use), steps (per provider, batch, precision), results, the JSON."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.device = args, torch.device(args.device)
        self.clock = Clock(self.device)
        self.t0 = time.perf_counter()
        self.sizes = [max(2, round(n * args.scale)) for n in KAGGLE_CARDINALITIES]
        self.models: dict[str, Any] = {}
        self.steps: dict[tuple, Any] = {}
        self.result: dict[str, Any] = {
            "benchmark": "dlrm_speed", "command": [sys.executable, *sys.argv],
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": envinfo.environment(), "options": {k: v for k, v in vars(args).items() if k != "out"},
            "shapes": {"table_rows": self.sizes, "embedding_rows": sum(self.sizes), "dim": DIM,
                       "bottom": [13, *BOTTOM], "top": ["interaction", *TOP]},
            "runs": []}

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        self.result["wall_s"] = round(time.perf_counter() - self.t0, 1)
        atomic_write_json(self.args.out / "dlrm_speed.json", self.result)

    def model(self, family: str):
        if family not in self.models:
            t = time.perf_counter()
            a = self.args
            if family == "fb":
                self.models[family] = FbDLRM(self.sizes, self.device)
            else:
                model = DLRM(self.sizes, DIM, BOTTOM, TOP, kernels=family, optimizer=a.optimizer, lr_sparse=0.05,
                             mlp=a.mlp if family == "fuselab" else None).to(self.device)
                opts = Optimizers(model, optimizer=a.optimizer, lr_dense=0.02, lr_sparse=0.05)
                self.models[family] = (model, opts)
            self.log(f"built the {family} model in {time.perf_counter() - t:.1f} s")
        return self.models[family]

    def step(self, provider: str, case: Case):
        family, mode = provider.split("-")
        key = (provider, case.batch, case.precision)
        if key not in self.steps:
            if family == "fb":
                self.steps[key] = FbStep(self.model("fb"), case.precision, mode)
            else:
                model, opts = self.model(family)
                mode = {"eager": "eager", "compile": "compile", "graph": "cuda_graph"}[mode]
                self.steps[key] = TrainStep(model, opts, precision=case.precision, mode=mode,
                                            compile_options={"dynamic": False})
        return self.steps[key]

    def run(self, provider: str, case: Case, batches) -> dict[str, Any]:
        a, family = self.args, provider.split("-")[0]
        row: dict[str, Any] = {"provider": provider, **asdict(case)}
        skip = self.skip_reason(provider, case)
        if skip:
            return {**row, "status": "skipped", "reason": skip}
        cuda = self.device.type == "cuda"
        try:
            step = self.step(provider, case)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                row["resident_gb"] = round(torch.cuda.memory_allocated() / 2**30, 3)
            warmup = a.warmup + (2 if provider.endswith(("compile", "graph")) else 0)
            row.update(throughput(step, batches, self.clock, warmup, a.windows, a.steps))
            if case.ids == "powerlaw" and not a.no_profile:
                if provider.endswith("eager"):
                    row["breakdown_ms"] = breakdown(family, step, batches, self.clock, repeats=1 if a.quick else 3)
                row.update(profile_counts(step, batches, self.device, steps=1 if a.quick else 3))
            if cuda:
                row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
            row["status"] = "ok"
        except Exception as exc:  # a failing provider is recorded, the others still run
            traceback.print_exc()
            row.update(status="error", error=repr(exc)[:500])
        return row

    def skip_reason(self, provider: str, case: Case) -> str | None:
        if provider.startswith("fuselab") and "fuselab" not in self.models:
            try:
                self.model("fuselab")
            except Exception as exc:  # not built in (ImportError) or broken: every fuselab run says why
                traceback.print_exc()
                self.models["fuselab"] = exc
        if isinstance(self.models.get("fuselab"), Exception) and provider.startswith("fuselab"):
            return f"fuselab kernels unavailable: {self.models['fuselab']!r}"[:300]
        if provider.endswith("graph") and self.device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        left = self.args.budget_s - (time.perf_counter() - self.t0)
        if left < 0:
            return f"time budget ({self.args.budget_s:.0f} s) spent"
        compiling = provider.endswith("compile") and (provider, case.batch, case.precision) not in self.steps
        if compiling and left < self.args.compile_min_s:
            return f"a compilation needs {self.args.compile_min_s:.0f} s of budget, {left:.0f} s left"
        return None


def table(runs: list[dict[str, Any]], providers: list[str]) -> str:
    """Samples/s (millions) per case and provider."""
    cases = list(dict.fromkeys((r["batch"], r["ids"], r["precision"]) for r in runs))
    width = max(len(p) for p in providers) + 1
    lines = ["batch  ids       prec  " + "".join(f"{p:>{width}}" for p in providers)]
    for case in cases:
        cells = []
        for p in providers:
            r = next((r for r in runs if (r["batch"], r["ids"], r["precision"]) == case and r["provider"] == p), {})
            cells.append(f"{r['samples_per_s'] / 1e6:.3g}M" if r.get("status") == "ok" else r.get("status", "-"))
        lines.append(f"{case[0]:<6} {case[1]:<9} {case[2]:<5} " + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for dlrm_speed.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true",
                   help="bf16 and fp32 at the largest batch, power-law ids, few steps (CPU: tables x1e-4, batch 64)")
    p.add_argument("--providers", nargs="+", choices=PROVIDERS, help="default: all (CPU: the eager ones)")
    p.add_argument("--batch-sizes", nargs="+", type=int, help="default 65536 8192 (lean matrix)")
    p.add_argument("--ids", nargs="+", choices=IDS, help="keep only these id distributions")
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, help="keep only these precisions")
    p.add_argument("--full", action="store_true", help="every batch x ids x precision (default: lean_cases)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="rowwise_adagrad", help="of the fuselab providers")
    p.add_argument("--mlp", choices=MLP_IMPLS, default="addmm", help="MLP layers of kernels='fuselab'")
    p.add_argument("--scale", type=float, help="times the Kaggle cardinalities (default 1; CPU --quick 1e-4)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps per timed window")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no run after this many seconds")
    p.add_argument("--compile-min-s", type=float, default=45.0, help="start no compilation with less budget left")
    p.add_argument("--no-profile", action="store_true", help="skip the breakdown and the profiler counts")
    args = p.parse_args(argv)
    cpu = args.device == "cpu"
    if args.scale is None:
        args.scale = 1e-4 if cpu and args.quick else 1.0
    if args.batch_sizes is None:
        args.batch_sizes = [64] if cpu and args.quick else [65536, 8192]
    if args.providers is None:
        args.providers = [p for p in PROVIDERS if p.endswith("eager")] if cpu else list(PROVIDERS)
    if args.quick:
        args.windows, args.steps, args.warmup = (1, 2, 1) if cpu else (3, 5, 2)
    if any(b <= 0 for b in args.batch_sizes) or args.scale <= 0 or min(args.windows, args.steps, args.warmup) < 1:
        p.error("batch sizes, --scale, --windows, --steps and --warmup must be positive")
    args.out = writable_dir(args.out)
    return args


def select_cases(args: argparse.Namespace) -> list[Case]:
    if args.full:
        cases = [Case(b, i, p) for b in args.batch_sizes for p in PRECISIONS for i in IDS]
    elif args.quick:
        cases = [Case(max(args.batch_sizes), "powerlaw", p) for p in ("bf16", "fp32")]
    else:
        cases = lean_cases(args.batch_sizes)
    return [c for c in cases if (not args.ids or c.ids in args.ids)
            and (not args.precisions or c.precision in args.precisions)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    if bench.device.type == "cpu":
        torch.set_num_threads(1)  # a smoke test on a shared CPU: steadier than contended threads
    torch._dynamo.config.cache_size_limit = 64  # one compiled graph per (provider, batch, precision)
    cases = select_cases(args)
    bench.log(f"{len(cases)} cases x {len(args.providers)} providers on {bench.result['environment']['device']}")
    group = None
    for case in cases:
        if (case.batch, case.precision) != group:  # free the steps (graphs, compiled code) of the last group
            group = (case.batch, case.precision)
            bench.steps.clear()
        batches = make_batches(case, bench.sizes, bench.device)
        for provider in args.providers:
            row = bench.run(provider, case, batches)
            bench.result["runs"].append(row)
            bench.save()
            rate = f"{row['samples_per_s'] / 1e6:.3g}M samples/s" if row["status"] == "ok" else row["status"]
            bench.log(f"{case.batch} {case.ids} {case.precision} {provider}: {rate} {row.get('reason', '')}")
    bench.result["status"] = "done"
    bench.save()
    print(table(bench.result["runs"], args.providers), flush=True)
    print(f"wrote {args.out / 'dlrm_speed.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
