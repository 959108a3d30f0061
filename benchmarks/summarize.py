"""Markdown tables of the committed lab results (the ``<op>.json`` files ``fuselab bench`` writes).

    python3 benchmarks/summarize.py benchmarks/results/h100            # every case of every op, to stdout
    python3 benchmarks/summarize.py benchmarks/results/h100 --write    # the same into <folder>/SUMMARY.md
    python3 benchmarks/summarize.py --readme                           # the README's table (H100 and H200)

Per case (``summarize FOLDER``): fuselab's median time and fraction of the run's copy bandwidth, the fastest other
correct provider, fuselab's speedups over eager and torch.compile, and where the run measured it the stream bound
(a kernel that only moves the case's bytes, timed the same way) and fuselab's time as a fraction of it. The
``cuda_graph/`` subfolder (``fuselab bench --cuda-graph``) gets a section of its own, and the DLRM suite's
``dlrm.json`` (``fuselab bench dlrm``) one more: samples/s, step time, TFLOP/s, peak memory and the speedup over the
stock PyTorch step of every provider and case.

``--readme``: one row per op, case group, dtype and mode, with the range over the group's cases of fuselab / copy
bandwidth, fuselab / stream bound and torch.compile's time over fuselab's, per GPU (plain runs and CUDA-graph runs).
Cases that time the host or the matmuls (RoPE decode, the MLP step) show fuselab's time instead of a fraction.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

OPS = ("rope", "bias_act", "reduce", "mlp", "square", "gelu_tanh")
README_OPS = ("rope", "bias_act", "reduce", "mlp")
README_GPUS = ("h100", "h200")
HEADER = ("| op | case | fuselab time | fuselab / copy BW | best other (/ copy BW) | vs eager | vs compile "
          "| stream bound / copy BW | fuselab / stream |\n|---|---|---|---|---|---|---|---|---|")


def fmt_time(ms: float) -> str:
    return f"{ms * 1e3:.1f} µs" if ms < 1 else f"{ms:.2f} ms"


def _speedup(ref: dict | None, ours: dict) -> str:
    return f"{ref['median_ms'] / ours['median_ms']:.2f}x" if ref else "-"


def load_run(path: Path) -> dict | None:
    """The run stored in ``path``, or None for JSON files that are not a ``fuselab bench`` op run (DLRM files)."""
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) and "op" in data and "results" in data else None


def cases(data: dict) -> dict[tuple[str, str, str], dict]:
    """``(case, dtype, mode) -> {"providers": {name: result}, "bound": result or None}`` of the ok results."""
    out: dict[tuple[str, str, str], dict] = {}
    for r in data["results"]:
        if not r.get("median_ms"):
            continue
        entry = out.setdefault((r["case"], r["dtype"], r["mode"]), {"providers": {}, "bound": None})
        if r["status"] == "ok":
            entry["providers"][r["provider"]] = r
        elif r["status"] == "bound":
            entry["bound"] = r
    return out


def summarize(data: dict) -> list[str]:
    """The table rows of one op run, one per case where fuselab has an ok result."""
    lines = []
    for (case, dtype, mode), entry in cases(data).items():
        by, bound = entry["providers"], entry["bound"]
        ours = by.get("fuselab")
        if ours is None:
            continue
        others = [r for p, r in by.items() if not p.startswith("fuselab")]
        best = min(others, key=lambda r: r["median_ms"]) if others else None
        best_txt = f"{best['provider']} {best['copy_fraction']:.2f}" if best else "-"
        bound_txt = f"{bound['copy_fraction']:.2f} | {ours['of_stream']:.2f}" if bound and ours.get("of_stream") \
            else "- | -"
        eager = by.get("eager") or by.get("torch")
        lines.append(f"| {data['op']} | {case} {dtype} {mode} | {fmt_time(ours['median_ms'])} | "
                     f"**{ours['copy_fraction']:.2f}** | {best_txt} | {_speedup(eager, ours)} | "
                     f"{_speedup(by.get('torch.compile'), ours)} | {bound_txt} |")
    return lines


DLRM_HEADER = ("| case | provider | samples/s | step time | TFLOP/s | peak memory | vs stock | status |\n"
               "|---|---|---|---|---|---|---|---|")


def dlrm_rows(data: dict) -> list[str]:
    """One row per case and provider of a ``fuselab bench dlrm`` run (the fastest correct provider in bold)."""
    best: dict[str, float] = {}
    for r in data["results"]:
        if r["status"] == "ok" and r.get("samples_per_s"):
            best[r["case"]] = max(best.get(r["case"], 0.0), r["samples_per_s"])
    rows = []
    for r in data["results"]:
        rate = r.get("samples_per_s")
        cells = ["-"] * 5
        if rate:
            cells[0] = f"{rate / 1e6:.3g}M"
            if r["status"] == "ok" and rate == best.get(r["case"]):
                cells[0] = f"**{cells[0]}**"
            cells[1] = fmt_time(r["median_ms"])
            cells[2] = f"{r['tflops']:.1f}" if r.get("tflops") else "-"
        if r.get("peak_mem_bytes"):
            cells[3] = f"{r['peak_mem_bytes'] / 2**30:.1f} GiB"
        if r.get("speedup_vs_baseline"):
            cells[4] = f"{r['speedup_vs_baseline']:.2f}x"
        status = r["status"] if r["status"] == "ok" or not r.get("detail") else f"{r['status']}: {r['detail']}"
        rows.append(f"| {r['case']} {r['dtype']} | {r['provider']} | {' | '.join(cells)} | {status[:120]} |")
    return rows


def _runs(folder: Path, ops: Iterable[str]) -> list[tuple[Path, dict]]:
    found = []
    for op in ops:
        path = folder / f"{op}.json"
        data = load_run(path) if path.exists() else None
        if data is not None:
            found.append((path, data))
    return found


def _sources(runs: list[tuple[Path, dict]], root: Path) -> list[str]:
    return [f"- `{path.relative_to(root)}`: `{data['options'].get('command') or data.get('command')}`, "
            f"{data['created'][:10]}, commit {data['env'].get('git_commit', '?')[:7]}" for path, data in runs]


def summary_markdown(folder: Path, ops: Iterable[str] = OPS) -> str:
    """The whole ``SUMMARY.md`` of one GPU's folder: the plain runs, then the CUDA-graph runs."""
    ops = tuple(ops)
    runs = _runs(folder, ops)
    if not runs:
        raise SystemExit(f"no op results (<op>.json) in {folder}")
    env, ceilings = runs[0][1]["env"], runs[0][1]["ceilings"]
    out = [f"# Lab results: {env['device']}",
           "",
           "Generated by `python3 benchmarks/summarize.py " + str(folder) + " --write` from the JSON files listed "
           "below; do not edit by hand.",
           f"torch {env['torch']}, Triton {env['triton']}; copy bandwidth {ceilings['copy_gbps'] / 1e3:.2f} TB/s "
           "(1 GiB D2D copy, read + write counted, measured in each run).",
           "",
           HEADER]
    for _, data in runs:
        out += summarize(data)
    out += ["", "Files:", *_sources(runs, folder)]
    graph = _runs(folder / "cuda_graph", ops)
    if graph:
        out += ["", "## Each step captured in a CUDA graph (`fuselab bench --cuda-graph`: device time, no host)", "",
                HEADER]
        for _, data in graph:
            out += summarize(data)
        out += ["", "Files:", *_sources(graph, folder)]
    step = folder / "dlrm.json"
    data = load_run(step) if step.exists() else None
    if data is not None:
        out += ["", "## DLRM training step (`fuselab bench dlrm`)", "", DLRM_HEADER, *dlrm_rows(data), "", "Files:",
                *_sources([(step, data)], folder)]
    return "\n".join(out) + "\n"


# --- the README's table ---------------------------------------------------------------------------------------

def _group(op: str, case: str) -> tuple[str, bool]:
    """The README row a case belongs to, and whether the row shows times (host- or matmul-bound) not fractions."""
    if op == "rope":
        return ("decode B=64", True) if case.startswith("decode") else ("bshd and thd", False)
    if op == "reduce":
        return (f"mean {case.split('/')[0]}", False)
    if op == "mlp":
        return ("training step 13-512-256-64-16, B=65536", True)
    return ("3 sizes x relu, gelu_tanh", False)


def _span(values: list[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def _frac(x: float) -> str:
    return f"{x:.2f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def readme_rows(root: Path, gpus: Iterable[str] = README_GPUS) -> list[str]:
    """Rows of the README table: per (op, group, dtype, mode, plain or CUDA graph), per GPU, the spans of
    fuselab / copy BW (or fuselab's time), fuselab / stream bound, and torch.compile's time over fuselab's."""
    gpus = tuple(gpus)
    groups: dict[tuple, dict[str, dict[str, list[float]]]] = {}
    for gpu in gpus:
        for sub, label in (("", ""), ("cuda_graph", ", CUDA graph")):
            for _, data in _runs(root / gpu / sub, README_OPS):
                for (case, dtype, mode), entry in cases(data).items():
                    ours = entry["providers"].get("fuselab")
                    if ours is None:
                        continue
                    name, timed = _group(data["op"], case)
                    if sub and mode == "fwd":
                        continue  # the plain runs' forward rows are the device's figures already
                    key = (README_OPS.index(data["op"]), data["op"], name, dtype, mode + label, timed)
                    cell = groups.setdefault(key, {}).setdefault(gpu, {"main": [], "stream": [], "compile": []})
                    cell["main"].append(ours["median_ms"] if timed else ours["copy_fraction"])
                    if ours.get("of_stream"):
                        cell["stream"].append(ours["of_stream"])
                    compiled = entry["providers"].get("torch.compile")
                    if compiled:
                        cell["compile"].append(compiled["median_ms"] / ours["median_ms"])
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], k[4].endswith("graph"), k[3], k[4], k[2])):
        _, op, name, dtype, mode, timed = key
        cells = []
        for gpu in gpus:
            c = groups[key].get(gpu)
            if c is None:
                cells += ["-", "-", "-"]
                continue
            main = _span(c["main"], fmt_time if timed else _frac)
            cells += [main, _span(c["stream"], _frac) if c["stream"] else "-",
                      _span(c["compile"], _ratio) + "x" if c["compile"] else "-"]
        n = max(len(c["main"]) for c in groups[key].values())
        rows.append(f"| {op} | {name}{f' ({n} cases)' if n > 1 else ''} | {dtype} {mode} | " + " | ".join(cells) + " |")
    return rows


def readme_table(root: Path, gpus: Iterable[str] = README_GPUS) -> str:
    gpus = tuple(gpus)
    head = "| op | cases | dtype, mode | " + " | ".join(
        f"{g.upper()} fuselab / copy BW | {g.upper()} / stream bound | {g.upper()} vs compile" for g in gpus) + " |"
    sep = "|---|---|---|" + "---|---|---|" * len(gpus)
    return "\n".join([head, sep, *readme_rows(root, gpus)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", nargs="?", type=Path, help="benchmarks/results/<gpu> (with --readme: the results root)")
    p.add_argument("ops", nargs="*", default=list(OPS), help=f"ops to include (default: {' '.join(OPS)})")
    p.add_argument("--write", action="store_true", help="write <folder>/SUMMARY.md instead of printing it")
    p.add_argument("--readme", action="store_true", help="print the README's table from <root>/{h100,h200}/")
    args = p.parse_args(argv)
    if args.readme:
        print(readme_table(args.folder or Path(__file__).resolve().parent / "results"), end="")
        return
    if args.folder is None:
        p.error("a results folder is needed (or --readme)")
    text = summary_markdown(args.folder, args.ops)
    if args.write:
        (args.folder / "SUMMARY.md").write_text(text)
        print(f"wrote {args.folder / 'SUMMARY.md'}")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
