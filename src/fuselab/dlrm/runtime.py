"""What a training run needs around the model: the device, the default dataset, a phase timer, the profiler."""

from __future__ import annotations

import contextlib
import io
import shutil
import time
from pathlib import Path

import torch

from fuselab._io import atomic_write, atomic_write_text

from .config import DEFAULT_SYNTH_DIR

#: phases of ``--breakdown``: reading the next batch, and the whole training step (forward, backward, updates)
PHASES = ("data", "step")


def resolve_device(name: str | None) -> torch.device:
    """``None``: cuda when available, else cpu. ``ValueError`` for a CUDA device on a machine without CUDA."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine")
    return device


def resolve_kernels(kernels: str, device: torch.device) -> str:
    """``auto`` -> ``fuselab`` on CUDA, ``torch`` elsewhere; other values unchanged."""
    if kernels == "auto":
        return "fuselab" if device.type == "cuda" else "torch"
    return kernels


def default_dataset(log) -> Path:
    """The small synthetic dataset in :data:`DEFAULT_SYNTH_DIR` (written on first use)."""
    from .data.synth import SynthSpec, write_synthetic

    root = Path(DEFAULT_SYNTH_DIR)
    if not (root / "metadata.json").is_file():
        log(f"no --data given: writing a small synthetic dataset (1M rows, about 270 MB) to {root} ...")
        write_synthetic(root, SynthSpec(rows=1_000_000, scale=1e-4, seed=0), shard_rows=1 << 18)
    return root


class PhaseTimer:
    """Wall time per phase (:data:`PHASES`, or any other name); synchronizes the device at phase boundaries only
    when enabled."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.enabled:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def report(self) -> dict[str, float]:
        """Milliseconds per step of each phase."""
        return {k: 1e3 * v / max(1, self.steps) for k, v in self.totals.items()}


def _kernel_table_text(prof, device: torch.device, steps: int) -> str:
    try:
        from rich.console import Console

        from fuselab.profile import kernel_table, render_kernel_table

        on_gpu = device.type == "cuda"
        table = render_kernel_table(kernel_table(prof, device=on_gpu), title="DLRM training steps", device=on_gpu,
                                    steps=steps)
        console = Console(file=io.StringIO(), width=150, record=True)
        console.print(table)
        return console.export_text()
    except (ImportError, AttributeError, TypeError):
        sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        return prof.key_averages().table(sort_by=sort, row_limit=30)


def profiler(directory: Path, device: torch.device, log, active_steps: int = 5):
    """A profiler over steps 5..(4 + active_steps) of the run: Chrome trace, TensorBoard trace, kernel table."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    tb_handler = tensorboard_trace_handler(str(directory / "tensorboard"))

    def on_ready(prof) -> None:
        tb_handler(prof)  # writes a Chrome trace (*.pt.trace.json) that TensorBoard's profiler plugin reads
        newest = max((directory / "tensorboard").glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
        with newest.open("rb") as src:  # one save per trace: copy it for chrome://tracing
            atomic_write(directory / "trace.json", lambda f: shutil.copyfileobj(src, f), "profiler trace")
        text = _kernel_table_text(prof, device, active_steps)
        atomic_write_text(directory / "kernels.txt", text, "kernel table")
        log(text)
        log(f"profile: {directory / 'trace.json'} (Chrome), {directory / 'tensorboard'} (TensorBoard), "
            f"{directory / 'kernels.txt'}")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, schedule=schedule(wait=2, warmup=2, active=active_steps, repeat=1),
                   on_trace_ready=on_ready, record_shapes=True)


class RateMeter:
    """Samples per second after ``warmup`` steps of this invocation (compilation and first-touch excluded)."""

    def __init__(self, device: torch.device, warmup: int):
        self.device, self.warmup = device, warmup
        self.t_begin = time.perf_counter()
        self.steps, self.samples = 0, 0
        self.t_measure: float | None = None
        self.seconds = 0.0
        self._final: float | None = None

    def count(self, samples: int) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            self._sync()
            self.t_measure = time.perf_counter()
        elif self.t_measure is not None:
            self.samples += samples

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def rate(self) -> float | None:
        if self._final is not None or self.t_measure is None or not self.samples:
            return self._final
        return self.samples / (time.perf_counter() - self.t_measure)

    def finish(self) -> None:
        self._sync()
        now = time.perf_counter()
        self.seconds = now - self.t_begin
        if self.t_measure is not None and self.samples:
            self._final = self.samples / (now - self.t_measure)


def progress_bar(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn())
    return Progress(*columns, disable=not enabled, transient=True)
