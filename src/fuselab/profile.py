"""``fuselab profile``: one op × provider × shape under ``torch.profiler``.

Prints a per-kernel device-time table (name, calls per call, time per call, time per kernel call, share), the
number of kernel launches per call (what shows fusion: the eager GELU formula launches one
kernel per operator, ``torch.compile`` one in all), the host time per call and the wall time
per call. On a machine without a GPU it prints the CPU op table instead (top-level ATen ops and
compiled-graph calls, CPU time), labelled as such. ``trace`` writes a Chrome trace (chrome://tracing, ui.perfetto.dev).
For ``torch.compile`` providers the Python module Inductor generated (Triton kernels on GPU,
C++ on CPU) is copied next to the trace / into ``out_dir`` and its fused kernels are listed. The trace file and
``out_dir`` are checked for writing before anything runs (:class:`fuselab._io.PathError`, a ``ValueError`` naming
the path); files are written atomically. Kineto's ``USDT: ... profiler_start/profiler_stop`` lines, which it
writes to stderr at every profile, are dropped (other stderr output of the profiled window is passed on): its
only switch for them, ``KINETO_LOG_LEVEL=6``, silences its errors too.

:func:`kernel_table` and :func:`render_kernel_table` are reusable (the DLRM trainer uses them).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from fuselab._io import PathError, atomic_write_text, writable_dir, writable_file
from fuselab.bench.kernel_names import short_kernel_name

STEP_RANGE = "fuselab::step"


@dataclass(frozen=True)
class KernelRow:
    """One kernel (GPU) or CPU op: ``total_us`` device time (GPU) or self CPU time (CPU)."""

    name: str
    calls: int
    total_us: float
    avg_us: float
    percent: float  # of the total over all rows


def _is_device_event(e: Any) -> bool:
    """A kernel, memcpy or memset on the device; not a user annotation (``record_function`` ranges such as
    ``fuselab::step`` are mirrored onto the GPU timeline and would count their kernels twice)."""
    if getattr(e, "is_user_annotation", False) or e.name == STEP_RANGE:
        return False
    return str(getattr(e, "device_type", "")).endswith(("CUDA", "PrivateUse1")) or getattr(e, "is_kernel", False)


def _is_cpu_compute(e: Any) -> bool:
    """A top-level ATen op (no ATen op above it) or a call of an Inductor-compiled graph."""
    if "CompiledFxGraph" in e.name:
        return True
    if not e.name.startswith("aten::"):
        return False
    parent = e.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::") or "CompiledFxGraph" in parent.name:
            return False
        parent = parent.cpu_parent
    return True


def kernel_table(prof: torch.profiler.profile, device: bool | None = None) -> list[KernelRow]:
    """Aggregate a finished profile by name, largest total first.

    ``device=True``: GPU kernels (and memcpy/memset) with their device durations. ``device=False``:
    top-level ATen ops and Inductor compiled-graph calls with their CPU time (children included).
    ``None``: device rows when the profile holds any, else CPU rows.
    """
    events = list(prof.events())
    dev = [e for e in events if _is_device_event(e)]
    if device is None:
        device = bool(dev)
    totals: dict[str, list[float]] = {}
    if device:
        for e in dev:
            entry = totals.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us()
    else:
        for e in events:
            if _is_device_event(e) or not _is_cpu_compute(e):
                continue
            entry = totals.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += e.cpu_time_total
    grand = sum(t for _, t in totals.values()) or 1.0
    rows = [KernelRow(name, int(n), t, t / n if n else 0.0, 100.0 * t / grand) for name, (n, t) in totals.items()]
    return sorted(rows, key=lambda r: r.total_us, reverse=True)


def _unique_short_names(rows: Sequence[KernelRow]) -> list[str]:
    """:func:`short_kernel_name` of each row; a name that repeats gets `` #2``, `` #3``..."""
    seen: dict[str, int] = {}
    names = []
    for r in rows:
        short = short_kernel_name(r.name)
        seen[short] = seen.get(short, 0) + 1
        names.append(short if seen[short] == 1 else f"{short} #{seen[short]}")
    return names


def kernel_rows_json(rows: Sequence[KernelRow], steps: int = 1) -> list[dict[str, Any]]:
    """The rows as JSON records: the full (demangled) ``name``, the table's ``short_name``, the figures per unit."""
    steps = max(steps, 1)
    return [{"name": r.name, "short_name": short, "calls_per_unit": r.calls / steps, "us_per_unit": r.total_us / steps,
             "us_per_call": r.avg_us, "percent": r.percent} for r, short in zip(rows, _unique_short_names(rows))]


def render_kernel_table(rows: Sequence[KernelRow], title: str = "kernels", device: bool = True,
                        steps: int = 1, limit: int | None = 30, unit: str = "call", caption: str = "") -> Table:
    """A rich table of :func:`kernel_table` rows of a profile over ``steps`` repetitions of one ``unit`` (a call of
    an op, a training step), in the rows' order: the kernel's short name (:func:`short_kernel_name`, one line;
    the full name is in the trace), calls per unit, time per unit, time per call, share of the total. ``limit``
    rows at most (None: all); ``caption`` is added below the table's own caption."""
    what = "device time" if device else "CPU time"
    steps = max(steps, 1)
    note = f"averages over {steps} {unit}{'s' if steps > 1 else ''}; {what}; share: of the total {what} in the profile"
    table = Table(title=title, caption=note + (f"\n{caption}" if caption else ""), caption_justify="left")
    table.add_column("kernel" if device else "CPU op", no_wrap=True, overflow="ellipsis")
    for col in (f"calls per {unit}", f"{what} per {unit}", "per call", "share"):
        table.add_column(col, justify="right", no_wrap=True)
    shown = rows[:limit] if limit else rows
    for r, short in zip(shown, _unique_short_names(shown)):
        table.add_row(short, f"{r.calls / steps:g}", f"{r.total_us / steps:.1f} µs", f"{r.avg_us:.2f} µs",
                      f"{r.percent:.1f}%")
    if limit and len(rows) > limit:
        table.add_row(f"... {len(rows) - limit} more", "", "", "", "")
    return table


FUSED_KERNEL = re.compile(r"^(\w+)\s*=\s*async_compile\.(?!wait\b)\w+\(", re.MULTILINE)


def fused_kernels(source: str) -> list[str]:
    """Names of the kernels defined in an Inductor output-code module (``triton_poi_fused_*``, ``cpp_fused_*``)."""
    return FUSED_KERNEL.findall(source)


def _inductor_modules() -> list[Any]:
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:
        return []
    mods = PyCodeCache.modules
    return list(mods.values()) if isinstance(mods, dict) else list(mods)


@dataclass
class ProfileResult:
    op: str
    provider: str
    case: str
    device: str  # "cuda" or "cpu"
    steps: int
    rows: list[KernelRow]
    launches_per_call: float  # GPU kernels (or CPU compute ops) per call
    host_us_per_call: float  # CPU time inside one call (launch overhead on a GPU)
    wall_us_per_call: float  # wall time per call, synchronized
    device_us_per_call: float | None  # summed kernel time per call (GPU)
    trace: Path | None = None
    inductor_sources: list[Path] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)


def profile_fn(step: Callable[[], Any], steps: int = 10, warmup: int = 3,
               trace: Path | None = None) -> tuple[torch.profiler.profile, float]:
    """Profile ``steps`` calls of ``step`` (after ``warmup``), each inside a ``fuselab::step`` range.

    Returns the profiler and the synchronized wall time per call in µs."""
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with quiet_profiler(), profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            with record_function(STEP_RANGE):
                step()
        sync()
        wall = (time.perf_counter() - t0) * 1e6 / steps
    if trace is not None:
        export_trace(prof, trace)
    return prof, wall


@contextlib.contextmanager
def quiet_profiler() -> Iterator[None]:
    """Around a profiler's start, steps and stop: kineto's ``USDT:`` stderr lines dropped (:func:`drop_stderr_lines`)
    and torch's warning that a cycle drops the events of the cycle before (fuselab profiles one cycle)."""
    with drop_stderr_lines(KINETO_NOISE), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
        yield


#: stderr lines kineto prints at every profiler start and stop, whatever KINETO_LOG_LEVEL says
KINETO_NOISE = ("USDT:",)


@contextlib.contextmanager
def drop_stderr_lines(prefixes: tuple[str, ...]):
    """Run the block with file descriptor 2 sent to a temporary file, then pass its lines on to stderr, except
    those starting with one of ``prefixes`` (C++ libraries write to the descriptor, not to ``sys.stderr``)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced (pytest's capsys): nothing to filter
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not line.startswith(prefixes)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def export_trace(prof: torch.profiler.profile, trace: Path) -> Path:
    """Write ``prof``'s Chrome trace to ``trace`` atomically (a temporary file beside it, then a rename), with the
    usual permissions; :class:`PathError` naming the file when it cannot be written."""
    trace = Path(trace)
    try:
        fd, tmp = tempfile.mkstemp(dir=trace.parent, prefix=f".{trace.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as err:
        raise PathError(f"cannot write trace file {trace}: {err.strerror or err}") from None
    try:
        prof.export_chrome_trace(tmp)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, trace)
    except OSError as err:
        raise PathError(f"cannot write trace file {trace}: {err.strerror or err}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return trace


def host_us_per_call(prof: torch.profiler.profile) -> float:
    spans = [e.cpu_time_total for e in prof.events() if e.name == STEP_RANGE]
    return sum(spans) / len(spans) if spans else 0.0


def _launches(rows: Sequence[KernelRow], steps: int) -> float:
    return sum(r.calls for r in rows) / steps


def profile_case(op: str, provider: str | None = None, shape: str | None = None, dtype: str = "fp32",
                 mode: str = "fwd", steps: int = 10, trace: Path | None = None,
                 out_dir: Path | None = None) -> ProfileResult:
    """Profile one op × provider × case (``provider`` None: the op's baseline, the provider its speedups are
    measured against; ``shape`` = a case label; None: the first quick case).

    Raises ``ValueError`` for an unknown op, provider, dtype, mode or shape (listing valid ones) and
    :class:`PathError` (a ``ValueError``) when ``trace`` or ``out_dir`` cannot be written, both before anything
    runs, and ``RuntimeError`` when the provider cannot run here (not installed, CUDA-only, skipped)."""
    from fuselab.backend import forced
    from fuselab.bench.check import prepare_args
    from fuselab.bench.options import BenchOptions
    from fuselab.bench.runner import make_step, validate
    from fuselab.bench.spec import GRAD_MODES
    from fuselab.bench.suites import get_spec

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    validate(BenchOptions(ops=(op,), providers=(provider,) if provider else (), dtypes=(dtype,), modes=(mode,)))
    if trace is not None:
        trace = writable_file(trace, "trace file")
    if out_dir is not None:
        out_dir = writable_dir(out_dir, "output folder")
    spec = get_spec(op)
    provider = provider or spec.baseline
    prov = spec.provider(provider)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    case = _find_case(spec, device, dtype, mode, shape)
    if prov.missing():
        raise RuntimeError(f"provider {provider!r} is not installed (needs {prov.missing()})")
    reason = prov.skip_reason(case) or ("needs CUDA" if prov.cuda_only and device.type != "cuda" else None)
    if reason:
        raise RuntimeError(f"provider {provider!r} cannot run {case.key}: {reason}")
    before = {id(m) for m in _inductor_modules()}
    interpreted = prov.triton and device.type != "cuda"
    with forced("triton") if interpreted else contextlib.nullcontext():
        fn = prov.build(case)
        args = prepare_args(spec.make_inputs(case, device), spec.grad_args(case), mode in GRAD_MODES)
        step, leaves = make_step(fn, args, case, spec.grad_args(case))

        def reset_and_step() -> None:
            for t in leaves:
                t.grad = None
            step()

        prof, wall = profile_fn(reset_and_step, steps=steps, trace=trace)
    on_device = device.type == "cuda"
    rows = kernel_table(prof, device=on_device)
    dev_us = sum(r.total_us for r in rows) / steps if on_device else None
    result = ProfileResult(op, provider, case.key, device.type, steps, rows, _launches(rows, steps),
                           host_us_per_call(prof), wall, dev_us, trace=trace)
    new = [m for m in _inductor_modules() if id(m) not in before and getattr(m, "__file__", None)]
    target = out_dir or (trace.parent if trace is not None else None)
    for i, module in enumerate(new):
        source = Path(module.__file__).read_text()
        result.fused += fused_kernels(source)
        if target is not None:
            dest = target / f"{op}_{_safe(provider)}_{_safe(case.label)}_inductor_{i}.py"
            result.inductor_sources.append(atomic_write_text(dest, source, "Inductor source file"))
    return result


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _find_case(spec: Any, device: torch.device, dtype: str, mode: str, shape: str | None):
    from fuselab.bench.options import BenchOptions
    from fuselab.bench.runner import spec_query

    opts = BenchOptions(dtypes=(dtype,), modes=(mode,))
    quick = spec.cases(spec_query(device, BenchOptions(dtypes=(dtype,), modes=(mode,), quick=True)))
    full = spec.cases(spec_query(device, opts))
    if shape is None:  # the first quick case, else the first of the full list (a dtype the quick list lacks)
        if not (quick or full):
            raise ValueError(f"op {spec.name!r} has no {dtype} {mode} case on {device.type}")
        return (quick or full)[0]
    for case in [*quick, *full]:
        if case.label == shape:
            return case
    labels = list(dict.fromkeys(c.label for c in [*quick, *full]))
    raise ValueError(f"unknown shape {shape!r} for {spec.name} {dtype} {mode}; valid shapes: {', '.join(labels)}")
