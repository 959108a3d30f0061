"""A fault corpus for the CLI: bad input files and unwritable outputs give one line naming the file, exit 2,
and keep every good row; nothing is echoed raw and no stray warning reaches the terminal."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fuselab.cli import main

GOOD = "\t".join(["1", *[str(j) for j in range(13)], *["0a1b2c3d"] * 26])
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    for needle in needles:
        assert needle in lines[0], (needle, err)


def _rows(out: Path) -> int:
    return json.loads((out / "metadata.json").read_text())["num_rows"]


# ---------------------------------------------------------------- bad input files
def test_invalid_utf8_line_is_one_bad_row(tmp_path: Path, capsys):
    src = tmp_path / "day_0"
    bad_field = GOOD.encode().replace(b"0a1b2c3d", b"0a1b\xff\xfe", 1)
    src.write_bytes(b"\n".join([GOOD.encode(), bad_field, b"1\t\xc3\x28", GOOD.encode()]) + b"\n")
    code, out, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 0, err
    assert _rows(tmp_path / "o") == 2
    assert f"{src}:2: invalid UTF-8" in out and f"{src}:3: invalid UTF-8" in out
    assert "\ufffd" not in out + err and "\\xff" not in out  # no raw or replaced bytes echoed
    code, _, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "f"), "--on-error", "fail",
                         "--quiet"], capsys)
    assert code == 2
    _one_line_error(err, f"{src}:2: invalid UTF-8")


def _truncated_gz(path: Path, rows: int = 4000) -> None:
    lines = "".join(GOOD.replace("0a1b2c3d", f"{i:08x}", 1) + "\n" for i in range(rows)).encode()
    data = gzip.compress(lines)
    path.write_bytes(data[: len(data) // 2])


def test_truncated_gzip_keeps_rows_before_the_break(tmp_path: Path, capsys):
    src, other = tmp_path / "day_0.gz", tmp_path / "day_1"
    _truncated_gz(src)
    other.write_text(GOOD + "\n")
    code, out, err = _cli(["dlrm", "preprocess", str(src), str(other), "--out", str(tmp_path / "o"), "--quiet"],
                          capsys)
    assert code == 0, err
    kept = _rows(tmp_path / "o") - 1
    assert 0 < kept < 4000
    assert f"{src}: truncated or corrupt gzip stream" in out and f"kept the {kept:,} rows" in out
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["counts"]["rows_per_file"][str(src)] == kept
    assert meta["counts"]["malformed"] == {}  # the line cut by the break is not reported as a malformed row
    code, _, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "f"), "--on-error", "fail",
                         "--quiet"], capsys)
    assert code == 2
    _one_line_error(err, str(src), "truncated", f"{kept:,} rows")


def test_gz_that_is_not_gzip(tmp_path: Path, capsys):
    src = tmp_path / "day_0.gz"
    src.write_text(GOOD + "\n")
    code, _, err = _cli(["dlrm", "preprocess", str(src), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2
    _one_line_error(err, str(src), "not a gzip file")


def test_binary_file_is_refused_quietly(tmp_path: Path):
    src = tmp_path / "model.bin"
    src.write_bytes(bytes(range(256)) * 64 + b"\t\n" * 10)
    proc = subprocess.run([sys.executable, "-m", "fuselab", "dlrm", "preprocess", str(src), "--out",
                           str(tmp_path / "o"), "--quiet"], capture_output=True, env=ENV, timeout=120)
    err = proc.stderr.decode("utf-8", "strict")  # valid text: no raw bytes echoed
    assert proc.returncode == 2
    _one_line_error(err, str(src), "binary")
    assert all(ch.isprintable() for ch in err.strip())


def test_empty_file_among_several_is_skipped(tmp_path: Path, capsys):
    empty, empty_gz, good = tmp_path / "day_0", tmp_path / "day_1.gz", tmp_path / "day_2"
    empty.write_bytes(b"")
    empty_gz.write_bytes(gzip.compress(b""))
    good.write_text(GOOD + "\n" + GOOD + "\n")
    code, out, err = _cli(["dlrm", "preprocess", str(empty), str(empty_gz), str(good), "--out", str(tmp_path / "o"),
                           "--quiet"], capsys)
    assert code == 0, err
    assert _rows(tmp_path / "o") == 2
    assert f"{empty}: empty file, skipped" in out and f"{empty_gz}: empty file, skipped" in out
    code, _, err = _cli(["dlrm", "preprocess", str(empty), "--out", str(tmp_path / "e"), "--quiet"], capsys)
    assert code == 2
    _one_line_error(err, "no valid rows", f"{empty}: empty file")


# ---------------------------------------------------------------- unwritable outputs
def _blocked(tmp_path: Path) -> Path:
    """A path under a regular file: not writable, also for root (chmod does not stop root)."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    return blocker / "sub"


def test_unwritable_outputs_fail_before_the_work(tmp_path: Path, capsys):
    src = tmp_path / "day_0"
    src.write_text(GOOD + "\n")
    out = _blocked(tmp_path)
    cases = [
        (["dlrm", "preprocess", str(src), "--out", str(out), "--quiet"], str(out)),
        (["dlrm", "synth", "--out", str(out), "--rows", "100", "--workers", "1", "--quiet"], str(out)),
        # the checkpoint does not exist: the output path is checked first, so the message names it
        (["dlrm", "export", "--checkpoint", str(tmp_path / "none.pt"), "--onnx", str(out / "m.onnx")], str(out)),
        (["profile", "gelu_tanh", "--trace", str(out / "t.json")], str(out)),
        (["profile", "gelu_tanh", "--provider", "torch.compile", "--out", str(out)], str(out)),
        (["bench", "square", "--quick", "--out", str(out)], str(out)),
    ]
    for argv, path in cases:
        code, _, err = _cli(argv, capsys)
        assert code == 2, (argv, err)
        _one_line_error(err, path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path: Path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, _, err = _cli(["dlrm", "synth", "--out", str(folder), "--rows", "100", "--workers", "1", "--quiet"],
                            capsys)
    finally:
        folder.chmod(0o755)
    assert code == 2
    _one_line_error(err, str(folder), "not writable")


# ---------------------------------------------------------------- outputs: valid JSON, usual permissions, quiet
def test_synth_tsv_metadata_is_strict_json_with_the_best_auc(tmp_path: Path, capsys):
    code, out, err = _cli(["dlrm", "synth", "--out", str(tmp_path / "d"), "--format", "tsv", "--rows", "3000",
                           "--scale", "1e-4", "--workers", "1", "--quiet"], capsys)
    assert code == 0, err
    assert "nan" not in out.lower()

    def reject(token):
        raise AssertionError(f"invalid JSON token {token}")

    meta = json.loads((tmp_path / "d" / "metadata.json").read_text(), parse_constant=reject)
    assert 0.6 < meta["best_auc"] < 1 and 0.5 < meta["best_auc_test"] < 1
    mask = os.umask(0)
    os.umask(mask)
    for path in (tmp_path / "d").iterdir():
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_synth_tsv_best_auc_matches_the_npy_truth(tmp_path: Path):
    from fuselab.dlrm.data.synth import SynthSpec, write_synthetic

    spec = SynthSpec(rows=3000, scale=1e-4, seed=3)
    tsv = write_synthetic(tmp_path / "t", spec, fmt="tsv.gz", shard_rows=1000, workers=1)
    npy = write_synthetic(tmp_path / "n", spec, fmt="npy", shard_rows=1000, workers=1)
    assert tsv["best_auc"] == pytest.approx(npy["best_auc"], abs=1e-12)
    assert tsv["best_auc_test"] == pytest.approx(npy["best_auc_test"], abs=1e-12)


@pytest.mark.parametrize("argv", [["gelu_tanh"], ["rope", "--provider", "fuselab", "--mode", "fwd+bwd"]])
def test_profile_prints_nothing_on_stderr(tmp_path: Path, argv: list[str]):
    """Kineto writes ``USDT: ... profiler_start`` lines to file descriptor 2 at every profile: a process of its own
    shows whether they (or anything else) reach the terminal."""
    proc = subprocess.run([sys.executable, "-m", "fuselab", "profile", *argv, "--trace", str(tmp_path / "t.json")],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "USDT" not in proc.stdout and "wall time per call" in proc.stdout
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "t.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_export_drops_the_torchvision_notices():
    import logging

    from fuselab.dlrm.export import _quiet_exporter

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    handler = Keep()
    logger.addHandler(handler)
    try:
        with _quiet_exporter():
            logger.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
            logger.warning("a real problem")
    finally:
        logger.removeHandler(handler)
    assert seen == ["a real problem"]


def test_export_drops_only_the_exporters_known_notices():
    from fuselab.dlrm.export import _quiet_exporter

    other_axis = ("# The axis name: seq will not be used, since it shares the same shape constraints with another "
                  "axis: batch.")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with _quiet_exporter():
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and "
                          "treespec.is_leaf()` instead.", FutureWarning, stacklevel=2)
            warnings.warn("# The axis name: batch will not be used, since it shares the same shape constraints with "
                          "another axis: batch.", UserWarning, stacklevel=2)
            warnings.warn(other_axis, UserWarning, stacklevel=2)
            warnings.warn("a real problem", UserWarning, stacklevel=2)
    assert [str(w.message) for w in seen] == [other_axis, "a real problem"]


def test_compile_quietly_drops_only_torchs_import_notice(monkeypatch):
    import torch

    from fuselab.core.compile import compile_quietly

    def fake_compile(fn, **options):
        warnings.warn("`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or "
                      "`torch.export`.", DeprecationWarning, stacklevel=2)
        warnings.warn("a real problem", UserWarning, stacklevel=2)
        return (fn, options)

    monkeypatch.setattr(torch, "compile", fake_compile)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert compile_quietly(len, dynamic=False) == (len, {"dynamic": False})
    assert [str(w.message) for w in seen] == ["a real problem"]


def test_first_compile_of_a_process_warns_nothing():
    """In a fresh process Inductor's first import (here at the first call) runs under the filter (with -W error,
    a notice would raise)."""
    code = ("import torch\n"
            "from fuselab.core.compile import compile_quietly\n"
            "f = compile_quietly(lambda x: x * 2 + 1, fullgraph=True)\n"
            "print(f(torch.ones(3)).tolist())\n")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[3.0, 3.0, 3.0]" and proc.stderr == ""


def test_version():
    from fuselab import __version__

    proc = subprocess.run([sys.executable, "-m", "fuselab", "--version"], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"fuselab {__version__}"


def test_roofline_legend_keeps_small_numbers():
    from fuselab.bench.plots import roof_label

    assert roof_label(3350.4, 0.21) == "roof: 3350 GB/s, 0.21 TFLOP/s"
    assert roof_label(0.456, 989.5) == "roof: 0.456 GB/s, 990 TFLOP/s"


def test_folder_given_as_input(tmp_path: Path, capsys):
    code, _, err = _cli(["dlrm", "preprocess", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert code == 2
    _one_line_error(err, f"input {tmp_path} is a folder")
