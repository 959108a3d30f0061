"""Markdown summary of committed results: fuselab against the best other provider, per case.

    python3 benchmarks/summarize.py benchmarks/results/h100 [OPS...]

For every case of each op JSON: fuselab's time and fraction of the run's copy bandwidth, the fastest other
correct provider (name, fraction), the speedups of fuselab over eager and torch.compile, and, where the run
measured it, the stream bound (a kernel that only moves the case's bytes, timed the same way: its fraction of
copy bandwidth, and fuselab's time as a fraction of it). This is the table the README shows; regenerate it after
a new GPU run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OURS = ("fuselab", "fuselab-inplace")


def _fmt_us(ms: float) -> str:
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.2f} ms"


def _speedup(ref: dict | None, ours: dict) -> str:
    return f"{ref['median_ms'] / ours['median_ms']:.2f}x" if ref else "-"


def summarize(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    rows: dict[tuple, dict[str, dict]] = {}
    bounds: dict[tuple, dict] = {}
    for r in data["results"]:
        key = (r["case"], r["dtype"], r["mode"])
        if r.get("median_ms") and r["status"] == "ok":
            rows.setdefault(key, {})[r["provider"]] = r
        elif r.get("median_ms") and r["status"] == "bound":
            bounds[key] = r
    lines = []
    for (case, dtype, mode), by in rows.items():
        ours = by.get("fuselab")
        if ours is None:
            continue
        others = {p: r for p, r in by.items() if p not in OURS and not p.startswith("fuselab")}
        best = min(others.values(), key=lambda r: r["median_ms"]) if others else None
        eager = by.get("eager") or by.get("torch")
        compiled = by.get("torch.compile")
        best_txt = f"{best['provider']} {best['copy_fraction']:.2f}" if best else "-"
        bound = bounds.get((case, dtype, mode))
        bound_txt = f"{bound['copy_fraction']:.2f} | {ours['of_stream']:.2f}" if bound and ours.get("of_stream") \
            else "- | -"
        lines.append(f"| {data['op']} | {case} {dtype} {mode} | {_fmt_us(ours['median_ms'])} | "
                     f"**{ours['copy_fraction']:.2f}** | {best_txt} | {_speedup(eager, ours)} | "
                     f"{_speedup(compiled, ours)} | {bound_txt} |")
    return lines


def main() -> None:
    folder = Path(sys.argv[1])
    ops = sys.argv[2:] or ["rope", "bias_act", "reduce", "mlp"]
    print("| op | case | fuselab time | fuselab / copy BW | best other (/ copy BW) | vs eager | vs compile "
          "| stream bound / copy BW | fuselab / stream |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op in ops:
        path = folder / f"{op}.json"
        if path.exists():
            print("\n".join(summarize(path)))


if __name__ == "__main__":
    main()
