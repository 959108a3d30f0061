"""What ``preprocess`` (:mod:`.tsv`) writes once the shards are on disk, and what it reports.

:func:`finish` counts the ids of every shard (cardinalities, the vocabularies of ``hashing="vocab"``) and writes
``metadata.json``, which makes the folder a dataset. It runs at the end of a run and also when a run stops on a
fault with ``on_error="fail"`` (``partial: true`` in the metadata then): the rows read before the fault are always
a usable dataset. :class:`PreprocessReport` is the summary the CLI prints; :func:`no_rows_message` says why no
dataset could be made, with the first reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fuselab._io import atomic_write, atomic_write_json

from .shards import FORMAT, METADATA

#: malformed rows reported with file, line and reason
MAX_EXAMPLES = 20
#: reasons shown when no input holds a valid row
FIRST_REASONS = 5


@dataclass
class PreprocessReport:
    out: str
    rows: int = 0
    files: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    cardinalities: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # whole-file problems: "<file>: empty file, skipped", ...

    def summary(self) -> str:
        bad = sum(self.malformed.values())
        lines = [f"preprocessed {self.files} file(s): {self.rows:,} rows -> {self.out}; "
                 f"{bad:,} malformed row(s) skipped" + (f" {self.malformed}" if bad else "")]
        lines += [f"  {p}" for p in self.problems]
        lines += [f"  {e}" for e in self.examples]
        if bad > len(self.examples):
            lines.append(f"  ... ({bad - len(self.examples)} more)")
        return "\n".join(lines)


def count_ids(root: Path, shards: list[dict[str, Any]], min_count: int) -> tuple[list[int], list[int]]:
    """Second pass: distinct ids per feature and the vocabulary (ids with count >= min_count)."""
    ids: list[np.ndarray] = [np.empty(0, np.int64)] * 26
    counts: list[np.ndarray] = [np.empty(0, np.int64)] * 26
    for shard in shards:
        sparse = np.load(root / "shards" / f"{shard['name']}.sparse.npy", mmap_mode="r")
        for t in range(sparse.shape[1]):
            u, c = np.unique(np.asarray(sparse[:, t]), return_counts=True)
            merged, inverse = np.unique(np.concatenate([ids[t], u]), return_inverse=True)
            counts[t] = np.bincount(inverse, weights=np.concatenate([counts[t], c]), minlength=len(merged)
                                    ).astype(np.int64)
            ids[t] = merged
    (root / "vocab").mkdir(exist_ok=True)
    vocab_sizes = []
    for t in range(26):
        vocab = ids[t][counts[t] >= min_count]
        atomic_write(root / "vocab" / f"C{t + 1}.npy", lambda f, v=vocab: np.save(f, v), "vocabulary file")
        vocab_sizes.append(len(vocab))
    return [len(x) for x in ids], vocab_sizes


def _malformed(paths: list[Path], state: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Malformed rows by kind over every file of ``state``, and their first examples."""
    counts: dict[str, int] = {}
    examples: list[str] = []
    for p in paths:
        entry = state["files"].get(str(p), {})
        for kind, n in entry.get("malformed", {}).items():
            counts[kind] = counts.get(kind, 0) + n
        examples += entry.get("examples", [])
    return counts, examples[:MAX_EXAMPLES]


def problems(paths: list[Path], state: dict[str, Any]) -> list[str]:
    """The whole-file problems of ``state``: ``"<file>: <what happened>"``."""
    return [f"{p}: {state['files'][str(p)]['problem']}" for p in paths
            if state["files"].get(str(p), {}).get("problem")]


def no_rows_message(paths: list[Path], state: dict[str, Any]) -> str:
    """Why no dataset was made: the malformed rows by kind and the first reasons, the whole-file problems."""
    counts, examples = _malformed(paths, state)
    bad = sum(counts.values())
    text = "no valid rows in the input" + "".join(f"; {p}" for p in problems(paths, state))
    if bad:
        text += f"; {bad:,} malformed row(s) {counts}, the first:" + "".join(
            f"\n  {e}" for e in examples[:FIRST_REASONS])
    return text


def finish(root: Path, paths: list[Path], state: dict[str, Any], min_count: int, partial: bool = False
           ) -> PreprocessReport:
    """Count the ids of the shards in ``state`` and write ``metadata.json`` (``partial``: the run stopped before
    its end); raises ``ValueError`` (:func:`no_rows_message`) when there is no shard."""
    shards = [s for p in paths for s in state["files"].get(str(p), {}).get("shards", [])]
    report = PreprocessReport(out=str(root), problems=problems(paths, state))
    if not shards:
        raise ValueError(no_rows_message(paths, state))
    cardinalities, vocab_sizes = count_ids(root, shards, min_count)
    malformed, report.examples = _malformed(paths, state)
    rows = sum(s["rows"] for s in shards)
    per_file = {str(p): sum(s["rows"] for s in state["files"].get(str(p), {}).get("shards", [])) for p in paths}
    meta = {
        "format": FORMAT, "source": "tsv", "inputs": [str(p) for p in paths], "num_rows": rows, "num_dense": 13,
        "num_sparse": 26, "cardinalities": cardinalities, "vocab_sizes": vocab_sizes, "min_count": min_count,
        "positive_rate": sum(s["positives"] for s in shards) / rows,
        "counts": {"rows_per_file": per_file, "malformed": malformed, "file_problems": report.problems},
        "dense_transform": "log(max(x, 0) + 1)",
        "shards": [{"name": s["name"], "rows": s["rows"]} for s in shards],
    }
    if partial:
        meta["partial"] = True
    atomic_write_json(root / METADATA, meta, "metadata file", indent=1)
    report.rows, report.files, report.malformed, report.cardinalities = rows, len(paths), malformed, cardinalities
    return report
