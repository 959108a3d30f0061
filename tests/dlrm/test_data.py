"""Criteo TSV preprocessing (every kind of malformed row), gz, resume, parquet, synthetic data, the loader."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fuselab.dlrm.data import tsv
from fuselab.dlrm.data.loader import BatchLoader, loader_throughput, open_dataset
from fuselab.dlrm.data.synth import SynthSpec, write_synthetic

HEX = ["0a1b2c3d", "ffffffff", "00000001", "8000000f"]


def _row(label="1", dense=None, cats=None) -> str:
    dense = dense if dense is not None else [str(j) for j in range(13)]
    cats = cats if cats is not None else [HEX[j % 4] for j in range(26)]
    return "\t".join([label, *dense, *cats])


BAD_ROWS = {  # line -> kind
    2: ("wrong field count", _row()[: _row().rindex("\t")]),  # 39 fields
    4: ("wrong field count", ""),  # empty line
    5: ("non-integer dense", _row(dense=["1"] * 12 + ["1.5"])),
    6: ("non-integer dense", _row(dense=["x"] + ["1"] * 12)),
    7: ("non-hex categorical", _row(cats=["0a1b2c3d"] * 25 + ["zz"])),
    8: ("bad label", _row(label="2")),
    10: ("wrong field count", _row() + "\textra"),
    11: ("non-hex categorical", _row(cats=["123456789abcdef01"] + ["1"] * 25)),  # 17 digits
}


def _write_bad_tsv(path):
    good = {1: _row(), 3: _row("0", [""] * 13, [""] * 26), 9: _row("0", ["-5"] + ["7"] * 12),
            12: _row("1", ["100"] * 13, ["ffffffffffffffff"] * 26)}
    lines = [good[i] if i in good else BAD_ROWS[i][1] for i in range(1, 13)]
    path.write_text("\n".join(lines) + "\n")
    return good


def test_preprocess_reports_every_malformed_row(tmp_path):
    src = tmp_path / "day_0"
    _write_bad_tsv(src)
    report = tsv.preprocess([src], tmp_path / "out", shard_rows=3)
    assert report.rows == 4
    kinds = {}
    for kind, _ in BAD_ROWS.values():
        kinds[kind] = kinds.get(kind, 0) + 1
    assert report.malformed == kinds
    for line, (kind, _) in BAD_ROWS.items():
        assert any(e.startswith(f"{src}:{line}: {kind}") for e in report.examples), (line, report.examples)
    assert "8 malformed" in report.summary()
    ds = open_dataset(tmp_path / "out")
    b = ds.read(0, len(ds))
    assert b.labels.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert b.sparse.dtype == torch.int64
    assert b.sparse[0, :4].tolist() == [0x0A1B2C3D, 0xFFFFFFFF, 1, 0x8000000F]  # > 2^31: no int32 overflow
    assert b.sparse[1].tolist() == [0] * 26  # missing -> 0
    assert b.sparse[3, 0].item() == -1  # 2^64 - 1 wraps in int64
    expected_dense = np.log1p(np.maximum(np.array([-5] + [7] * 12, dtype=np.float64), 0))
    np.testing.assert_allclose(b.dense[2].numpy(), expected_dense, rtol=1e-6)
    assert b.dense[1].abs().sum() == 0
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["num_rows"] == 4 and [s["rows"] for s in meta["shards"]] == [3, 1]
    assert meta["counts"]["malformed"] == kinds
    assert meta["cardinalities"][0] == 3  # C1 holds 0a1b2c3d (twice), 0 (missing), -1


def test_preprocess_fail_mode_names_the_first_bad_line(tmp_path):
    src = tmp_path / "day_0"
    _write_bad_tsv(src)
    with pytest.raises(tsv.MalformedRowError, match=rf"{src}:2: wrong field count"):
        tsv.preprocess([src], tmp_path / "out", on_error="fail")


def test_preprocess_gz_vocab_and_resume(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(50):
        cats = [f"{rng.integers(0, 4):08x}"] + [f"{i % 7:08x}"] * 25
        lines.append(_row(str(i % 2), [str(int(x)) for x in rng.integers(-2, 50, 13)], cats))
    a, b = tmp_path / "day_0.gz", tmp_path / "day_1"
    with gzip.open(a, "wt") as f:
        f.write("\n".join(lines[:30]) + "\n")
    b.write_text("\n".join(lines[30:]) + "\n")
    full = tsv.preprocess([a, b], tmp_path / "full", shard_rows=8, min_count=8, block_size=4096)
    assert full.rows == 50
    # interrupted run: die after the second shard, then resume
    real_flush, calls = tsv._flush, {"n": 0}

    def dying_flush(*args, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_flush(*args, **kw)

    monkeypatch.setattr(tsv, "_flush", dying_flush)
    with pytest.raises(KeyboardInterrupt):
        tsv.preprocess([a, b], tmp_path / "resumed", shard_rows=8, min_count=8, block_size=4096)
    monkeypatch.setattr(tsv, "_flush", real_flush)
    state = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert len(state["files"][str(a)]["shards"]) == 2
    resumed = tsv.preprocess([a, b], tmp_path / "resumed", shard_rows=8, min_count=8, block_size=4096)
    assert resumed.rows == 50
    x, y = open_dataset(tmp_path / "full"), open_dataset(tmp_path / "resumed")
    for col in ("dense", "sparse", "labels"):
        assert np.array_equal(x.read_column(col, 0, 50), y.read_column(col, 0, 50)), col
    assert x.meta["cardinalities"][1:] == [7] * 25
    assert x.meta["vocab_sizes"][1:] == [1] * 25  # i % 7 over 50 rows: only id 0 is seen >= 8 times
    assert np.load(tmp_path / "full" / "vocab" / "C2.npy").tolist() == [0]


def test_preprocess_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        tsv.preprocess([tmp_path / "missing"], tmp_path / "o")
    empty = tmp_path / "empty"
    empty.write_text("garbage\n")
    with pytest.raises(ValueError, match="no valid rows"):
        tsv.preprocess([empty], tmp_path / "o")


def test_parquet_reference_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n = 40
    cols = {"labels": rng.integers(0, 2, n).astype(np.int64)}
    raw = rng.integers(-1, 100, (n, 13))
    for j in range(13):
        cols[f"DENSE_{j}"] = raw[:, j]
    sparse = rng.integers(0, 9, (n, 26))
    for j in [*range(2, 26), 0, 1]:  # column order must not matter
        cols[f"SPARSE_{j}"] = sparse[:, j]
    table = pa.table(cols)
    pq.write_table(table.slice(0, 25), tmp_path / "part-0.parquet")
    pq.write_table(table.slice(25), tmp_path / "part-1.parquet")
    (tmp_path / "metadata.json").write_text(json.dumps({"cardinalities": [9] * 26}))
    ds = open_dataset(tmp_path)
    assert len(ds) == n and ds.cardinalities == [9] * 26
    b = ds.read(20, 30)  # crosses the file boundary
    assert torch.equal(b.sparse, torch.from_numpy(sparse[20:30]))
    np.testing.assert_allclose(b.dense.numpy(), np.log1p(np.maximum(raw[20:30], 0)), rtol=1e-6)
    assert b.labels.tolist() == cols["labels"][20:30].astype(float).tolist()


def test_synth_workers_end_whatever_sigterm_handler_the_caller_has(tmp_path):
    """The pool stops its workers with SIGTERM: a handler that does not exit, inherited through fork (torch's
    elastic agent leaves one), must not keep them alive (the pool would wait for them forever). In a process of its
    own, so that a hang fails the test instead of the session."""
    code = ("import signal, sys\n"
            "from fuselab.dlrm.data.synth import SynthSpec, write_synthetic\n"
            "signal.signal(signal.SIGTERM, lambda signum, frame: None)\n"
            "spec = SynthSpec(rows=3000, scale=1e-4, seed=2)\n"
            "meta = write_synthetic(sys.argv[1], spec, shard_rows=1000, workers=2)\n"
            "print(meta['num_rows'], len(meta['shards']))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["3000", "3"] and proc.stderr == ""


def test_synthetic_data_properties(tmp_path, synth_dir):
    ds = open_dataset(synth_dir)
    meta = ds.meta
    assert len(ds) == 120_000 and abs(meta["positive_rate"] - 0.256) < 0.01
    assert 0.7 < meta["best_auc"] < 0.95
    sparse = ds.read_column("sparse", 0, len(ds))
    assert (sparse >= 0).all() and (sparse < np.array(meta["cardinalities"])).all()
    counts = np.bincount(sparse[:, 2])  # power law: the most popular id is far above average
    assert counts.max() > 20 * counts.mean()
    # seeded and independent of the number of workers
    again = write_synthetic(tmp_path / "again", SynthSpec(rows=120_000, scale=2e-4, seed=1), shard_rows=50_000,
                            workers=2)
    assert again["best_auc"] == meta["best_auc"]
    assert np.array_equal(open_dataset(tmp_path / "again").read_column("sparse", 0, 1000), sparse[:1000])
    text = write_synthetic(tmp_path / "tsv", SynthSpec(rows=500, scale=1e-4), fmt="tsv", workers=1)
    first = (tmp_path / "tsv" / "part-00000.tsv").read_text().splitlines()[0].split("\t")
    assert len(first) == 40 and all(len(c) == 8 for c in first[14:])
    assert text["num_rows"] == 500
    with pytest.raises(ValueError, match="scale"):
        SynthSpec(scale=2.0).validate()


@pytest.mark.parametrize("shuffle", ["none", "batch", "row"])
def test_loader_covers_the_range_once(synth_dir, shuffle):
    ds = open_dataset(synth_dir)
    loader = BatchLoader(ds, 1000, 61_000, 7000, shuffle=shuffle, seed=3, prefetch=2)
    batches = list(loader.epoch(1))
    assert len(batches) == len(loader) == 9
    assert sorted(len(b) for b in batches) == [60_000 - 8 * 7000] + [7000] * 8
    labels = torch.cat([b.labels for b in batches])
    assert labels.sum().item() == ds.read_column("labels", 1000, 61_000).sum()
    if shuffle != "row":  # contiguous batches: check one exactly
        order, _ = loader._plan(1)
        first = ds.read(1000 + order[0] * 7000, 1000 + order[0] * 7000 + 7000)
        assert torch.equal(batches[0].sparse, first.sparse) and torch.equal(batches[0].dense, first.dense)
    # resuming at batch 4 yields the same batches 4..
    again = list(loader.epoch(1, start_batch=4))
    assert all(torch.equal(a.sparse, b.sparse) for a, b in zip(again, batches[4:]))
    dropped = BatchLoader(ds, 1000, 61_000, 7000, drop_last=True, prefetch=0)
    assert len(list(dropped.epoch(0))) == 8


def test_loader_throughput_and_errors(synth_dir):
    ds = open_dataset(synth_dir)
    result = loader_throughput(ds, 4096, "cpu", batches=5)
    assert result["samples_per_s"] > 0 and result["batches"] == 5
    with pytest.raises(ValueError, match="batch_size"):
        BatchLoader(ds, 0, 10, 0)
    with pytest.raises(NotADirectoryError):
        open_dataset(synth_dir / "nope")
