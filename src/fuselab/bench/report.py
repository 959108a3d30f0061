"""Terminal tables (rich) for a run and for a comparison of two runs."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from . import results as R


def fmt_time(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms < 1.0:
        return f"{ms * 1e3:.1f} µs"
    if ms < 1000:
        return f"{ms:.3f} ms"
    return f"{ms / 1e3:.2f} s"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt_num(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:{spec}}{suffix}"


def fmt_sig(x: float | None) -> str:
    """``x`` to 3 significant digits (0.0312, 2.14, 987), numbers of 1000 and more whole (3350); "-" for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{float(f'{x:.3g}'):g}"


def fmt_error(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.1e}"


def _status(r: R.Result) -> Text:
    """The status word first (always shown whole), then its detail (folded over more lines when narrow)."""
    style = {R.OK: "green", R.WRONG: "bold red", R.FAILED: "red", R.CORRECTNESS_ONLY: "cyan",
             R.BOUND: "blue"}.get(r.status, "dim")
    text = Text(r.status, style=style)
    if r.detail:
        text.append(f": {r.detail}", style="" if r.status in (R.WRONG, R.FAILED) else "dim")
    return text


def _speedup(x: float | None) -> Text:
    if x is None:
        return Text("-")
    return Text(f"{x:.2f}x", style="green" if x >= 1.05 else ("red" if x <= 0.95 else ""))


#: the columns of the default table (readable in 100 terminal columns); ``wide`` adds the others
NARROW = ("case", "provider", "time", "GB/s", "% copy", "vs base", "status")
WIDE_EXTRA = ("p20-p80", "% stream", "TFLOP/s", "vs compile", "rel err", "peak mem")
#: the same for runs measured in samples (whole training steps: :func:`fuselab.bench.results.is_throughput`)
STEP_NARROW = ("case", "provider", "time", "samples/s", "TFLOP/s", "vs base", "peak mem", "status")
STEP_WIDE_EXTRA = ("p20-p80", "GB/s", "vs compile", "rel err")


def _cells(r: R.Result, first: bool, is_best: bool) -> dict[str, str | Text]:
    time_style = "bold green" if is_best else ("dim strike" if r.status == R.WRONG else "")
    if r.status == R.BOUND:
        time_style = "blue"
    return {
        "case": f"{r.case} {r.dtype} {r.mode}" if first else "",
        "provider": Text(r.provider, style="bold green" if is_best else ("blue" if r.status == R.BOUND else "")),
        "time": Text(fmt_time(r.median_ms), style=time_style),
        "p20-p80": Text(f"{fmt_time(r.p20_ms)}-{fmt_time(r.p80_ms)}" if r.median_ms is not None else "-",
                        style="dim"),
        "GB/s": fmt_sig(r.gbps),
        "% copy": fmt_num(None if r.copy_fraction is None else 100 * r.copy_fraction, ".0f", "%"),
        "% stream": fmt_num(None if r.of_stream is None else 100 * r.of_stream, ".0f", "%"),
        "TFLOP/s": fmt_num(r.tflops, ".3g"),
        "samples/s": "-" if r.samples_per_s is None else f"{r.samples_per_s / 1e6:.3g}M",
        "vs base": _speedup(r.speedup_vs_baseline),
        "vs compile": _speedup(r.speedup_vs_compile),
        "rel err": fmt_error(r.rel_error),
        "peak mem": fmt_bytes(r.peak_mem_bytes),
        "status": _status(r),
    }


def run_table(run: R.OpRun, baseline: str = "eager", wide: bool = False) -> Table:
    """One op's results: a section per case, the fastest correct provider in bold green.

    A WRONG provider's time is shown dimmed and struck through, with no speedup: never a win. The ``stream`` row
    (the stream bound, a kernel that only moves the case's bytes) is blue; ``% stream`` is its time over a
    provider's: how close the provider runs to the limit at that size.

    The default columns (:data:`NARROW`) fit a 100-column terminal: the case and the status fold onto more lines
    when space is short, the figures are never cut. ``wide`` adds :data:`WIDE_EXTRA` (all of them are in the
    JSON and CSV files either way)."""
    copy = f"{run.ceilings.copy_gbps:.1f} GB/s" if run.ceilings else "not measured"
    caption = f"{run.timer}; % copy = GB/s / measured copy {copy}; vs {baseline} = its time / this time"
    if R.is_throughput(run.results):
        caption = f"{run.timer}; samples/s = samples per step / time; vs {baseline} = its time / this time"
    caption += ("; % stream = stream bound's time / provider's time" if wide else
                "; more columns: --wide, and the JSON/CSV files")
    table = Table(title=f"{run.op}: {run.summary}", caption=caption, caption_justify="left")
    narrow, extra = (STEP_NARROW, STEP_WIDE_EXTRA) if R.is_throughput(run.results) else (NARROW, WIDE_EXTRA)
    names = [*narrow[:-1], *(extra if wide else ()), narrow[-1]]
    for name in names:
        header = f"vs {baseline}" if name == "vs base" else name
        if name == "case":
            table.add_column(header, overflow="fold", min_width=8)
        elif name == "status":
            table.add_column(header, overflow="fold", min_width=13)  # "not installed", "skipped", "WRONG" whole
        else:
            table.add_column(header, justify="left" if name == "provider" else "right", no_wrap=True)
    best = R.best_providers(run.results)
    previous = None
    for r in run.results:
        if previous is not None and r.case_key != previous:
            table.add_section()
        first = r.case_key != previous
        previous = r.case_key
        cells = _cells(r, first, best.get(r.case_key) == r.provider)
        table.add_row(*(cells[name] for name in names))
    return table


def ceilings_lines(ceilings: R.Ceilings | None) -> list[str]:
    if ceilings is None:
        return ["ceilings: not measured"]
    lines = [f"copy bandwidth: {ceilings.copy_gbps:.1f} GB/s ({ceilings.copy_method})"]
    if ceilings.copy_check_gbps:
        lines.append(f"  cross-check (plain copy loop): {ceilings.copy_check_gbps:.1f} GB/s, "
                     f"ratio {ceilings.copy_agreement:.3f}")
    if ceilings.matmul_tflops:
        lines.append(f"matmul rate: {ceilings.matmul_tflops:.3g} TFLOP/s ({ceilings.matmul_method})")
    return lines
