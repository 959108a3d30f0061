"""``fuselab dlrm ...``: synth, preprocess, train, evaluate, export, info.

The top-level CLI calls :func:`configure_parser` with the ``dlrm`` sub-parser. Every
sub-subcommand sets ``func(args) -> int``. Imports of torch / numpy / pyarrow happen inside
the handlers, so building the parser (``fuselab --help``) stays fast.

Errors that are the user's (a missing file, a bad flag value, a malformed row with
``--on-error fail``) print one line to stderr and return exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .config import DEFAULT_RUN_DIR, DEFAULT_SYNTH_DIR, OPTIMIZERS


class UserError(Exception):
    """An error caused by the user's input: reported in one line, exit status 2."""


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (UserError, ValueError, OSError, TypeError) as exc:
            print(f"fuselab dlrm: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("fuselab dlrm: interrupted", file=sys.stderr)
            return 130

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


# ---------------------------------------------------------------------------------------- handlers


def _auc_text(auc: float | None) -> str:
    """An AUC for the terminal; None or NaN (data of one class) reads as unknown."""
    return "unknown (one class only)" if auc is None or auc != auc else f"{auc:.4f}"


def _cmd_synth(args: argparse.Namespace) -> int:
    from .data.synth import SynthSpec, write_synthetic

    cards = bags = None
    if args.config is not None:  # the config's tables (times --scale) and bags
        from .config import load_config

        cfg = load_config(args.config)
        if cfg.cardinalities is not None:
            cards = tuple(max(2, round(n * args.scale)) for n in cfg.cardinalities)
        bags = tuple(cfg.multi_hot_sizes) if cfg.multi_hot_sizes is not None else None
    spec = SynthSpec(rows=args.rows, scale=args.scale, seed=args.seed, positive_rate=args.positive_rate,
                     zipf_alpha=args.zipf_alpha, signal=args.signal, cardinalities=cards, multi_hot_sizes=bags)
    meta = write_synthetic(args.out, spec, fmt=args.format, shard_rows=args.shard_rows, workers=args.workers,
                           progress=not args.quiet)
    print(f"wrote {meta['num_rows']:,} rows ({args.format}) to {args.out}; positive rate "
          f"{meta['positive_rate']:.4f}; best achievable AUC {_auc_text(meta['best_auc'])} "
          f"(test split {_auc_text(meta['best_auc_test'])}); embedding rows {sum(meta['cardinalities']):,}")
    return 0


def _cmd_preprocess(args: argparse.Namespace) -> int:
    from .data.tsv import preprocess

    report = preprocess(args.inputs, args.out, shard_rows=args.shard_rows, on_error=args.on_error,
                        min_count=args.min_count, resume=not args.no_resume, progress=not args.quiet,
                        block_size=args.block_size)
    print(report.summary())
    return 0


def _train_config(args: argparse.Namespace):
    """The config of ``train``'s flags: preset or file, then ``--set``, then named flags (None: from the config)."""
    from .config import load_config

    precision = args.precision
    if args.bf16:
        if precision not in (None, "bf16"):
            raise UserError(f"--bf16 and --precision {precision} disagree (--bf16 means --precision bf16)")
        precision = "bf16"
    return load_config(args.config, args.overrides, device=args.device, compile=args.compile, epochs=args.epochs,
                       steps=args.steps, batch_size=args.batch_size, eval_every=args.eval_every,
                       eval_batches=args.eval_batches, optimizer=args.optimizer, lr_dense=args.lr_dense,
                       lr_sparse=args.lr_sparse, precision=precision, hashing=args.hashing, seed=args.seed,
                       kernels=args.kernels, cuda_graph=args.cuda_graph, data_on_device=args.data_on_device,
                       checkpoint_every=args.checkpoint_every)


def _loader_only(args: argparse.Namespace, cfg) -> int:
    from fuselab._io import atomic_write_json, writable_file

    from .data.loader import loader_throughput, open_dataset
    from .runtime import default_dataset, resolve_device

    if args.json:
        writable_file(args.json, "--json file")
    device = resolve_device(cfg.device)
    ds = open_dataset(args.data if args.data is not None else default_dataset(print))
    result = loader_throughput(ds, cfg.batch_size, device, batches=args.steps or 50, prefetch=cfg.prefetch)
    print(f"loader alone ({device}, batch {cfg.batch_size}): {result['samples_per_s']:,.0f} samples/s, "
          f"{result['GB_per_s']:.2f} GB/s")
    if args.json:
        atomic_write_json(args.json, result, "--json file")
    return 0


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` minus ``--nproc N`` / ``--nproc=N``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _launch_ranks(args: argparse.Namespace) -> int:
    """``--nproc N``: this process starts N ranks running the same command (minus ``--nproc``) and waits."""
    from .distributed.launch import run_module

    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    code = run_module(args.nproc, _without_nproc(list(args.argv)))
    if code not in (0, 130, 143):  # an interrupted run's rank 0 has said where its checkpoint is
        print(f"fuselab dlrm: training on {args.nproc} processes failed (exit code {code}; the first failed rank's "
              "error is above); a checkpoint written before the failure is complete and resumable with --resume",
              file=sys.stderr)
    return code


def _cmd_train(args: argparse.Namespace) -> int:
    from fuselab._io import atomic_write_json, writable_dir

    from .train import TrainingInterrupted, format_summary, json_summary, train

    distributed = "WORLD_SIZE" in os.environ  # a rank of a job started by torchrun or --nproc
    if args.nproc is not None:
        if distributed:
            raise UserError("--nproc starts the ranks itself: drop it when running under torchrun")
        return _launch_ranks(args)
    main = os.environ.get("RANK", "0") == "0"
    cfg = _train_config(args)
    if args.loader_only:
        return _loader_only(args, cfg)
    run_dir = writable_dir(args.run_dir, "run folder (--run-dir)")
    run = {"config": cfg.to_dict(), "data": args.data, "checkpoint_dir": args.checkpoint_dir,
           "resume": args.resume, "argv": list(args.argv),
           "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    if main:
        atomic_write_json(run_dir / "run.json", run, "run record")
    try:
        summary = train(cfg, args.data, breakdown=args.breakdown, profile_dir=args.profile,
                        tensorboard_dir=args.tensorboard, checkpoint_dir=args.checkpoint_dir, resume=args.resume,
                        time_budget=args.time_budget, progress=not args.quiet, run_dir=run_dir, json_path=args.json,
                        distributed=distributed)
    except TrainingInterrupted as stop:
        import signal

        if main:
            print(f"fuselab dlrm: {signal.Signals(stop.signum).name} at step {stop.step}: checkpoint written to "
                  f"{stop.checkpoint}", file=sys.stderr)
            print(f"fuselab dlrm: to continue, run the same command with --resume {stop.checkpoint}",
                  file=sys.stderr)
        return stop.exit_code
    if not main:
        return 0
    for line in format_summary(summary):
        print(line)
    record = json_summary(summary)
    atomic_write_json(run_dir / "run.json", {**run, "summary": {k: v for k, v in record.items() if k != "losses"}},
                      "run record")
    if args.json:
        atomic_write_json(args.json, record, "--json file")
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from fuselab._io import atomic_write_json, writable_file

    from .evaluation import evaluate_checkpoint

    if args.json:
        writable_file(args.json, "--json file")
    result = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, batch_size=args.batch_size,
                                 device=args.device, max_batches=args.max_batches)
    best = result["best_auc"]
    print(f"{result['checkpoint']} (step {result['step']}) on {result['data']} [{result['split']}, "
          f"{result['samples']:,} rows]")
    print(f"logloss {result['logloss']:.5f}   AUC {result['auc']:.5f}   accuracy {result['accuracy']:.5f}   "
          f"calibration {result['calibration']:.4f} (mean prediction {result['mean_prediction']:.4f} / "
          f"mean label {result['positive_rate']:.4f})" + (f"   generator's best AUC {best:.5f}" if best else ""))
    if args.json:
        atomic_write_json(args.json, result, "--json file")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_onnx

    path = export_onnx(args.checkpoint, args.onnx, batch_size=args.batch_size, opset=args.opset,
                       check=not args.no_check)
    print(f"wrote {path}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import json

    from .data.loader import open_dataset

    ds = open_dataset(args.data)
    meta = dict(ds.meta)
    for key in ("shards", "vocab_counts"):
        meta.pop(key, None)
    print(json.dumps(meta, indent=2, default=str))
    return 0


# ---------------------------------------------------------------------------------------- parser


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help="config name (tiny, kaggle, mlperf-v1) or a .json/.toml file (default: tiny)")
    p.add_argument("--data", default=None,
                   help="dataset directory (npy shards from preprocess/synth, or parquet + metadata JSON). "
                        f"Without it a small synthetic set is made in {DEFAULT_SYNTH_DIR}")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config field, e.g. --set lr_dense=0.05 --set bottom_mlp=[512,256,16]")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when present, else cpu)")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the dense part")
    p.add_argument("--epochs", type=float, default=None, help="epochs over the train split (fractions allowed)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (wins over --epochs)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop training after this many seconds (checked between steps)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None, metavar="STEPS", help="evaluate every N steps (0: end)")
    p.add_argument("--eval-batches", type=int, default=None, help="cap on batches per evaluation (0: all)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="rowwise_adagrad: row-wise for the tables, element-wise for the MLPs (default: from config)")
    p.add_argument("--lr-dense", type=float, default=None,
                   help="peak learning rate of the MLPs (default: the config's learning_rates[optimizer][0])")
    p.add_argument("--lr-sparse", type=float, default=None,
                   help="peak learning rate of the embedding tables (default: learning_rates[optimizer][1])")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default=None,
                   help="fp32, TF32 matmuls, or bf16 autocast (default: from config)")
    p.add_argument("--bf16", action="store_true", default=None, help="the same as --precision bf16")
    p.add_argument("--kernels", choices=("auto", "fuselab", "torch"), default=None,
                   help="fuselab's fused kernels or the PyTorch reference (auto: fuselab on CUDA, torch on CPU)")
    p.add_argument("--cuda-graph", action="store_true", default=None,
                   help="capture the whole training step in a CUDA graph")
    p.add_argument("--data-on-device", action="store_true", default=None,
                   help="load the train split onto the device once; shuffle and batch there")
    p.add_argument("--hashing", choices=("modulus", "vocab"), default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--breakdown", action="store_true",
                   help="time data/forward/backward/optimizer per step (synchronizes between phases)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="profile a window of steps: Chrome trace, TensorBoard trace, per-kernel table in DIR")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="write TensorBoard scalars to DIR")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="write checkpoints here (at the end, every --checkpoint-every steps, on Ctrl-C)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                   help="checkpoint every N steps, to --checkpoint-dir or else RUN_DIR/checkpoints "
                        "(default: from config)")
    p.add_argument("--run-dir", default=DEFAULT_RUN_DIR, metavar="DIR",
                   help="run record (run.json) and, without --checkpoint-dir, the checkpoint of an interrupted run "
                        f"(default: {DEFAULT_RUN_DIR})")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="FILE",
                   help="resume from FILE (a checkpoint, a checkpoint folder or its latest.json), or from the latest "
                        "checkpoint in --checkpoint-dir "
                        "(without it: in RUN_DIR/checkpoints)")
    p.add_argument("--loader-only", action="store_true",
                   help="measure the data loader's throughput alone (no model) and exit")
    p.add_argument("--json", default=None, metavar="FILE", help="write the run summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train on N processes of this host (one per GPU; gloo on CPU): sharded tables, "
                        "data-parallel MLPs; --batch-size is the global batch (a multiple of N); the same as "
                        "`torchrun --standalone --nproc-per-node N -m fuselab dlrm train ...`")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``dlrm`` sub-subcommands to ``parser`` (each sets ``func(args) -> int``)."""
    sub = parser.add_subparsers(dest="dlrm_command", metavar="{synth,preprocess,train,evaluate,export,info}")
    sub.required = True

    p = sub.add_parser("synth", help="write a synthetic Criteo-format dataset with a known best AUC",
                       description="Zipf categorical ids over (scaled) Kaggle cardinalities, count-like dense "
                                   "features, labels from a hidden logistic model (best AUC stored in metadata).")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--scale", type=float, default=1e-3,
                   help="multiply the Kaggle cardinalities (or the --config's) by this (1.0: full Kaggle, 33.8M rows)")
    p.add_argument("--config", default=None,
                   help="take the tables and multi-hot bag sizes of this config (e.g. mlperf-v2: the Criteo 1TB "
                        "cardinalities capped at 40M, MLPerf's bags; npy only)")
    p.add_argument("--format", choices=("npy", "tsv", "tsv.gz"), default="npy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--positive-rate", type=float, default=0.256)
    p.add_argument("--zipf-alpha", type=float, default=1.2, help="power-law exponent of the categorical ids")
    p.add_argument("--signal", type=float, default=1.0, help="scale of the hidden model's logit (harder when lower)")
    p.add_argument("--shard-rows", type=int, default=1 << 20)
    p.add_argument("--workers", type=int, default=0, help="generator processes (0: one per core, max 16)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_guard(_cmd_synth))

    p = sub.add_parser("preprocess", help="Criteo TSV (.gz) -> npy shards + metadata JSON (streaming, resumable)")
    p.add_argument("inputs", nargs="+", help="train.txt, day_0, day_1.gz, ... in order")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--shard-rows", type=int, default=1 << 20)
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                   help="malformed rows and a truncated .gz: skip and report (default), or stop with exit 2 "
                        "(rows before a gzip break are kept either way)")
    p.add_argument("--min-count", type=int, default=1,
                   help="vocab hashing: ids seen fewer times share row 0 (vocabulary saved in the output)")
    p.add_argument("--block-size", type=int, default=16 << 20, help="bytes parsed per block (bounds memory)")
    p.add_argument("--no-resume", action="store_true", help="start over even if a partial run exists")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_guard(_cmd_preprocess))

    p = sub.add_parser("train", help="train DLRM (no arguments: tiny config on a small synthetic set)",
                       description="Train a DLRM and evaluate it. Writes RUN_DIR/run.json (config and summary); "
                                   "without --data, a 1M-row synthetic set (about 270 MB) in "
                                   f"{DEFAULT_SYNTH_DIR}. Ctrl-C (or SIGTERM) finishes the current step, writes a "
                                   "checkpoint (to --checkpoint-dir, else RUN_DIR/checkpoints) and exits 130 (143).")
    _add_train_args(p)
    p.set_defaults(func=_guard(_cmd_train))

    p = sub.add_parser("evaluate", help="logloss, AUC, accuracy and calibration of a checkpoint on a dataset")
    p.add_argument("checkpoint", help="checkpoint file, or checkpoint folder or its latest.json (the latest)")
    p.add_argument("--data", required=True, help="dataset directory")
    p.add_argument("--split", choices=("test", "val", "train", "all"), default="test")
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--max-batches", type=int, default=0, help="evaluate only the first N batches (0: all)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when present, else cpu)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the metrics as JSON")
    p.set_defaults(func=_guard(_cmd_evaluate))

    p = sub.add_parser("export", help="export a checkpoint's model to ONNX")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint file written by train, or checkpoint folder or its latest.json (the latest)")
    p.add_argument("--onnx", required=True, metavar="FILE", help="output .onnx file")
    p.add_argument("--batch-size", type=int, default=4, help="batch size of the example input (axis is dynamic)")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.set_defaults(func=_guard(_cmd_export))

    p = sub.add_parser("info", help="print a dataset's metadata")
    p.add_argument("data", help="dataset directory")
    p.set_defaults(func=_guard(_cmd_info))


def main(argv: list[str] | None = None) -> int:
    """Run ``fuselab dlrm`` on its own (the same parser the top-level CLI mounts)."""
    parser = argparse.ArgumentParser(prog="fuselab dlrm")
    configure_parser(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = ["dlrm", *argv]  # as the top-level command sees it (--nproc restarts `python -m fuselab ARGV`)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
