"""``fuselab bench compare A.json B.json``: two runs side by side, regressions marked, noise not called one.

Only like is compared with like: two runs of different devices (type or name), timers, or timing options
(``l2_cold``, ``cuda_graph``) are refused (``ValueError``), unless ``allow_different`` is set, which turns the
refusal into a warning. A time difference counts as a regression (or an improvement) only when it passes the
threshold *and* lies outside the measured spread of both runs: B's p20 above A's p80 (or B's p80 below A's p20).
A difference past the threshold that the spreads overlap is reported as "within noise". A result whose p20-p80
spread is wider than :data:`NOISY_SPREAD` of its median is noisy: a difference outside the spreads of a noisy pair
is reported as "slower (noisy)" or "faster (noisy)", and not counted as a regression (on a busy machine one burst
of load moves all the samples of one run; rerun on a quiet machine to decide).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text

from . import results as R
from .options import COMPARE_THRESHOLD
from .report import fmt_time

#: a p20-p80 spread wider than this fraction of the median marks a timing as noisy
NOISY_SPREAD = 0.10
#: timing options that change what a time means; runs that differ in one are not compared
TIMING_OPTIONS = ("l2_cold", "cuda_graph")


@dataclass(frozen=True)
class Row:
    key: tuple[str, str, str, str, str]  # op, case, dtype, mode, provider
    a: R.Result | None
    b: R.Result | None
    ratio: float | None  # time B / time A (>1: B is slower)
    verdict: str  # "regression", "improvement", "same", "within noise", "slower (noisy)", "faster (noisy)", "new",
    # "gone", "status: ok -> WRONG", ...
    noisy: bool = False  # the p20-p80 spread of A or B is wider than NOISY_SPREAD of its median

    @property
    def is_regression(self) -> bool:
        return self.verdict == "regression" or self.verdict.startswith("status")


def spread(r: R.Result | None) -> float | None:
    """(p80 - p20) / median of a timed result; None when it was not timed or holds no quantiles."""
    if r is None or not r.median_ms or r.p20_ms is None or r.p80_ms is None:
        return None
    return (r.p80_ms - r.p20_ms) / r.median_ms


def mismatch(a: R.OpRun, b: R.OpRun) -> str | None:
    """Why the times of ``a`` and ``b`` are not comparable (device, timer, timing options), or None."""
    for key in ("device_type", "device"):
        if a.env.get(key) != b.env.get(key):
            return f"A ran on {key.replace('_', ' ')} {a.env.get(key)!r}, B on {b.env.get(key)!r}"
    if a.timer != b.timer:
        return f"A was timed with {a.timer!r}, B with {b.timer!r}"
    for key in TIMING_OPTIONS:
        if bool(a.options.get(key)) != bool(b.options.get(key)):
            return f"A ran with {key}={bool(a.options.get(key))}, B with {key}={bool(b.options.get(key))}"
    return None


def _timed_verdict(ra: R.Result, rb: R.Result, ratio: float, threshold: float) -> str:
    quantiles = None not in (ra.p20_ms, ra.p80_ms, rb.p20_ms, rb.p80_ms)
    if ratio > 1 + threshold:
        return "regression" if not quantiles or rb.p20_ms > ra.p80_ms else "within noise"
    if ratio < 1 - threshold:
        return "improvement" if not quantiles or rb.p80_ms < ra.p20_ms else "within noise"
    return "same"


def compare(a: R.OpRun, b: R.OpRun, threshold: float = COMPARE_THRESHOLD,
            allow_different: bool = False) -> list[Row]:
    """Match results by (op, case, dtype, mode, provider) and classify each pair (see the module docstring).

    Raises ``ValueError`` for a negative threshold, and for runs that are not comparable (:func:`mismatch`)
    unless ``allow_different``."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    why = mismatch(a, b)
    if why and not allow_different:
        raise ValueError(f"{why}: their times are not comparable (--any-device compares them anyway)")
    left = {r.key: r for r in a.results}
    right = {r.key: r for r in b.results}
    rows = []
    for key in [*left, *(k for k in right if k not in left)]:
        ra, rb = left.get(key), right.get(key)
        ratio = None
        noisy = any(s is not None and s > NOISY_SPREAD for s in (spread(ra), spread(rb)))
        if ra is None:
            verdict = "new"
        elif rb is None:
            verdict = "gone"
        elif ra.status == R.OK and rb.status != R.OK:
            verdict = f"status: {ra.status} -> {rb.status}"
        elif ra.timed_ok and rb.timed_ok:
            ratio = rb.median_ms / ra.median_ms
            verdict = _timed_verdict(ra, rb, ratio, threshold)
            if noisy and verdict in ("regression", "improvement"):
                verdict = "slower (noisy)" if verdict == "regression" else "faster (noisy)"
        else:
            verdict = "same" if ra.status == rb.status else f"was {ra.status}, now {rb.status}"
        rows.append(Row(key, ra, rb, ratio, verdict, noisy))
    return rows


def compare_files(path_a: Path, path_b: Path, threshold: float = COMPARE_THRESHOLD,
                  allow_different: bool = False) -> tuple[R.OpRun, R.OpRun, list[Row]]:
    a, b = R.load(path_a), R.load(path_b)
    return a, b, compare(a, b, threshold, allow_different)


def warnings(a: R.OpRun, b: R.OpRun, rows: list[Row]) -> list[str]:
    """Lines to print under the table: runs that are not alike, noisy timings."""
    out = []
    why = mismatch(a, b)
    if why:
        out.append(f"warning: {why}: the times are not comparable")
    noisy = sum(r.noisy for r in rows)
    if noisy:
        out.append(f"warning: {noisy} result(s) have a p20-p80 spread over {NOISY_SPREAD:.0%} of the median in A "
                   "or B (a busy or shared machine?): their differences are not counted as regressions; rerun on a "
                   "quiet machine")
    return out


def _time(r: R.Result | None) -> str:
    if r is None or r.median_ms is None:
        return "-"
    s = spread(r)
    return fmt_time(r.median_ms) + (f" ±{50 * s:.0f}%" if s is not None else "")


def compare_table(a: R.OpRun, b: R.OpRun, rows: list[Row], threshold: float, name_a: str = "A",
                  name_b: str = "B") -> Table:
    """The comparison as a table; times show ± half the p20-p80 spread, noisy rows are marked."""
    dev_a, dev_b = a.env.get("device", "?"), b.env.get("device", "?")
    caption = (f"A = {name_a} ({dev_a}), B = {name_b} ({dev_b}); a regression is slower by more than "
               f"{threshold:.0%}, outside both p20-p80 spreads, both spreads under {NOISY_SPREAD:.0%}; "
               "time ± half its p20-p80 spread")
    table = Table(title=f"compare {a.op} vs {b.op}", caption=caption, caption_justify="left")
    table.add_column("case", overflow="fold", min_width=8)
    table.add_column("provider", no_wrap=True)
    for col in ("time A", "time B", "B/A"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("verdict", overflow="fold", min_width=12)
    for row in rows:
        style = "bold red" if row.is_regression else ("green" if row.verdict == "improvement" else "")
        verdict = Text(row.verdict, style=style)
        if row.noisy and not row.verdict.endswith("(noisy)"):
            verdict.append(" (noisy)", style="yellow")
        table.add_row(" ".join(row.key[:4]), row.key[4], _time(row.a), _time(row.b),
                      f"{row.ratio:.3f}" if row.ratio is not None else "-", verdict)
    return table
