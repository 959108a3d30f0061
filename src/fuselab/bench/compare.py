"""``fuselab bench compare A.json B.json``: two runs side by side, regressions marked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text

from . import results as R
from .options import COMPARE_THRESHOLD
from .report import fmt_time


@dataclass(frozen=True)
class Row:
    key: tuple[str, str, str, str, str]  # op, case, dtype, mode, provider
    a: R.Result | None
    b: R.Result | None
    ratio: float | None  # time B / time A (>1: B is slower)
    verdict: str  # "regression", "improvement", "same", "new", "gone", "status: ok -> WRONG", ...

    @property
    def is_regression(self) -> bool:
        return self.verdict == "regression" or self.verdict.startswith("status")


def compare(a: R.OpRun, b: R.OpRun, threshold: float = COMPARE_THRESHOLD) -> list[Row]:
    """Match results by (op, case, dtype, mode, provider) and classify each pair.

    Slower by more than ``threshold`` (0.05 = 5%) is a regression, faster by more is an
    improvement; a result that was ok and is no longer ok is a status regression."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    left = {r.key: r for r in a.results}
    right = {r.key: r for r in b.results}
    rows = []
    for key in [*left, *(k for k in right if k not in left)]:
        ra, rb = left.get(key), right.get(key)
        ratio = None
        if ra is None:
            verdict = "new"
        elif rb is None:
            verdict = "gone"
        elif ra.status == R.OK and rb.status != R.OK:
            verdict = f"status: {ra.status} -> {rb.status}"
        elif ra.timed_ok and rb.timed_ok:
            ratio = rb.median_ms / ra.median_ms
            verdict = "regression" if ratio > 1 + threshold else ("improvement" if ratio < 1 - threshold else "same")
        else:
            verdict = "same" if ra.status == rb.status else f"was {ra.status}, now {rb.status}"
        rows.append(Row(key, ra, rb, ratio, verdict))
    return rows


def compare_files(path_a: Path, path_b: Path,
                  threshold: float = COMPARE_THRESHOLD) -> tuple[R.OpRun, R.OpRun, list[Row]]:
    a, b = R.load(path_a), R.load(path_b)
    return a, b, compare(a, b, threshold)


def compare_table(a: R.OpRun, b: R.OpRun, rows: list[Row], threshold: float, name_a: str = "A",
                  name_b: str = "B") -> Table:
    dev_a, dev_b = a.env.get("device", "?"), b.env.get("device", "?")
    caption = f"A = {name_a} ({dev_a}), B = {name_b} ({dev_b}); threshold {threshold:.0%}"
    if dev_a != dev_b:
        caption += "; WARNING: different devices"
    table = Table(title=f"compare {a.op} vs {b.op}", caption=caption, caption_justify="left")
    for col in ("op", "case", "dtype", "mode", "provider", "time A", "time B", "B/A", "verdict"):
        table.add_column(col, justify="right" if col.startswith(("time", "B/")) else "left")
    for row in rows:
        style = "bold red" if row.is_regression else ("green" if row.verdict == "improvement" else "")
        table.add_row(*row.key, fmt_time(row.a.median_ms if row.a else None),
                      fmt_time(row.b.median_ms if row.b else None),
                      f"{row.ratio:.3f}" if row.ratio is not None else "-", Text(row.verdict, style=style))
    return table
