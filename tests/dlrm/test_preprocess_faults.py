"""`fuselab dlrm preprocess` on faulty inputs and a full disk: an unreadable file among several is skipped (or,
with --on-error fail, stops the run after writing a dataset of what was read and saying how to go on); a file
whose every line is bad shows the first reasons; a full disk names the space and keeps the shards for a resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fuselab.cli import main
from fuselab.dlrm.data.datasets import open_dataset

GOOD = "\t".join(["1", *[str(j) for j in range(13)], *["0a1b2c3d"] * 26])


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    first, binary, last = tmp_path / "day_0", tmp_path / "day_1", tmp_path / "day_2"
    first.write_text((GOOD + "\n") * 3)
    binary.write_bytes(bytes(range(256)) * 16)
    last.write_text((GOOD.replace("0a1b2c3d", "ff", 1) + "\n") * 2)
    return first, binary, last


def test_a_binary_file_among_several_is_skipped(tmp_path, capsys):
    first, binary, last = _inputs(tmp_path)
    out_dir = tmp_path / "o"
    code, out, err = _cli(["dlrm", "preprocess", str(first), str(binary), str(last), "--out", str(out_dir),
                           "--quiet"], capsys)
    assert code == 0, err
    assert f"{binary}: binary data, not Criteo TSV text (NUL byte at offset 0), skipped" in out
    ds = open_dataset(out_dir)
    assert len(ds) == 5 and ds.read_column("sparse", 0, 5)[:, 0].tolist() == [0x0A1B2C3D] * 3 + [0xFF] * 2
    meta = json.loads((out_dir / "metadata.json").read_text())
    assert meta["counts"]["rows_per_file"] == {str(first): 3, str(binary): 0, str(last): 2}
    assert "partial" not in meta


def test_on_error_fail_stops_at_the_binary_file_and_leaves_a_dataset(tmp_path, capsys):
    first, binary, last = _inputs(tmp_path)
    out_dir = tmp_path / "o"
    argv = ["dlrm", "preprocess", str(first), str(binary), str(last), "--out", str(out_dir), "--quiet"]
    code, _, err = _cli([*argv, "--on-error", "fail"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"input file {binary}: binary data" in err and f"the 3 rows read before it are a usable dataset in " \
        f"{out_dir}" in err and "run the same command with --on-error skip" in err
    ds = open_dataset(out_dir)
    assert len(ds) == 3 and json.loads((out_dir / "metadata.json").read_text())["partial"] is True
    code, out, err = _cli([*argv, "--on-error", "skip"], capsys)  # goes on: day_0 is not parsed again
    assert code == 0 and "3 file(s): 5 rows" in out, err
    assert len(open_dataset(out_dir)) == 5


def test_a_file_of_bad_lines_shows_the_first_reasons(tmp_path, capsys):
    src = tmp_path / "day_0"
    src.write_text("2\t" + "\t".join(["1"] * 39) + "\nx\ty\n" + GOOD.replace("\t1\t", "\tz\t", 1) + "\n")
    code, _, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2, err
    assert "no valid rows in the input; 3 malformed row(s)" in err
    assert f"{src}:1: bad label" in err and f"{src}:2: wrong field count" in err and f"{src}:3: non-integer" in err


def test_a_full_disk_names_the_space_and_resumes(tmp_path, capsys, monkeypatch):
    """numpy's write of a shard fails without an errno (``OSError("... requested and 0 written")``), as on a full
    disk; the message says so, with the space left, and the same command resumes once there is space."""
    import shutil

    from fuselab import _io

    sources = [tmp_path / f"day_{i}" for i in range(2)]
    for src in sources:
        src.write_text((GOOD + "\n") * 4)
    argv = ["dlrm", "preprocess", *map(str, sources), "--out", str(tmp_path / "o"), "--shard-rows", "4", "--quiet"]
    usage = shutil.disk_usage(tmp_path)
    real_save, calls = np.save, {"n": 0}

    def save(f, array, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 4:  # the second file's first shard: the disk is full
            monkeypatch.setattr(_io, "shutil", type("S", (), {"disk_usage": staticmethod(
                lambda p: usage._replace(free=512))}))
            raise OSError(f"{array.nbytes} requested and 0 written")
        return real_save(f, array, *args, **kwargs)

    monkeypatch.setattr(np, "save", save)
    code, _, err = _cli(argv, capsys)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "no space left on the device for shard file" in err and "512 B are free in" in err
    assert "the shards written so far are kept" in err and "run the same command again" in err
    monkeypatch.undo()
    code, out, err = _cli(argv, capsys)
    assert code == 0 and "8 rows" in out, err


def test_an_os_error_of_a_full_disk_is_named(tmp_path, capsys, monkeypatch):
    import errno

    from fuselab.dlrm.data import tsv

    src = tmp_path / "day_0"
    src.write_text(GOOD + "\n")
    shard = tmp_path / "o" / "shards" / "f000-00000.dense.npy"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(shard))

    monkeypatch.setattr(tsv, "write_shard", full)
    code, _, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{shard}: No space left on device" in err and "free in" in err and "run the same command" in err
