"""The console the commands print to: a stream whose reader is gone never raises into the work, and the width of
tables and summaries follows COLUMNS (100 when it is unset and the output is not a terminal)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuselab.core.console import DEFAULT_WIDTH, GuardedStream, console_width, guarded_console, wrap_fields

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def test_a_stream_whose_reader_is_gone_drops_writes_and_the_descriptor_goes_to_devnull():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", buffering=1)
    guarded = GuardedStream(stream)
    assert guarded.write("seen\n") == 5
    assert os.read(read_end, 100) == b"seen\n"
    os.close(read_end)  # the reader is gone
    assert guarded.write("lost\n") == 5 and guarded.failed is not None
    guarded.write("more\n")
    guarded.flush()
    assert not guarded.isatty()
    os.write(stream.fileno(), b"a C library writing to the descriptor does not fail either\n")
    stream.close()


def test_guarded_console_puts_the_streams_back():
    before = sys.stdout, sys.stderr
    with guarded_console() as (out, err):
        assert sys.stdout is out and sys.stderr is err
        with guarded_console() as (inner, _):
            assert inner is out  # not wrapped twice
    assert (sys.stdout, sys.stderr) == before


def test_printing_into_a_closed_pipe_ends_the_command_normally():
    """`fuselab env | head -0`: the reader is gone before the first line; the command still exits 0, silently."""
    code = ("import os, sys\n"
            "from fuselab.core.console import guarded_console\n"
            "with guarded_console():\n"
            "    for i in range(20000):\n"
            "        print('line', i)\n"
            "    print('an error line', file=sys.stderr)\n"
            "sys.exit(0)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0


def test_width_follows_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "83")
    assert console_width(io.StringIO()) == 83
    monkeypatch.setenv("COLUMNS", "wide")
    assert console_width(io.StringIO()) == DEFAULT_WIDTH == 100
    monkeypatch.delenv("COLUMNS")
    assert console_width(io.StringIO()) == 100  # not a terminal


def test_the_cli_console_is_as_wide_as_columns(monkeypatch):
    from fuselab.cli import _console

    monkeypatch.setenv("COLUMNS", "100")
    assert _console().width == 100
    monkeypatch.delenv("COLUMNS")
    assert _console().width == 100  # output captured: not a terminal


def test_bench_tables_fit_columns_when_piped(tmp_path):
    """`COLUMNS=100 fuselab bench ... | cat`: every line within 100 columns (the result rows of a fake run)."""
    from fuselab.bench import results as R
    from fuselab.bench.report import run_table
    from fuselab.cli import _console

    res = [R.Result("op", "n=2^16", "fp32", "fwd+bwd", p, 1, 8, 1, median_ms=1.0, status="failed",
                    detail="a long explanation of what went wrong " * 4) for p in ("eager", "torch.compile")]
    run = R.OpRun("op", "a summary of the op " * 6, "", {"device": "d"}, None, "host clock", results=res)
    out = io.StringIO()
    console = _console()
    console.file = out
    console.print(run_table(run, wide=True))
    console.print("fuselab bench on a machine with a long name — CPU (no GPU): CPU timings; Triton providers under "
                  "the interpreter, correctness only")
    lines = out.getvalue().splitlines()
    assert lines and max(len(line) for line in lines) <= 100


@pytest.mark.parametrize("width", [80, 100])
def test_train_and_evaluate_summaries_fit_the_width(width):
    from fuselab.dlrm.train import format_summary

    summary = {"config": {"name": "mlperf-v2", "batch_size": 65536, "optimizer": "rowwise_adagrad"},
               "final": {"auc": 0.8, "logloss": 0.45, "accuracy": 0.79, "calibration": 1.01}, "steps_this_run": 1200,
               "steps": 2400, "first_step": 1200, "device": "cuda:0", "world_size": 8, "samples_per_s": 3.5e7,
               "train_seconds": 120.5, "eval_split": "test", "best_auc": 0.85,
               "breakdown_ms": {"data": 0.12, "step": 1.83}}
    lines = format_summary(summary, width)
    assert max(len(line) for line in lines) <= width
    text = " ".join(" ".join(lines).split())
    assert "trained 1200 steps (steps 1201-2400 of the run; 2400 in total)" in text and "gap 0.0500" in text
    assert wrap_fields(["a" * 10, "b" * 10], 15) == ["a" * 10, "  " + "b" * 10]
