"""Harness of ``benchmarks/dlrm_gpu.py``: the report (result dict, atomic JSON, clock, budget, log, phases); a
training step as a function of (batch, PhaseTimer); :func:`measure`: warm-up, a synchronized step-time breakdown
(the trainer's ``PhaseTimer``), then an unsynchronized throughput window with per-step times from CUDA events
(host clocks on a CPU).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from dlrm_baseline import ReferenceTrainer
from torch import Tensor, nn

from fuselab.dlrm.config import DLRMConfig
from fuselab.dlrm.data.loader import BatchLoader, Hasher
from fuselab.dlrm.data.shards import write_json_atomic
from fuselab.dlrm.model import DLRM, Batch
from fuselab.dlrm.train import Optimizers, PhaseTimer, train_step

StepFn = Callable[[Batch, PhaseTimer], Tensor]


def process_age() -> float:
    """Seconds since this process started (imports included), from /proc; 0 where unavailable."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    return age if 0.0 <= age < 600.0 else 0.0  # a sandbox's odd clocks: count from now instead


class Report:
    """The result dict, its atomic JSON file, the clock, the budget and the log."""

    def __init__(self, path: Path, budget_s: float, header: dict[str, Any]):
        self.path, self.budget_s = path, budget_s
        self.t0 = time.perf_counter() - process_age()
        self.lock = threading.Lock()
        self.phase = "start"
        self.result: dict[str, Any] = {
            "benchmark": "dlrm_kaggle", "status": "running", "command": [sys.executable, *sys.argv],
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), **header,
            "phase_seconds": {}, "runs": [], "errors": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        """Rewrite the JSON atomically (non-finite floats as null); also called from the watchdog thread."""
        with self.lock:
            self.result["wall_s"] = round(self.elapsed(), 1)
            for _ in range(3):  # the main thread may be changing the dict
                try:
                    data = json.loads(json.dumps(self.result, default=str), parse_constant=lambda _: None)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            else:
                return
            write_json_atomic(self.path, data)

    def error(self, where: str, exc: BaseException) -> None:
        self.log(f"ERROR in {where}: {exc!r}\n{traceback.format_exc()}")
        self.result["errors"].append({"where": where, "error": repr(exc)})

    def run_phase(self, name: str, fn: Callable[[], None]) -> bool:
        """Run one phase: timed, logged, errors recorded (not raised), JSON rewritten. Returns success."""
        self.phase = name
        self.log(f"== {name} (budget left {self.left():.0f} s)")
        t = time.perf_counter()
        ok = True
        try:
            fn()
        except Exception as exc:
            self.error(name, exc)
            ok = False
        self.result["phase_seconds"][name] = round(time.perf_counter() - t, 2)
        self.save()
        return ok


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cycle(loader: BatchLoader) -> Iterator[Batch]:
    """The loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        yield from loader.epoch(epoch)
        epoch += 1


def measure(step: StepFn, batches: Iterator[Batch], device: torch.device, *, batch_size: int, warmup: int,
            breakdown_steps: int, max_steps: int, window_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Warm-up, synchronized breakdown, then an unsynchronized throughput window of at most ``max_steps``."""
    off = PhaseTimer(device, enabled=False)
    t = time.perf_counter()
    for _ in range(warmup):
        step(next(batches), off)
    sync(device)
    warmup_s = time.perf_counter() - t
    timer = PhaseTimer(device, enabled=True)
    for _ in range(breakdown_steps):
        with timer.phase("data"):
            batch = next(batches)
        step(batch, timer)
        timer.steps += 1
    cuda = device.type == "cuda"
    marks: list[Any] = []
    losses: list[Tensor] = []

    def mark() -> None:
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            marks.append(time.perf_counter())

    sync(device)
    start = last_print = time.perf_counter()
    mark()
    steps = 0
    while steps < max_steps and time.perf_counter() - start < window_s:
        losses.append(step(next(batches), off))
        mark()
        steps += 1
        if time.perf_counter() - last_print > 10:
            last_print = time.perf_counter()
            log(f"  step {steps}/{max_steps}: {steps * batch_size / (last_print - start):,.0f} samples/s (host)")
    sync(device)
    seconds = time.perf_counter() - start
    if cuda:
        step_ms = [a.elapsed_time(b) for a, b in itertools.pairwise(marks)]
    else:
        step_ms = [1e3 * (b - a) for a, b in itertools.pairwise(marks)]
    breakdown = timer.report() if breakdown_steps else {}
    tail = torch.stack(losses[-20:]).float().mean().item() if losses else float("nan")
    return {
        "batch_size": batch_size, "warmup_steps": warmup, "warmup_s": round(warmup_s, 3),
        "breakdown_steps": breakdown_steps, "steps": steps, "samples": steps * batch_size,
        "seconds": round(seconds, 3), "samples_per_s": steps * batch_size / seconds if steps else float("nan"),
        "step_ms_median": statistics.median(step_ms) if step_ms else float("nan"),
        "step_ms_p10": _quantile(step_ms, 0.1), "step_ms_p90": _quantile(step_ms, 0.9),
        "step_ms_max": max(step_ms, default=float("nan")),
        "breakdown_ms": breakdown, "breakdown_total_ms": sum(breakdown.values()) if breakdown else None,
        "train_samples": (warmup + breakdown_steps + steps) * batch_size, "loss_last_steps": tail}


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def fuselab_step(model: DLRM, hasher: Hasher, opts: Optimizers, cfg: DLRMConfig, device: torch.device) -> StepFn:
    """The body of ``fuselab.dlrm.train.train``'s loop: :func:`fuselab.dlrm.train.train_step`."""
    loss_fn = nn.BCEWithLogitsLoss()

    def step(batch: Batch, timer: PhaseTimer) -> Tensor:
        return train_step(model, hasher, opts, loss_fn, batch, cfg, device, timer)

    return step


def baseline_step(trainer: ReferenceTrainer, hasher: Hasher) -> StepFn:
    def step(batch: Batch, timer: PhaseTimer) -> Tensor:
        return trainer.step(batch.dense, hasher(batch.sparse), batch.labels, timer)

    return step
