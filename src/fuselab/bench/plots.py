"""PNG plots of one op's run: GB/s vs size per provider, and a roofline.

``<out>/<op>_gbps.png``: one panel per (dtype, mode), GB/s vs numel (log x), one line per
provider, the measured copy bandwidth as a dashed line. Runs measured in samples (whole training steps) draw
``<out>/<op>_samples.png`` instead: one panel per (case group, dtype), samples/s vs batch. ``<out>/<op>_roofline.png``:
arithmetic intensity (flop/byte) vs achieved TFLOP/s with the bandwidth and compute ceilings.
Only correct, timed results are drawn (WRONG ones are left out). Written atomically.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import results as R
from .report import fmt_sig


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    R.write_atomic(path, buf.getvalue())
    return path


@dataclass(frozen=True)
class _Chart:
    """A figure of one panel per ``panel(result)`` (sorted), one line per provider of ``point(result)`` = (x, y),
    log-2 x axis; ``extra(ax, panel)`` draws what else a panel holds."""

    panel: Callable[[R.Result], tuple]
    point: Callable[[R.Result], tuple[float, float]]
    xlabel: str
    ylabel: str
    title: Callable[[tuple], str]
    extra: Callable[[Any, tuple], None] | None = None


def _draw(run: R.OpRun, ok: list[R.Result], chart: _Chart, path: Path) -> Path | None:
    panels = sorted({chart.panel(r) for r in ok})
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        rows = [r for r in ok if chart.panel(r) == panel]
        for provider in dict.fromkeys(r.provider for r in rows):
            pts = sorted(chart.point(r) for r in rows if r.provider == provider)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=provider)
        if chart.extra is not None:
            chart.extra(ax, panel)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.ylabel)
        ax.set_title(chart.title(panel))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{run.op} on {run.env.get('device', '?')} ({run.timer})", fontsize=9)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_gbps(run: R.OpRun, path: Path) -> Path | None:
    """GB/s vs numel, one panel per (dtype, mode), with the stream bound of the same bytes and the copy bandwidth."""

    def bounds(ax, panel: tuple) -> None:
        bound = sorted((r.numel, r.gbps) for r in run.results
                       if r.status == R.BOUND and r.gbps is not None and (r.dtype, r.mode) == panel)
        if bound:
            ax.plot([p[0] for p in bound], [p[1] for p in bound], ls=":", marker="x", color="black",
                    label="stream bound (same bytes)")
        if run.ceilings:
            ax.axhline(run.ceilings.copy_gbps, ls="--", color="gray", label="copy bandwidth")

    ok = [r for r in run.results if r.timed_ok and r.gbps is not None]
    return _draw(run, ok, _Chart(lambda r: (r.dtype, r.mode), lambda r: (r.numel, r.gbps), "elements (numel)",
                                 "GB/s", lambda panel: f"{run.op} {panel[0]} {panel[1]}", bounds), path)


def plot_samples(run: R.OpRun, path: Path) -> Path | None:
    """Samples/s vs samples per call (the batch), one panel per (case group, dtype), one line per provider."""
    ok = [r for r in run.results if r.timed_ok and r.samples_per_s is not None]
    return _draw(run, ok, _Chart(lambda r: (r.group, r.dtype), lambda r: (r.samples, r.samples_per_s / 1e6),
                                 "samples per step (batch)", "million samples/s",
                                 lambda panel: f"{run.op} {panel[0]} {panel[1]}".replace("  ", " ")), path)


def roof_label(copy_gbps: float, matmul_tflops: float | None) -> str:
    """The roofline's legend: both ceilings to 3 significant digits (0.21 TFLOP/s stays 0.21, never "0"); numbers
    of 1000 and more as whole numbers."""
    text = f"roof: {fmt_sig(copy_gbps)} GB/s"
    return text + (f", {fmt_sig(matmul_tflops)} TFLOP/s" if matmul_tflops else "")


def plot_roofline(run: R.OpRun, path: Path) -> Path | None:
    plt = _pyplot()
    ok = [r for r in run.results if r.timed_ok and r.tflops and r.bytes]
    if not ok or run.ceilings is None:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for provider in dict.fromkeys(r.provider for r in ok):
        rows = [r for r in ok if r.provider == provider]
        ax.scatter([r.flops / r.bytes for r in rows], [r.tflops for r in rows], label=provider, s=18)
    lo = min(r.flops / r.bytes for r in ok) / 4
    bw = run.ceilings.copy_gbps / 1e3  # TB/s: TFLOP/s = intensity * TB/s
    peak = run.ceilings.matmul_tflops
    hi = max(max(r.flops / r.bytes for r in ok) * 4, (peak / bw * 4) if peak else 0)
    xs = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    roof = [min(x * bw, peak) if peak else x * bw for x in xs]
    ax.plot(xs, roof, color="black", lw=1.2, label=roof_label(run.ceilings.copy_gbps, peak))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{run.op} roofline on {run.env.get('device', '?')}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_run(run: R.OpRun, out_dir: Path) -> list[Path]:
    """Both plots of ``run`` into ``out_dir``; returns the files written."""
    out_dir = Path(out_dir)
    first = (plot_samples(run, out_dir / f"{run.op}_samples.png") if R.is_throughput(run.results)
             else plot_gbps(run, out_dir / f"{run.op}_gbps.png"))
    written = [first, plot_roofline(run, out_dir / f"{run.op}_roofline.png")]
    return [p for p in written if p is not None]
