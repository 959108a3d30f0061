"""The flags of ``fuselab dlrm ...``, each checked where argparse parses it (a bad value: ``argument --flag: ...``,
exit status 2, before anything runs).

A flag that sets a config field takes that field's rule (:data:`fuselab.dlrm.config.FIELD_RULES`), so
``--batch-size 0``, ``--set batch_size=0`` and ``"batch_size": 0`` in a config file get the same answer. Nothing
here imports torch: building the parser (``--help``) stays fast.
"""

from __future__ import annotations

import argparse

from fuselab.core.flags import COUNT, DEVICE, POSITIVE_INT, SECONDS, Number, OneOf

from .config import DEFAULT_RUN_DIR, DEFAULT_SYNTH_DIR, FIELD_RULES, OPTIMIZERS, PRESETS, parse_override

#: ``--config``: a shipped config's name or a config file
CONFIG_NAME = OneOf(PRESETS, suffixes=(".json", ".toml"))
#: the lowest ONNX opset torch's exporter writes natively (lower ones go through a converter that may fail)
MIN_OPSET = 18


def _field(key: str):
    return FIELD_RULES[key].parse


def _override(text: str) -> str:
    """``--set KEY=VALUE``: the key must be a config field and the value fit its rule."""
    try:
        parse_override(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _opset(text: str) -> int:
    """``--opset``: from :data:`MIN_OPSET` to the newest opset the installed onnx knows."""
    try:
        import onnx

        newest = onnx.defs.onnx_opset_version()
    except ImportError:  # export names the missing package itself
        newest = None
    return Number(int, MIN_OPSET, newest).parse(text)


def add_synth_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--rows", type=POSITIVE_INT.parse, default=200_000)
    p.add_argument("--scale", type=Number(float, 0, 1, low_open=True).parse, default=None,
                   help="multiply the tables (Kaggle's, or the --config's) by this, in (0, 1]; default: 1.0 with "
                        "--config (its full-size tables), 0.001 without (Kaggle's at 33.8K rows in all)")
    p.add_argument("--config", type=CONFIG_NAME.parse, default=None,
                   help="take the tables and multi-hot bag sizes of this config (e.g. mlperf-v2: the Criteo 1TB "
                        "cardinalities capped at 40M, MLPerf's bags; npy only)")
    p.add_argument("--format", choices=("npy", "tsv", "tsv.gz"), default="npy")
    p.add_argument("--seed", type=_field("seed"), default=0)
    p.add_argument("--positive-rate", type=Number(float, 0, 1, low_open=True, high_open=True).parse, default=0.256,
                   help="share of positive labels, in (0, 1)")
    p.add_argument("--zipf-alpha", type=Number(float, 0, low_open=True).parse, default=1.2,
                   help="power-law exponent of the categorical ids (> 0)")
    p.add_argument("--signal", type=Number(float, 0).parse, default=1.0,
                   help="scale of the hidden model's logit (harder when lower; 0: labels carry no signal)")
    p.add_argument("--shard-rows", type=POSITIVE_INT.parse, default=1 << 20)
    p.add_argument("--workers", type=COUNT.parse, default=0, help="generator processes (0: one per core, max 16)")
    p.add_argument("--quiet", action="store_true")


def add_preprocess_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="+", help="train.txt, day_0, day_1.gz, ... in order")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--shard-rows", type=POSITIVE_INT.parse, default=1 << 20)
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="malformed rows, a truncated .gz and unreadable (binary) files: skip and report (default), "
                        "or stop with exit 2 (rows read before the fault are kept as a usable dataset either way)")
    p.add_argument("--min-count", type=POSITIVE_INT.parse, default=1,
                   help="vocab hashing: ids seen fewer times share row 0 (vocabulary saved in the output)")
    p.add_argument("--block-size", type=Number(int, 4096).parse, default=16 << 20,
                   help="bytes parsed per block (bounds memory; >= 4096)")
    p.add_argument("--no-resume", action="store_true", help="start over even if a partial run exists")
    p.add_argument("--quiet", action="store_true")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=CONFIG_NAME.parse, default=None,
                   help=f"config name ({', '.join(PRESETS)}) or a .json/.toml file (default: tiny)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", type=_override,
                   help="override any config field, e.g. --set lr_dense=0.05 --set bottom_mlp=[512,256,16]")
    p.add_argument("--device", type=DEVICE.parse, default=None,
                   help="cpu, cuda, cuda:1 (default: cuda when present, else cpu)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the step (with --cuda-graph: the compiled step captured in the graph)")
    p.add_argument("--epochs", type=_field("epochs"), default=None,
                   help="epochs over the train split (> 0, fractions allowed)")
    p.add_argument("--steps", type=_field("steps"), default=None, help="optimizer steps (wins over --epochs)")
    p.add_argument("--batch-size", type=_field("batch_size"), default=None)
    p.add_argument("--eval-every", type=_field("eval_every"), default=None, metavar="STEPS",
                   help="evaluate every N steps (0: at the end only)")
    p.add_argument("--eval-batches", type=_field("eval_batches"), default=None,
                   help="cap on batches per evaluation (0: all)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="rowwise_adagrad: row-wise for the tables, element-wise for the MLPs (default: from config)")
    p.add_argument("--lr-dense", type=_field("lr_dense"), default=None,
                   help="peak learning rate of the MLPs (default: the config's learning_rates[optimizer][0])")
    p.add_argument("--lr-sparse", type=_field("lr_sparse"), default=None,
                   help="peak learning rate of the embedding tables (default: learning_rates[optimizer][1])")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default=None,
                   help="fp32, TF32 matmuls, or bf16 autocast (default: from config)")
    p.add_argument("--bf16", action="store_true", default=None, help="the same as --precision bf16")
    p.add_argument("--kernels", choices=("auto", "fuselab", "torch"), default=None,
                   help="fuselab's fused kernels or the PyTorch reference (auto: fuselab on CUDA, torch on CPU)")
    p.add_argument("--cuda-graph", action="store_true", default=None,
                   help="capture the whole training step in a CUDA graph (with --compile: the compiled step; "
                        "default: from config, mlperf-v2's 'auto' = on with the fused kernels on CUDA; "
                        "--set cuda_graph=false turns it off)")
    p.add_argument("--data-on-device", action="store_true", default=None,
                   help="load the train split onto the device once; shuffle and batch there")
    p.add_argument("--hashing", choices=("modulus", "vocab"), default=None)
    p.add_argument("--seed", type=_field("seed"), default=None)


def _add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-budget", type=SECONDS.parse, default=None, metavar="SECONDS",
                   help="stop training after this many seconds (> 0; checked between steps)")
    p.add_argument("--breakdown", action="store_true",
                   help="time each step's two phases: data (waiting for the next batch) and step (forward, "
                        "backward and both updates together); synchronizes the device between them")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="profile a window of steps: Chrome trace, TensorBoard trace, per-kernel table in DIR")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="write TensorBoard scalars to DIR")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="write checkpoints here (at the end, every --checkpoint-every steps, on Ctrl-C)")
    p.add_argument("--checkpoint-every", type=_field("checkpoint_every"), default=None, metavar="STEPS",
                   help="checkpoint every N steps, to --checkpoint-dir or else RUN_DIR/checkpoints "
                        "(default: from config)")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR",
                   help="run record (run.json) and, without --checkpoint-dir, the checkpoint of an interrupted run "
                        f"(default: {DEFAULT_RUN_DIR})")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="FILE",
                   help="resume from FILE (a checkpoint, a checkpoint folder or its latest.json), or from the latest "
                        "complete checkpoint in --checkpoint-dir (without it: in RUN_DIR/checkpoints); a damaged "
                        "latest one is skipped for the one before, with a warning")
    p.add_argument("--loader-only", action="store_true",
                   help="measure the data loader's throughput alone (no model) and exit")
    p.add_argument("--json", default=None, metavar="FILE", help="write the run summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=POSITIVE_INT.parse, default=None, metavar="N",
                   help="train on N processes of this host (one per GPU; gloo on CPU): sharded tables, "
                        "data-parallel MLPs; --batch-size is the global batch (a multiple of N); the same as "
                        "`torchrun --standalone --nproc-per-node N -m fuselab dlrm train ...`")


def add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="dataset directory (npy shards from preprocess/synth, or parquet + metadata JSON). "
                        f"Without it a small synthetic set is made in {DEFAULT_SYNTH_DIR}")
    _add_model_args(p)
    _add_output_args(p)


def add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint file, or checkpoint folder or its latest.json (the latest)")
    p.add_argument("--data", required=True, help="dataset directory")
    p.add_argument("--split", choices=("test", "val", "train", "all"), default="test")
    p.add_argument("--batch-size", type=POSITIVE_INT.parse, default=65536)
    p.add_argument("--max-batches", type=COUNT.parse, default=0, help="evaluate only the first N batches (0: all)")
    p.add_argument("--device", type=DEVICE.parse, default=None,
                   help="cpu, cuda, cuda:1 (default: cuda when present, else cpu)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the metrics as JSON")


def add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint file written by train, or checkpoint folder or its latest.json (the latest)")
    p.add_argument("--onnx", required=True, metavar="FILE",
                   help="output .onnx file: one self-contained file under ONNX's 2 GB limit, else FILE plus its "
                        "weights in FILE.data beside it")
    p.add_argument("--batch-size", type=POSITIVE_INT.parse, default=4,
                   help="batch size of the example input (the axis is dynamic)")
    p.add_argument("--opset", type=_opset, default=MIN_OPSET,
                   help=f"ONNX opset, from {MIN_OPSET} to the newest the installed onnx knows")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
