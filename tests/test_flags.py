"""Every flag of every command is checked where argparse parses it: a bad value exits 2 with the flag's name and
what it expects, before anything runs (no traceback); `--set KEY=VALUE` and config files go by the same rules."""

from __future__ import annotations

import json

import pytest

from fuselab.cli import main

BAD_FLAGS = [
    # fuselab dlrm train
    (["dlrm", "train"], "--epochs", "inf"), (["dlrm", "train"], "--epochs", "nan"),
    (["dlrm", "train"], "--epochs", "0"),
    (["dlrm", "train"], "--device", "tpu"), (["dlrm", "train"], "--device", "cuda:x"),
    (["dlrm", "train"], "--seed", "-1"), (["dlrm", "train"], "--time-budget", "-1"),
    (["dlrm", "train"], "--time-budget", "nan"), (["dlrm", "train"], "--steps", "-1"),
    (["dlrm", "train"], "--batch-size", "0"), (["dlrm", "train"], "--eval-every", "-1"),
    (["dlrm", "train"], "--eval-batches", "-3"), (["dlrm", "train"], "--lr-dense", "-1"),
    (["dlrm", "train"], "--lr-sparse", "inf"), (["dlrm", "train"], "--checkpoint-every", "-2"),
    (["dlrm", "train"], "--nproc", "0"), (["dlrm", "train"], "--config", "nope"),
    (["dlrm", "train"], "--set", "prefetch=-1"), (["dlrm", "train"], "--set", "epochs=Infinity"),
    (["dlrm", "train"], "--set", "nope=1"), (["dlrm", "train"], "--set", "batch_size=0"),
    (["dlrm", "train"], "--set", "interaction=sideways"), (["dlrm", "train"], "--set", "no_equals_sign"),
    # fuselab dlrm synth
    (["dlrm", "synth", "--out", "x"], "--rows", "0"), (["dlrm", "synth", "--out", "x"], "--scale", "0"),
    (["dlrm", "synth", "--out", "x"], "--scale", "2"), (["dlrm", "synth", "--out", "x"], "--seed", "-1"),
    (["dlrm", "synth", "--out", "x"], "--positive-rate", "1"), (["dlrm", "synth", "--out", "x"], "--zipf-alpha", "0"),
    (["dlrm", "synth", "--out", "x"], "--signal", "-1"), (["dlrm", "synth", "--out", "x"], "--shard-rows", "0"),
    (["dlrm", "synth", "--out", "x"], "--workers", "-1"), (["dlrm", "synth", "--out", "x"], "--config", "nope"),
    # fuselab dlrm preprocess
    (["dlrm", "preprocess", "in", "--out", "x"], "--shard-rows", "0"),
    (["dlrm", "preprocess", "in", "--out", "x"], "--min-count", "0"),
    (["dlrm", "preprocess", "in", "--out", "x"], "--block-size", "100"),
    # fuselab dlrm evaluate / export
    (["dlrm", "evaluate", "ck", "--data", "d"], "--batch-size", "0"),
    (["dlrm", "evaluate", "ck", "--data", "d"], "--max-batches", "-1"),
    (["dlrm", "evaluate", "ck", "--data", "d"], "--device", "tpu"),
    (["dlrm", "export", "--checkpoint", "ck", "--onnx", "m.onnx"], "--batch-size", "0"),
    (["dlrm", "export", "--checkpoint", "ck", "--onnx", "m.onnx"], "--opset", "5"),
    (["dlrm", "export", "--checkpoint", "ck", "--onnx", "m.onnx"], "--opset", "1000"),
    # fuselab profile / bench compare
    (["profile", "gelu_tanh"], "--steps", "0"),
    (["bench", "compare", "a.json", "b.json"], "--threshold", "-0.1"),
    (["bench", "compare", "a.json", "b.json"], "--threshold", "nan"),
]


@pytest.mark.parametrize("command, flag, value", BAD_FLAGS, ids=[f"{c[1] if len(c) > 1 else c[0]}{f}={v}"
                                                                  for c, f, v in BAD_FLAGS])
def test_a_bad_flag_value_exits_2_naming_the_flag(command, flag, value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written; if it were, not into the checkout
    with pytest.raises(SystemExit) as stop:
        main([*command, f"{flag}={value}" if value.startswith("-") else flag, *([] if value.startswith("-")
                                                                                  else [value])])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    quoted = repr(value.split("=")[0]) if flag == "--set" and "=" in value else repr(value)  # --set: the field
    assert f"argument {flag}: " in err and quoted in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_messages_say_what_is_expected(capsys):
    cases = {("--epochs", "inf"): "expected a finite number > 0, got 'inf'",
             ("--device", "tpu"): "expected cpu, cuda or cuda:N, got 'tpu'",
             ("--seed", "-1"): "expected an integer in [0, 9223372036854775807], got '-1'",
             ("--set", "prefetch=-1"): "config field 'prefetch': expected an integer >= 0, got -1"}
    for (flag, value), message in cases.items():
        with pytest.raises(SystemExit):
            main(["dlrm", "train", f"{flag}={value}"])
        assert message in capsys.readouterr().err, flag


def test_a_config_file_goes_by_the_same_rules(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"name": "mine", "embedding_dim": 4, "bottom_mlp": [4], "top_mlp": [1],
                               "prefetch": -1}))
    assert main(["dlrm", "train", "--config", str(cfg), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "config field 'prefetch': expected an integer >= 0, got -1" in err and "Traceback" not in err
