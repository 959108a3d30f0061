"""Criteo TSV -> npy shards: streaming, bounded memory, resumable, malformed rows reported with file and line.

Input rows (Kaggle ``train.txt``, 1TB ``day_N``, optionally ``.gz``): ``label \\t I1..I13 \\t C1..C26``, 40
tab-separated fields, empty = missing. Parsing is pyarrow's CSV reader (all fields as strings, one block of
``block_size`` bytes at a time), validation and conversion are vectorised:

* label must be ``0`` or ``1``;
* dense fields must be empty or integers (``-?[0-9]{1,18}``); missing -> 0; then clamp at 0, log(x + 1);
* categorical fields must be empty or 1-16 hex digits; parsed to int64 (16-digit values >= 2^63 wrap to
  negative int64, still distinct); missing -> 0.

A malformed row (wrong field count, bad label, non-integer dense, non-hex categorical, a line that is not valid
UTF-8) is counted by kind and reported with file and line (the first ``MAX_EXAMPLES``); ``on_error="skip"`` drops
it, ``"fail"`` stops with :class:`MalformedRowError`. Whole files: an empty input file is reported and skipped; a
truncated (or corrupt) gzip file keeps the rows before the break and is reported with its row count; a file that
cannot be read as text (binary: a NUL byte in its first 64 KiB; a ``.gz`` that is not gzip; an I/O error) is
reported and skipped (:class:`~.textin.UnreadableInput`). With ``on_error="fail"`` each of these stops the run
with exit status 2 in the CLI, after writing the dataset of the rows read before it (``"partial": true`` in its
metadata) and saying how to go on. Inputs without a single valid row raise ``ValueError`` with the first reasons.
The output folder is checked for writing before any input is read; a full disk stops the run with the space
left (:class:`~fuselab._io.NoSpaceError`), the shards written so far kept for a resume.

After the shards, a second pass over them counts ids per feature: ``cardinalities``
(distinct ids) and a vocabulary per feature (ids seen >= ``min_count`` times, sorted, ``vocab/C<k>.npy``) for
``hashing="vocab"``; memory is bounded by the number of distinct ids, never by the number of rows.

Resuming: ``progress.json`` records, per input file, the shards written; a rerun skips finished files and the
finished shards of a partial file (it re-parses that file from the start, since gzip cannot seek).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fuselab._io import NoSpaceError, PathError, atomic_write_json, read_json, writable_dir

from .shards import dense_transform, write_shard
from .textin import LineStream, UnreadableInput, os_errors_as_path_errors
from .tsv_output import MAX_EXAMPLES, PreprocessReport, finish

NUM_FIELDS = 40
_NAMES = ["label"] + [f"I{j}" for j in range(1, 14)] + [f"C{j}" for j in range(1, 27)]
_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate("0123456789abcdef"):
    _HEX[ord(_c)] = _i
    _HEX[ord(_c.upper())] = _i


class MalformedRowError(ValueError):
    """A malformed row with ``on_error="fail"``: message names the file, line and reason."""


def _hex_to_int64(col) -> np.ndarray:
    """Valid hex strings (or empty) -> int64 (empty -> 0), vectorised through a nibble lookup table."""
    import pyarrow.compute as pc

    n = len(col)
    padded = pc.utf8_lpad(col, width=16, padding="0").combine_chunks() if hasattr(col, "chunks") else \
        pc.utf8_lpad(col, width=16, padding="0")
    offsets = np.frombuffer(padded.buffers()[1], dtype=np.int32)[padded.offset: padded.offset + n + 1]
    chars = np.frombuffer(padded.buffers()[2], dtype=np.uint8)[offsets[0]: offsets[0] + 16 * n].reshape(n, 16)
    nibbles = _HEX[chars].astype(np.uint64)
    value = np.zeros(n, dtype=np.uint64)
    for k in range(16):
        value = (value << np.uint64(4)) | nibbles[:, k]
    return value.view(np.int64)


class _LineMap:
    """Maps the k-th row pyarrow returned (0-based, over the file) to its 1-based line number."""

    def __init__(self):
        self.skipped: list[int] = []  # line numbers of rows the field-count handler dropped, increasing

    def lines(self, rows: np.ndarray) -> np.ndarray:
        s = np.asarray(self.skipped, dtype=np.int64)
        t = s - np.arange(len(s))
        return rows + 1 + np.searchsorted(t, rows + 1, side="right")


class _Errors:
    def __init__(self, path: str, on_error: str, counts: dict[str, int], examples: list[str]):
        self.path, self.on_error, self.counts, self.examples = path, on_error, counts, examples
        self.fatal: list[tuple[int, str]] = []

    def add(self, kind: str, line: int | None, detail: str) -> None:
        """Count one malformed row (never raises: pyarrow's row handler must not; see :meth:`check`)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        message = f"{self.path}:{line if line is not None else '?'}: {kind}: {detail}"
        if self.on_error == "fail":
            self.fatal.append((line if line is not None else 0, message))
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(message)
            self.examples.sort(key=self._line_of)

    def _line_of(self, message: str) -> int:
        line = message[len(self.path) + 1:].split(":", 1)[0]
        return int(line) if line.isdigit() else 0

    def check(self) -> None:
        """With ``on_error="fail"``: raise for the earliest malformed row seen so far."""
        if self.fatal:
            message = min(self.fatal)[1]
            raise MalformedRowError(f"malformed row at {message} (use --on-error skip to skip such rows)")


def _convert(batch, row0: int, lines: _LineMap, errors: _Errors, invalid_lines: set[int]) -> tuple[np.ndarray, ...]:
    """One pyarrow record batch (40 string columns) -> valid (dense, sparse, labels).

    An all-empty row is an empty line, or a line that was not valid UTF-8 (its number in ``invalid_lines``)."""
    import pyarrow.compute as pc

    n = batch.num_rows
    cols = batch.columns
    bad = np.zeros(n, dtype=bool)
    reasons: list[tuple[np.ndarray, str, str]] = []
    empty = pc.equal(pc.binary_length(cols[0]), 0).to_numpy(zero_copy_only=False)
    for j in range(1, NUM_FIELDS):
        empty &= pc.equal(pc.binary_length(cols[j]), 0).to_numpy(zero_copy_only=False)
    reasons.append((empty, "wrong field count", "empty line"))
    label_ok = pc.is_in(cols[0], value_set=_label_values()).to_numpy(zero_copy_only=False)
    reasons.append((~label_ok, "bad label", "label must be 0 or 1"))
    for j in range(1, 14):
        ok = pc.match_substring_regex(cols[j], r"^(-?[0-9]{1,18})?$").to_numpy(zero_copy_only=False)
        reasons.append((~ok, "non-integer dense", f"field {_NAMES[j]} is not an integer"))
    for j in range(14, NUM_FIELDS):
        ok = pc.match_substring_regex(cols[j], r"^[0-9a-fA-F]{0,16}$").to_numpy(zero_copy_only=False)
        reasons.append((~ok, "non-hex categorical", f"field {_NAMES[j]} is not hexadecimal"))
    for mask, _, _ in reasons:
        bad |= mask
    if bad.any():
        rows = np.flatnonzero(bad)
        line_of = dict(zip(rows.tolist(), lines.lines(rows + row0).tolist()))
        for r in rows.tolist():
            kind, detail = next((k, d) for m, k, d in reasons if m[r])
            if empty[r] and line_of[r] in invalid_lines:
                kind, detail = "invalid UTF-8", "the line is not valid UTF-8 text"
            errors.add(kind, line_of[r], detail)
        keep = pc.invert(_pa().array(bad))
        cols = [pc.filter(c, keep) for c in cols]
    labels = np.asarray(pc.cast(cols[0], _pa().int8()).to_numpy(zero_copy_only=False), dtype=np.float32)
    m = len(labels)
    dense = np.empty((m, 13), dtype=np.float32)
    for j in range(13):
        col = pc.if_else(pc.equal(cols[1 + j], ""), "0", cols[1 + j])
        dense[:, j] = dense_transform(pc.cast(col, _pa().int64()).to_numpy(zero_copy_only=False))
    sparse = np.empty((m, 26), dtype=np.int64)
    for j in range(26):
        sparse[:, j] = _hex_to_int64(cols[14 + j]) if m else 0
    return dense, sparse, labels


def _pa():
    import pyarrow

    return pyarrow


def _label_values():
    return _pa().array(["0", "1"])


def _printable(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, control and non-ASCII characters escaped (never raw bytes)."""
    return ascii(text[:limit])


def _parse_file(path: Path, file_index: int, root: Path, shard_rows: int, block_size: int, errors: _Errors,
                done_shards: list[dict[str, Any]], on_shard, on_bytes) -> str | None:
    """Parse one TSV file into shards; skip the shards listed in ``done_shards`` (already written).

    Returns None, or a whole-file problem that was survived: ``"empty file"``, or the reason a gzip stream ended
    early (its rows before the break are written)."""
    import pyarrow.csv as pcsv

    lines = _LineMap()

    def on_invalid(row) -> str:
        if row.number is not None:
            lines.skipped.append(int(row.number))
        errors.add("wrong field count", row.number,
                   f"{row.actual_columns} fields, expected {NUM_FIELDS} ({_printable(row.text or '')}...)")
        return "skip"

    skip_rows = sum(s["rows"] for s in done_shards)
    shard_index = len(done_shards)
    read_options = pcsv.ReadOptions(column_names=_NAMES, block_size=block_size, use_threads=False)
    parse_options = pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False, ignore_empty_lines=False,
                                      invalid_row_handler=on_invalid)
    convert_options = pcsv.ConvertOptions(column_types=dict.fromkeys(_NAMES, _pa().string()),
                                          strings_can_be_null=False, quoted_strings_can_be_null=False)
    buffers: list[tuple[np.ndarray, ...]] = []
    buffered = row0 = 0
    stream = LineStream(path)
    if stream.empty:
        stream.close()
        return "empty file"
    try:
        reader = pcsv.open_csv(stream, read_options=read_options, parse_options=parse_options,
                               convert_options=convert_options)
        last_pos = 0
        for batch in reader:
            dense, sparse, labels = _convert(batch, row0, lines, errors, stream.invalid_lines)
            errors.check()
            row0 += batch.num_rows
            pos = stream.tell()
            on_bytes(pos - last_pos)
            last_pos = pos
            if skip_rows:  # rows already in finished shards (resume)
                drop = min(skip_rows, len(labels))
                dense, sparse, labels = dense[drop:], sparse[drop:], labels[drop:]
                skip_rows -= drop
            buffers.append((dense, sparse, labels))
            buffered += len(labels)
            while buffered >= shard_rows:
                buffered = _flush(buffers, shard_rows, root, file_index, path, shard_index, on_shard)
                shard_index += 1
        if buffered:
            _flush(buffers, buffered, root, file_index, path, shard_index, on_shard)
        errors.check()
    except _pa().ArrowInvalid as exc:
        errors.check()
        raise ValueError(f"{path}: cannot parse as Criteo TSV: {_printable(str(exc), 200)}") from None
    finally:
        stream.close()
    return stream.truncated


def _flush(buffers: list, rows: int, root: Path, file_index: int, path: Path, shard_index: int, on_shard) -> int:
    """Write the first ``rows`` buffered rows as one shard; keep the rest buffered. Returns rows still buffered."""
    dense, sparse, labels = (np.concatenate([b[k] for b in buffers]) for k in range(3))
    name = f"f{file_index:03d}-{shard_index:05d}"
    info = write_shard(root, name, dense[:rows], sparse[:rows], labels[:rows])
    info["positives"] = int(labels[:rows].sum())
    buffers.clear()
    if len(labels) > rows:
        buffers.append((dense[rows:], sparse[rows:], labels[rows:]))
    on_shard(info)
    return len(labels) - rows


def _describe(problem: str | None, rows: int) -> str | None:
    if problem is None:
        return None
    if problem == "empty file":
        return "empty file, skipped"
    return f"truncated or corrupt gzip stream ({problem}): kept the {rows:,} rows before the break"


@dataclass(frozen=True)
class _Run:
    """One preprocessing run: where it writes, what it reads, how."""

    root: Path
    paths: list[Path]
    shard_rows: int
    block_size: int
    on_error: str
    min_count: int

    @property
    def state_path(self) -> Path:
        return self.root / "progress.json"


def preprocess(inputs: list[str | Path], out: str | Path, shard_rows: int = 1 << 20, on_error: str = "skip",
               min_count: int = 1, resume: bool = True, progress: bool = False,
               block_size: int = 16 << 20) -> PreprocessReport:
    """Convert Criteo TSV files (in order) into a dataset directory ``out``; see the module docstring.

    Raises ``FileNotFoundError`` for a missing input, :class:`fuselab._io.PathError` (a ``ValueError``) for an
    output folder that cannot be written (before any input is read), :class:`~fuselab._io.NoSpaceError` when the
    disk fills (the shards written so far are kept; the same call again resumes), with ``on_error="fail"``
    :class:`MalformedRowError` or :class:`~.textin.UnreadableInput` (after writing a dataset of the rows read
    before), and ``ValueError`` when no input holds a valid row (with the first reasons)."""
    try:
        with os_errors_as_path_errors("preprocess: cannot read or write"):
            return _preprocess(inputs, out, shard_rows, on_error, min_count, resume, progress, block_size)
    except NoSpaceError as err:
        raise NoSpaceError(f"{err}; the shards written so far are kept: free some space, then run the same "
                           "command again to go on where it stopped", err.needed, err.free, err.folder) from None


def _inputs(inputs: list[str | Path]) -> list[Path]:
    paths = [Path(p) for p in inputs]
    for p in paths:
        if p.is_dir():
            raise PathError(f"input {p} is a folder, not a TSV file")
        if not p.is_file():
            raise FileNotFoundError(f"input file {p} does not exist")
    return paths


def _state(run: _Run, resume: bool) -> dict[str, Any]:
    """The progress of an earlier run of the same inputs (``resume``), else a fresh one."""
    state: dict[str, Any] = {"inputs": [str(p) for p in run.paths], "files": {}, "shard_rows": run.shard_rows}
    if resume and run.state_path.is_file():
        try:
            old = read_json(run.state_path, "progress file")
        except PathError:
            old = {}  # a corrupt progress file: start over
        if isinstance(old, dict) and old.get("inputs") == state["inputs"] and old.get("shard_rows") == run.shard_rows:
            state = old
    return state


def _preprocess(inputs: list[str | Path], out: str | Path, shard_rows: int, on_error: str, min_count: int,
                resume: bool, progress: bool, block_size: int) -> PreprocessReport:
    if on_error not in ("skip", "fail"):
        raise ValueError(f"on_error must be 'skip' or 'fail', got {on_error!r}")
    if shard_rows <= 0 or min_count < 1 or block_size < 4096:
        raise ValueError("shard_rows must be > 0, min_count >= 1, block_size >= 4096")
    paths = _inputs(inputs)
    root = writable_dir(out, "output folder")
    for sub in ("shards", "vocab"):
        writable_dir(root / sub, "output folder")
    run = _Run(root, paths, shard_rows, block_size, on_error, min_count)
    state = _state(run, resume)
    try:
        _parse_all(run, state, progress)
    except (MalformedRowError, UnreadableInput, _StoppedOnFile) as err:  # on_error="fail"
        err.args = (_with_partial_dataset(str(err), run, state),)
        raise
    return finish(root, paths, state, min_count)


class _StoppedOnFile(ValueError):
    """A whole-file problem (a truncated gzip stream) with ``on_error="fail"``."""


def _with_partial_dataset(message: str, run: _Run, state: dict[str, Any]) -> str:
    """``message`` of a fault that stopped the run, plus what it leaves: the dataset of the rows read before it
    (written here) and how to go on."""
    try:
        report = finish(run.root, run.paths, state, run.min_count, partial=True)
    except (ValueError, OSError):  # no row yet, or no space for the metadata: the message says what it can
        return (f"{message}; no dataset was written; to skip such rows and files, run the same command with "
                "--on-error skip (the files done are not read again)")
    return (f"{message}; the {report.rows:,} rows read before it are a usable dataset in {run.root}; to skip such "
            "rows and files and go on, run the same command with --on-error skip (the files done are not read "
            "again)")


def _parse_all(run: _Run, state: dict[str, Any], progress: bool) -> None:
    """Parse every input not yet complete into shards, recording each file's progress and problem in ``state``."""
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("preprocess", total=sum(p.stat().st_size for p in run.paths))
        for index, path in enumerate(run.paths):
            entry = state["files"].setdefault(str(path), {"shards": [], "complete": False})
            if entry["complete"]:
                bar.advance(task, path.stat().st_size)
                continue
            _parse_one(run, state, index, path, lambda n: bar.advance(task, n))


def _parse_one(run: _Run, state: dict[str, Any], index: int, path: Path, on_bytes) -> None:
    entry = state["files"][str(path)]
    entry["malformed"], entry["examples"], entry["problem"] = {}, [], None
    errors = _Errors(str(path), run.on_error, entry["malformed"], entry["examples"])

    def on_shard(info: dict[str, Any]) -> None:
        entry["shards"].append(info)
        atomic_write_json(run.state_path, state, "progress file", indent=1)

    try:
        problem = _parse_file(path, index, run.root, run.shard_rows, run.block_size, errors, list(entry["shards"]),
                              on_shard, on_bytes)
    except UnreadableInput as err:
        if run.on_error == "fail":
            raise
        entry["problem"] = f"{err.reason}, skipped"  # not complete: a rerun reads it again
        atomic_write_json(run.state_path, state, "progress file", indent=1)
        return
    entry["problem"] = _describe(problem, sum(s["rows"] for s in entry["shards"]))
    if problem not in (None, "empty file") and run.on_error == "fail":
        raise _StoppedOnFile(f"input file {path}: {entry['problem']}")
    entry["complete"] = True
    atomic_write_json(run.state_path, state, "progress file", indent=1)
