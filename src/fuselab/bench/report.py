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


def fmt_error(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.1e}"


def _status(r: R.Result) -> Text:
    style = {R.OK: "green", R.WRONG: "bold red", R.FAILED: "red", R.CORRECTNESS_ONLY: "cyan",
             R.BOUND: "blue"}.get(r.status, "dim")
    text = r.status if not r.detail else f"{r.status}: {r.detail}"
    return Text(text, style=style)


def _speedup(x: float | None) -> Text:
    if x is None:
        return Text("-")
    return Text(f"{x:.2f}x", style="green" if x >= 1.05 else ("red" if x <= 0.95 else ""))


def run_table(run: R.OpRun, baseline: str = "eager") -> Table:
    """One op's results: a section per case, the fastest correct provider in bold green.

    A WRONG provider's time is shown dimmed and struck through, with no speedup: never a win. The ``stream`` row
    (the stream bound, a kernel that only moves the case's bytes) is blue; ``% stream`` is its time over a
    provider's: how close the provider runs to the limit at that size."""
    copy = f"{run.ceilings.copy_gbps:.1f} GB/s" if run.ceilings else "not measured"
    table = Table(title=f"{run.op}: {run.summary}",
                  caption=f"{run.timer}; % copy = GB/s / measured copy {copy}; "
                          "% stream = stream bound's time / provider's time", caption_justify="left")
    for name, justify in (("case", "left"), ("provider", "left"), ("time", "right"), ("p20-p80", "right"),
                          ("GB/s", "right"), ("% copy", "right"), ("% stream", "right"), ("TFLOP/s", "right"),
                          (f"vs {baseline}", "right"),
                          ("vs compile", "right"), ("rel err", "right"), ("peak mem", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("status", overflow="fold", min_width=12)
    best = R.best_providers(run.results)
    previous = None
    for r in run.results:
        if previous is not None and r.case_key != previous:
            table.add_section()
        first = r.case_key != previous
        previous = r.case_key
        is_best = best.get(r.case_key) == r.provider
        time_style = "bold green" if is_best else ("dim strike" if r.status == R.WRONG else "")
        spread = f"{fmt_time(r.p20_ms)}-{fmt_time(r.p80_ms)}" if r.median_ms is not None else "-"
        if r.status == R.BOUND:
            time_style = "blue"
        table.add_row(
            f"{r.case} {r.dtype} {r.mode}" if first else "",
            Text(r.provider, style="bold green" if is_best else ("blue" if r.status == R.BOUND else "")),
            Text(fmt_time(r.median_ms), style=time_style), Text(spread, style="dim"),
            fmt_num(r.gbps), fmt_num(None if r.copy_fraction is None else 100 * r.copy_fraction, ".0f", "%"),
            fmt_num(None if r.of_stream is None else 100 * r.of_stream, ".0f", "%"),
            fmt_num(r.tflops, ".3g"), _speedup(r.speedup_vs_baseline), _speedup(r.speedup_vs_compile),
            fmt_error(r.rel_error), fmt_bytes(r.peak_mem_bytes), _status(r),
        )
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
