"""What the help and the README say holds for the code (item 14 of issue 41): export writes one .onnx file under
ONNX's 2 GB limit, `--config` lists every shipped config, `--breakdown` promises the phases the summary prints,
`fuselab bench` shows progress without a terminal and the README says how long it takes; docs/errors.md lists every
exit code the commands use."""

from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import pytest
import torch

from fuselab.dlrm.cli import configure_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _help(command: str) -> str:
    parser = argparse.ArgumentParser(prog="fuselab dlrm")
    configure_parser(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(sub.choices[command].format_help().split())


def test_export_writes_one_self_contained_file(synth_dir, tmp_path):
    import onnxruntime as ort

    ckpt = tmp_path / "ckpt"
    assert main(["train", "--data", str(synth_dir), "--steps", "2", "--batch-size", "512", "--quiet", "--set",
                 "eval_batches=1", "--checkpoint-dir", str(ckpt), "--run-dir", str(tmp_path / "run")]) == 0
    out = tmp_path / "export" / "m.onnx"
    assert main(["export", "--checkpoint", str(ckpt), "--onnx", str(out)]) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx"]
    moved = tmp_path / "elsewhere.onnx"  # alone in another folder, it still loads
    out.rename(moved)
    session = ort.InferenceSession(str(moved), providers=["CPUExecutionProvider"])
    probs = session.run(None, {"dense": torch.rand(3, 13).numpy(),
                               "sparse": torch.zeros(3, 26, dtype=torch.int64).numpy()})[1]
    assert probs.shape == (3,) and ((probs > 0) & (probs < 1)).all()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "one self-contained file when the weights fit ONNX's 2 GB limit" in readme


def test_config_help_lists_every_shipped_config():
    shipped = sorted(p.stem for p in (ROOT / "src" / "fuselab" / "dlrm" / "configs").glob("*.json"))
    assert "mlperf-v2" in shipped
    text = _help("train")
    listed = re.search(r"--config CONFIG config name \(([^)]*)\)", text)
    assert listed is not None, text
    assert sorted(listed.group(1).split(", ")) == shipped


def test_breakdown_help_names_the_phases_the_summary_prints(synth_dir, tmp_path):
    from fuselab.dlrm.config import load_config
    from fuselab.dlrm.train import format_summary, train

    summary = train(load_config("tiny", ["steps=2", "batch_size=512", "eval_batches=1"]), synth_dir, breakdown=True,
                    progress=False, log=lambda *a: None)
    phases = list(summary["breakdown_ms"])
    text = _help("train")
    promised = re.search(r"--breakdown (.*?)(?= --profile)", text).group(1)
    named = re.findall(r"\b(\w+) \(", promised)  # "data (waiting ...) and step (forward, ...)"
    assert named == phases, (promised, phases)
    assert "data/forward/backward/optimizer" not in text
    line = format_summary(summary)[-1]
    assert all(f"{p} " in line for p in phases)


def test_bench_shows_progress_without_a_terminal():
    from rich.console import Console

    from fuselab.bench import results as R
    from fuselab.bench.lab import run
    from fuselab.bench.options import BenchOptions
    from fuselab.bench.timing import TimingStats

    class Clock:
        kind = "cpu"

        def measure(self, job):
            for step in job.steps:
                step()
            return TimingStats(1.0, 0.9, 1.1)

    out = io.StringIO()
    ceilings = R.Ceilings(device_type="cpu", copy_gbps=10.0, copy_bytes=2**20, copy_method="fake")
    run(BenchOptions(ops=("square",), providers=("torch.square",), quick=True, write=False), timer=Clock(),
        ceilings=ceilings, device=torch.device("cpu"), console=Console(file=out, width=100))
    assert re.search(r"^\[1/1\] square: checking and timing \(\d+ s so far\)$", out.getvalue(), re.M), out.getvalue()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "a full `fuselab bench` takes minutes, not seconds (about 7 on 2 cores)" in readme


@pytest.mark.parametrize("code", [0, 1, 2, 3, 130, 143])
def test_errors_doc_lists_each_exit_code(code):
    from fuselab.dlrm.health import DIVERGED_EXIT

    doc = (ROOT / "docs" / "errors.md").read_text()
    assert f"\n| {code} |" in doc
    assert DIVERGED_EXIT == 3 and "docs/errors.md" in (ROOT / "README.md").read_text()
