"""ONNX export vs PyTorch in onnxruntime, and the `fuselab dlrm` CLI end to end."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from fuselab.dlrm.cli import configure_parser, main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fuselab dlrm")
    configure_parser(parser)
    return parser


def test_parser_has_every_subcommand_with_a_func():
    parser = _parser()
    for argv in (["synth", "--out", "x"], ["preprocess", "a.tsv", "--out", "x"], ["train"],
                 ["export", "--checkpoint", "c", "--onnx", "m.onnx"], ["info", "d"]):
        args = parser.parse_args(argv)
        assert callable(args.func)
    args = parser.parse_args(["train", "--set", "lr_dense=0.3", "--compile", "--steps", "5", "--batch-size", "64",
                              "--eval-every", "2", "--device", "cpu", "--profile", "p", "--resume"])
    assert (args.overrides, args.compile, args.steps, args.resume) == (["lr_dense=0.3"], True, 5, "latest")
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_cli_import_is_light():
    code = "import sys, fuselab.dlrm.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_synth_train_export_info(tmp_path, capsys):
    data, ckpt, onnx = tmp_path / "data", tmp_path / "ckpt", tmp_path / "m.onnx"
    assert main(["synth", "--out", str(data), "--rows", "30000", "--scale", "1e-4", "--workers", "1",
                 "--quiet"]) == 0
    assert "best achievable AUC" in capsys.readouterr().out
    assert main(["info", str(data)]) == 0
    assert json.loads(capsys.readouterr().out)["num_rows"] == 30000
    assert main(["train", "--data", str(data), "--steps", "6", "--batch-size", "512", "--checkpoint-dir",
                 str(ckpt), "--quiet", "--json", str(tmp_path / "s.json"), "--set", "eval_batches=1", "--run-dir",
                 str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "generator's best AUC" in out and "samples/s" in out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["steps"] == 6 and len(summary["losses"]) == 6
    assert main(["train", "--data", str(data), "--loader-only", "--batch-size", "1024", "--steps", "5"]) == 0
    assert "loader alone" in capsys.readouterr().out
    assert main(["export", "--checkpoint", str(ckpt), "--onnx", str(onnx)]) == 0
    assert onnx.is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # the staging folder is gone

    # onnxruntime vs PyTorch on raw ids (the graph applies the modulus itself), batch size != export's
    import onnxruntime as ort

    from fuselab.dlrm.data.loader import open_dataset
    from fuselab.dlrm.export import model_from_checkpoint

    exported, _ = model_from_checkpoint(ckpt)
    batch = open_dataset(data).read(100, 163)
    raw = batch.sparse + 1_000_003 * exported.sizes.clone()  # ids beyond the tables
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    logits, probs = session.run(None, {"dense": batch.dense.numpy(), "sparse": raw.numpy()})
    with torch.no_grad():
        ref_logits, ref_probs = exported(batch.dense, batch.sparse)
    np.testing.assert_allclose(probs, ref_probs.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, ref_logits.numpy(), rtol=1e-5, atol=1e-5)


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nope"), "--steps", "1", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuselab dlrm: error:") and "Traceback" not in err
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t2\n")
    assert main(["preprocess", str(bad), "--out", str(tmp_path / "o"), "--on-error", "fail", "--quiet"]) == 2
    assert f"{bad}:1: wrong field count" in capsys.readouterr().err
    assert main(["train", "--set", "bogus=1"]) == 2
    assert "unknown config field" in capsys.readouterr().err
    assert main(["export", "--checkpoint", str(tmp_path / "none.pt"), "--onnx", str(tmp_path / "m.onnx")]) == 2


def test_top_level_fuselab_dlrm_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fuselab.cli", "dlrm", "synth", "--out", str(tmp_path / "d"),
                          "--rows", "2000", "--scale", "1e-4", "--workers", "1", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "d" / "metadata.json").is_file()
