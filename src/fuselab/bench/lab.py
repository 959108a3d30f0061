"""``fuselab.bench.run``: the whole lab run behind ``fuselab bench`` (same defaults as the CLI)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fuselab.core.console import make_console

from . import results as R
from .options import BenchOptions
from .report import ceilings_lines, run_table
from .runner import count_jobs, prepare, run_op, validate
from .timing import Timer

CPU_NOTE = "CPU (no GPU): CPU timings; Triton providers under the interpreter, correctness only"


def run(options: BenchOptions | None = None, *, timer: Timer | None = None, ceilings: R.Ceilings | None = None,
        device: torch.device | None = None, console: Console | None = None,
        progress: bool | None = None) -> list[R.OpRun]:
    """Run the lab: check and time every requested op × case × provider, print a table per op,
    write ``<out>/<op>.json`` and ``.csv`` (and PNGs with ``plot``). Returns the runs.

    Progress: a bar on a terminal (``progress``: force it on or off); otherwise one line as each op starts, with
    the time spent so far (a full run on a 2-core CPU takes minutes). ``timer`` and ``ceilings`` may be injected
    (tests use a fake clock). Raises ``ValueError``
    for an unknown op/provider/dtype/mode and :class:`fuselab._io.PathError` (a ``ValueError`` naming the
    folder) for an unwritable output folder, both before anything is measured. The default output folder,
    :func:`~fuselab.bench.options.default_out_dir`, is relative to the current working directory.
    Failures of single providers or ops never raise: they
    are reported in the results (status ``failed`` with the error).
    """
    options = options or BenchOptions()
    console = console or make_console()
    ops = validate(options)
    out_dir: Path = options.out_dir()
    if options.write:
        R.check_writable(out_dir)
    show = console.is_terminal if progress is None else progress
    started = time.perf_counter()
    if ceilings is None:
        console.print("measuring the copy bandwidth and the matmul rate of this machine ...")
    device, timer, ceilings, env = prepare(device, timer, ceilings, quick=options.quick)
    where = "GPU" if device.type == "cuda" else CPU_NOTE
    console.print(f"[bold]fuselab bench[/] on {env.get('device')} — {where}")
    for line in ceilings_lines(ceilings):
        console.print(line)
    if "ceilings_error" in env:
        console.print(f"[red]ceilings not measured: {env['ceilings_error']}[/]")
    runs = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not show, transient=True) as bar:
        task = bar.add_task("bench", total=count_jobs(ops, options, device) or None)

        def tick(description: str) -> None:
            bar.update(task, description=description)
            bar.advance(task)

        for index, op in enumerate(ops):
            if not show:  # no bar: a line per op, so that a log shows where a long run is
                console.print(f"[{index + 1}/{len(ops)}] {op}: checking and timing "
                              f"({time.perf_counter() - started:.0f} s so far)")
            op_run = run_op(op, options, device, timer, ceilings, env, progress=tick)
            runs.append(op_run)
            if op_run.error:
                console.print(f"[red]{op}: {op_run.error}[/]")
            else:
                baseline = _baseline(op)
                console.print(run_table(op_run, baseline=baseline, wide=options.wide))
            if options.write:
                written = R.save(op_run, out_dir)
                if options.plot and not op_run.error:
                    from .plots import plot_run

                    written += plot_run(op_run, out_dir)
                console.print("wrote " + ", ".join(str(p.resolve()) for p in written))  # where, whatever the cwd
    return runs


def _baseline(op: str) -> str:
    from .suites import get_spec

    try:
        return get_spec(op).baseline
    except Exception:
        return "eager"
