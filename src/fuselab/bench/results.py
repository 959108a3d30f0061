"""Result records, the figures derived from them, and the files they are written to.

One :class:`Result` per case × provider. :func:`derive_figures` turns times into GB/s, fraction
of the measured copy bandwidth, TFLOP/s, samples/s (cases that declare their samples) and speedups;
:class:`OpRun` is one op's run (the environment, the ceilings and every result) and is what ``<out>/<op>.json`` /
``.csv`` hold.
Files are written through :mod:`fuselab._io`: atomically (temporary file in the same folder, then
``os.replace``), with the usual permissions, strict JSON (a non-finite number, such as the infinite error of a
provider that returned nothing, is written as ``null``).
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fuselab._io import PathError, atomic_write, atomic_write_json, read_json, writable_dir

from .ceilings import Ceilings

SCHEMA = 1

# statuses
OK = "ok"  # checked correct and timed
WRONG = "WRONG"  # error over tolerance: timed, never shown as a win
FAILED = "failed"  # raised (build, check or timing); ``detail`` holds the error
NOT_INSTALLED = "not installed"
SKIPPED = "skipped"
CORRECTNESS_ONLY = "interpreter: correctness only"  # Triton on a CPU machine: checked, not timed
BOUND = "bound"  # the stream bound (fuselab.bench.stream): timed, not an implementation; never a win or a baseline


def short_error(e: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters: a result's ``detail`` for an exception."""
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Result:
    op: str
    case: str  # the case label (shape)
    dtype: str
    mode: str
    provider: str
    numel: int
    bytes: int
    flops: int
    status: str = OK
    detail: str = ""  # error message, skip reason, missing module, notes
    rel_error: float | None = None
    tolerance: float | None = None
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    gbps: float | None = None
    copy_fraction: float | None = None  # gbps / measured copy bandwidth: the headline number
    of_stream: float | None = None  # the case's stream bound time / this time: 1.0 = as fast as moving the bytes
    tflops: float | None = None
    speedup_vs_baseline: float | None = None  # baseline time / this time (the op's baseline, usually eager)
    speedup_vs_compile: float | None = None  # torch.compile time / this time
    peak_mem_bytes: int | None = None  # above what was allocated before the call; a whole step's: all of it
    timer: str | None = None  # "cuda" or "cpu"
    l2_cold: bool = False
    samples: int | None = None  # what one call processes (a training step's batch), for samples/s
    samples_per_s: float | None = None
    group: str = ""  # the case's curve in the plots

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.op, self.case, self.dtype, self.mode, self.provider)

    @property
    def case_key(self) -> tuple[str, str, str, str]:
        return (self.op, self.case, self.dtype, self.mode)

    @property
    def timed_ok(self) -> bool:
        """Correct and timed: the only results that may count as a win or a baseline."""
        return self.status == OK and self.median_ms is not None and self.median_ms > 0


def derive_figures(results: list[Result], ceilings: Ceilings | None, baseline: str,
                   compile_name: str = "torch.compile") -> None:
    """Fill GB/s, copy fraction, TFLOP/s, speedups and the fraction of the stream bound in place.

    Speedups are only given to correct results, against correct baselines in the same case;
    a WRONG result keeps its time and GB/s but gets no speedup (it is never shown as a win).
    """
    by_case: dict[tuple, dict[str, Result]] = {}
    for r in results:
        by_case.setdefault(r.case_key, {})[r.provider] = r
        if r.median_ms is None or r.median_ms <= 0:
            continue
        seconds = r.median_ms * 1e-3
        r.gbps = r.bytes / seconds / 1e9
        r.tflops = r.flops / seconds / 1e12 if r.flops else None
        r.samples_per_s = r.samples / seconds if r.samples else None
        if ceilings is not None and ceilings.copy_gbps > 0:
            r.copy_fraction = r.gbps / ceilings.copy_gbps
    for group in by_case.values():
        base = group.get(baseline)
        comp = group.get(compile_name)
        bound = next((r for r in group.values() if r.status == BOUND and r.median_ms), None)
        for r in group.values():
            if not r.timed_ok:
                continue
            if bound is not None:
                r.of_stream = bound.median_ms / r.median_ms
            if base is not None and base.timed_ok:
                r.speedup_vs_baseline = base.median_ms / r.median_ms
            if comp is not None and comp.timed_ok:
                r.speedup_vs_compile = comp.median_ms / r.median_ms


def is_throughput(results: list[Result]) -> bool:
    """Whether ``results`` are measured in samples (whole training steps) rather than bytes."""
    return any(r.samples for r in results)


def best_providers(results: list[Result]) -> dict[tuple, str]:
    """Per case, the fastest provider among correct timed results (WRONG ones never win)."""
    best: dict[tuple, Result] = {}
    for r in results:
        if r.timed_ok and (r.case_key not in best or r.median_ms < best[r.case_key].median_ms):
            best[r.case_key] = r
    return {k: r.provider for k, r in best.items()}


@dataclass
class OpRun:
    """One op's run: what was asked, on what machine, the ceilings, every result."""

    op: str
    summary: str
    command: str
    env: dict[str, Any]
    ceilings: Ceilings | None
    timer: str  # "cuda events (triton.testing.do_bench)" / "host clock (CPU timings)"
    options: dict[str, Any] = field(default_factory=dict)
    results: list[Result] = field(default_factory=list)
    created: str = ""
    error: str | None = None  # the op itself failed (e.g. its suite does not import)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "op": self.op,
            "summary": self.summary,
            "command": self.command,
            "created": self.created,
            "env": self.env,
            "timer": self.timer,
            "options": self.options,
            "ceilings": self.ceilings.to_dict() if self.ceilings else None,
            "error": self.error,
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRun:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"unsupported result schema {d.get('schema')!r} (expected {SCHEMA})")
        names = Result.__dataclass_fields__
        results = [Result(**{k: v for k, v in r.items() if k in names}) for r in d.get("results", [])]
        ceilings = Ceilings.from_dict(d["ceilings"]) if d.get("ceilings") else None
        return cls(op=d["op"], summary=d.get("summary", ""), command=d.get("command", ""), env=d.get("env", {}),
                   ceilings=ceilings, timer=d.get("timer", ""), options=d.get("options", {}), results=results,
                   created=d.get("created", ""), error=d.get("error"))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (:func:`fuselab._io.atomic_write`): readers see the old file or the
    new one, never half of one; :class:`~fuselab._io.PathError` (a ``ValueError``) naming the file on failure."""
    atomic_write(path, lambda f: f.write(data), "result file")


def check_writable(out_dir: Path) -> Path:
    """Create ``out_dir`` if needed and prove a file can be written there, before a long run: otherwise
    :class:`~fuselab._io.PathError` (a ``ValueError``), one line naming the folder."""
    return writable_dir(out_dir, "output folder")


CSV_FIELDS = [*Result.__dataclass_fields__, "device", "copy_gbps"]


def to_csv(run: OpRun) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in run.results:
        row = asdict(r)
        row["device"] = run.env.get("device", "")
        row["copy_gbps"] = run.ceilings.copy_gbps if run.ceilings else ""
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def save(run: OpRun, out_dir: Path) -> list[Path]:
    """Write ``<out_dir>/<op>.json`` and ``<op>.csv`` atomically; returns the paths."""
    out_dir = check_writable(out_dir)
    json_path, csv_path = out_dir / f"{run.op}.json", out_dir / f"{run.op}.csv"
    atomic_write_json(json_path, run.to_dict(), "result file", indent=1)
    write_atomic(csv_path, to_csv(run).encode())
    return [json_path, csv_path]


def load(path: Path) -> OpRun:
    """Read a run written by :func:`save`; ``ValueError`` naming the file if it is not one."""
    try:
        data = read_json(path, "result file")
    except PathError as e:
        raise ValueError(f"{e}: not a fuselab bench result") from None
    try:
        return OpRun.from_dict(data)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a fuselab bench result ({e})") from None
