"""What a training run needs around the model: the device, the default dataset, a phase timer, the profiler."""

from __future__ import annotations

import contextlib
import io
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fuselab._io import atomic_write, atomic_write_json, atomic_write_text
from fuselab.core.console import console_width
from fuselab.profile import kernel_rows_json, kernel_table, quiet_profiler, render_kernel_table

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


@dataclass(frozen=True)
class ProfileWindow:
    """The steps ``--profile`` records, counted from the first step of this invocation: ``wait`` steps run
    unprofiled, ``warmup`` are profiled and dropped, ``active`` are recorded. ``clean``: no periodic evaluation or
    checkpoint runs inside the recorded steps."""

    wait: int
    warmup: int
    active: int
    clean: bool = True

    def steps(self, first_step: int) -> range:
        """The (1-based) training steps recorded in a run that starts after ``first_step``."""
        start = first_step + self.wait + self.warmup + 1
        return range(start, start + self.active)


def profile_window(first_step: int, steps_left: int, periods: Sequence[int] = (), active: int = 5,
                   wait: int = 2, warmup: int = 2) -> ProfileWindow | None:
    """Where ``--profile`` records: ``active`` steps after ``wait`` + ``warmup`` steps, moved later or made shorter
    so that no periodic work (every ``periods`` steps, 0: never; it runs after a step and before the next)
    falls inside it, and fitted into the ``steps_left`` steps of the run (shorter runs give up the wait first,
    then recorded steps, then warm-up steps). None when fewer than 2 steps are left (one warm-up step and one
    recorded step are the least); ``clean=False`` when no window of the run avoids the periodic work."""
    if steps_left < 2:
        return None
    warmup = max(1, min(warmup, steps_left - 1))
    periods = [p for p in periods if p > 0]
    span = math.lcm(*periods) if periods else 1  # the pattern of periodic steps repeats after this many steps

    def clean(skip: int, recorded: int) -> bool:  # periodic work after steps first+skip .. first+skip+recorded-1
        start = first_step + skip
        return not any(n % p == 0 for n in range(start, start + recorded) for p in periods)

    for recorded in range(min(active, steps_left - warmup), 0, -1):
        latest = steps_left - warmup - recorded
        earliest = min(wait, latest)
        for skip in range(earliest, min(latest, earliest + span) + 1):
            if clean(skip + warmup, recorded):
                return ProfileWindow(skip, warmup, recorded)
    recorded = min(active, steps_left - warmup)
    return ProfileWindow(min(wait, steps_left - warmup - recorded), warmup, recorded, clean=False)


#: columns of the per-kernel table written to ``kernels.txt`` (the terminal's copy takes the console's width)
TABLE_FILE_WIDTH = 120


def _kernel_table_text(rows, device: torch.device, steps: range, clean: bool, limit: int | None,
                       width: int) -> str:
    from rich.console import Console

    on_gpu = device.type == "cuda"
    caption = "" if clean else "includes the periodic evaluation or checkpoint that runs between these steps"
    which = f"step {steps.start}" if len(steps) == 1 else f"steps {steps.start}-{steps.stop - 1}"
    title = f"DLRM training {which}: {'GPU kernels' if on_gpu else 'CPU ops'} per step"
    table = render_kernel_table(rows, title=title, device=on_gpu, steps=len(steps), limit=limit, unit="step",
                                caption=caption)
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(table)
    return console.export_text()


class StepProfiler:
    """``torch.profiler`` over the training steps of a :class:`ProfileWindow`, used as ``with``, with
    :meth:`step` called after every training step. When the window closes it writes into ``directory``:
    ``kernels.txt`` (every kernel of one step on CUDA, every top-level CPU op on CPU: calls and time per step,
    time per call, share; largest first; short kernel names, one line each), ``kernels.json`` (the same rows with
    the full demangled names), ``trace.json`` (Chrome trace) and ``tensorboard/``, and logs the table's top rows
    and the paths. Kineto's ``USDT:`` lines are dropped from stderr (other output is kept)."""

    def __init__(self, directory: Path, device: torch.device, log, window: ProfileWindow, first_step: int):
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        self.directory, self.device, self.log, self.window = Path(directory), device, log, window
        self.first_step, self.calls, self.done = first_step, 0, False
        self._tensorboard = tensorboard_trace_handler(str(self.directory / "tensorboard"))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=activities, on_trace_ready=self._ready, record_shapes=True,
                            schedule=schedule(wait=window.wait, warmup=window.warmup, active=window.active, repeat=1))

    def __enter__(self) -> StepProfiler:
        with quiet_profiler():
            self.prof.__enter__()
        return self

    def step(self) -> None:
        if self.done:
            return
        self.calls += 1
        with quiet_profiler():
            self.prof.step()

    def __exit__(self, *exc) -> None:
        with quiet_profiler():
            self.prof.__exit__(*exc)
        if not self.done and exc[0] is None:
            planned = self.window.steps(self.first_step)
            self.log(f"profile: nothing recorded: the run stopped after step {self.first_step + self.calls}, "
                     f"before the profiled steps {planned.start}-{planned.stop - 1}")

    def _ready(self, prof) -> None:
        self.done = True
        directory, skipped = self.directory, self.window.wait + self.window.warmup
        steps = self.window.steps(self.first_step)[:max(1, min(self.calls, skipped + self.window.active) - skipped)]
        self._tensorboard(prof)  # writes a Chrome trace (*.pt.trace.json) that TensorBoard's profiler plugin reads
        newest = max((directory / "tensorboard").glob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
        with newest.open("rb") as src:  # one save per trace: copy it for chrome://tracing
            atomic_write(directory / "trace.json", lambda f: shutil.copyfileobj(src, f), "profiler trace")
        rows = kernel_table(prof, device=self.device.type == "cuda")
        table = directory / "kernels.txt"
        atomic_write_text(table, _kernel_table_text(rows, self.device, steps, self.window.clean, None,
                                                    TABLE_FILE_WIDTH), "kernel table")
        atomic_write_json(directory / "kernels.json", {"steps": [steps.start, steps.stop - 1],
                                                       "rows": kernel_rows_json(rows, len(steps))}, "kernel table")
        self.log(_kernel_table_text(rows, self.device, steps, self.window.clean, 15, console_width()))
        self.log(f"profile: per-{'kernel' if self.device.type == 'cuda' else 'op'} table of one step: {table}; "
                 f"traces: {directory / 'trace.json'} (Chrome), {directory / 'tensorboard'} (TensorBoard)")


def step_profiler(directory: Path, device: torch.device, log, first_step: int, total_steps: int,
                  periods: Sequence[int]) -> StepProfiler | None:
    """The :class:`StepProfiler` of a run from ``first_step`` to ``total_steps`` whose periodic work comes every
    ``periods`` steps (:func:`profile_window`); None, logged, when the run is too short to profile."""
    window = profile_window(first_step, total_steps - first_step, periods)
    if window is None:
        log(f"profile: nothing recorded: {total_steps - first_step} step(s) to run, profiling needs 2")
        return None
    return StepProfiler(directory, device, log, window, first_step)


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
