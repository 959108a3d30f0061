"""``fuselab dlrm ...``: synth, preprocess, train, evaluate, export, info.

The top-level CLI calls :func:`configure_parser` with the ``dlrm`` sub-parser. Every
sub-subcommand sets ``func(args) -> int``. Imports of torch / numpy / pyarrow happen inside
the handlers, so building the parser (``fuselab --help``) stays fast.

Errors that are the user's or the machine's (a missing or damaged file, a bad flag value, a malformed row with
``--on-error fail``, a full disk) print one line to stderr and return exit status 2, never a traceback; a training
run that diverges returns 3, one interrupted by SIGINT/SIGTERM 130/143 after its checkpoint (``docs/errors.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from fuselab.core.console import guarded_console, wrap_fields

from . import cli_args
from .config import DEFAULT_SYNTH_DIR


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
    from .data.shards import KAGGLE_CARDINALITIES
    from .data.synth import SynthSpec, write_synthetic

    cards = bags = None
    full = list(KAGGLE_CARDINALITIES)
    scale = args.scale if args.scale is not None else (1.0 if args.config is not None else 1e-3)
    if args.config is not None:  # the config's tables (times the scale) and bags
        from .config import load_config

        cfg = load_config(args.config)
        if cfg.cardinalities is not None:
            full = list(cfg.cardinalities)
            cards = tuple(max(2, round(n * scale)) for n in full)
        bags = tuple(cfg.multi_hot_sizes) if cfg.multi_hot_sizes is not None else None
    spec = SynthSpec(rows=args.rows, scale=scale, seed=args.seed, positive_rate=args.positive_rate,
                     zipf_alpha=args.zipf_alpha, signal=args.signal, cardinalities=cards, multi_hot_sizes=bags)
    print(_synth_plan(spec.validate(), full, args.config or "kaggle", args.format), flush=True)
    started = time.monotonic()
    meta = write_synthetic(args.out, spec, fmt=args.format, shard_rows=args.shard_rows, workers=args.workers,
                           progress=not args.quiet)
    print(f"wrote {meta['num_rows']:,} rows ({args.format}) to {args.out} in {time.monotonic() - started:.0f} s; "
          f"positive rate {meta['positive_rate']:.4f}; best achievable AUC {_auc_text(meta['best_auc'])} "
          f"(test split {_auc_text(meta['best_auc_test'])}); embedding rows {sum(meta['cardinalities']):,}")
    return 0


def _synth_plan(spec, full: list[int], name: str, fmt: str) -> str:
    """The line printed before a synthetic set is written: its tables' scale and size, and its size on disk."""
    rows = sum(spec.table_cardinalities())
    ids = sum(spec.bag_sizes())
    on_disk = spec.rows * (13 * 4 + ids * 8 + 4 + 4) if fmt == "npy" else None  # dense, ids, label, true logit
    scale = ("full-size tables" if spec.scale == 1 else
             f"tables at {spec.scale:g} of full size ({rows:,} rows of {sum(full):,}; --scale 1 for full size)")
    size = "" if on_disk is None else (f", about {on_disk / 1e9:.1f} GB on disk" if on_disk >= 1e9 else
                                       f", about {on_disk / 1e6:.0f} MB on disk")
    return f"synthetic {name} set: {spec.rows:,} rows of {ids} ids each, {scale}{size}"


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
    from .health import DIVERGED_EXIT

    code = run_module(args.nproc, _without_nproc(list(args.argv)))
    if code not in (0, DIVERGED_EXIT, 130, 143):  # rank 0 of such a run has said why it stopped and what is saved
        print(f"fuselab dlrm: training on {args.nproc} processes failed (exit code {code}; the first failed rank's "
              "error is above); a checkpoint written before the failure is complete and resumable with --resume",
              file=sys.stderr)
    return code


def _cmd_train(args: argparse.Namespace) -> int:
    from fuselab._io import atomic_write_json, writable_dir

    from .health import TrainingDiverged
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
    except TrainingDiverged as diverged:
        if main:
            print(f"fuselab dlrm: {diverged}", file=sys.stderr)
        return diverged.exit_code
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
    print("\n".join(wrap_fields([f"{result['checkpoint']} (step {result['step']})", f"on {result['data']}",
                                 f"[{result['split']}, {result['samples']:,} rows]"], sep=" ")))
    fields = [f"logloss {result['logloss']:.5f}", f"AUC {result['auc']:.5f}", f"accuracy {result['accuracy']:.5f}",
              f"calibration {result['calibration']:.4f} (mean prediction {result['mean_prediction']:.4f} / "
              f"mean label {result['positive_rate']:.4f})"]
    print("\n".join(wrap_fields(fields + ([f"generator's best AUC {best:.5f}"] if best else []))))
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


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``dlrm`` sub-subcommands to ``parser`` (each sets ``func(args) -> int``)."""
    sub = parser.add_subparsers(dest="dlrm_command", metavar="{synth,preprocess,train,evaluate,export,info}")
    sub.required = True

    p = sub.add_parser("synth", help="write a synthetic Criteo-format dataset with a known best AUC",
                       description="Zipf categorical ids over (scaled) Kaggle cardinalities, count-like dense "
                                   "features, labels from a hidden logistic model (best AUC stored in metadata).")
    cli_args.add_synth_args(p)
    p.set_defaults(func=_guard(_cmd_synth))

    p = sub.add_parser("preprocess", help="Criteo TSV (.gz) -> npy shards + metadata JSON (streaming, resumable)")
    cli_args.add_preprocess_args(p)
    p.set_defaults(func=_guard(_cmd_preprocess))

    p = sub.add_parser("train", help="train DLRM (no arguments: tiny config on a small synthetic set)",
                       description="Train a DLRM and evaluate it. Writes RUN_DIR/run.json (config and summary); "
                                   "without --data, a 1M-row synthetic set (about 270 MB) in "
                                   f"{DEFAULT_SYNTH_DIR}. Ctrl-C (or SIGTERM) finishes the current step, writes a "
                                   "checkpoint (to --checkpoint-dir, else RUN_DIR/checkpoints) and exits 130 (143). "
                                   "A loss that is not finite stops the run with exit 3. Exit codes: docs/errors.md.")
    cli_args.add_train_args(p)
    p.set_defaults(func=_guard(_cmd_train))

    p = sub.add_parser("evaluate", help="logloss, AUC, accuracy and calibration of a checkpoint on a dataset")
    cli_args.add_evaluate_args(p)
    p.set_defaults(func=_guard(_cmd_evaluate))

    p = sub.add_parser("export", help="export a checkpoint's model to ONNX")
    cli_args.add_export_args(p)
    p.set_defaults(func=_guard(_cmd_export))

    p = sub.add_parser("info", help="print a dataset's metadata")
    p.add_argument("data", help="dataset directory")
    p.set_defaults(func=_guard(_cmd_info))


def main(argv: list[str] | None = None) -> int:
    """Run ``fuselab dlrm`` on its own (the same parser the top-level CLI mounts)."""
    parser = argparse.ArgumentParser(prog="fuselab dlrm")
    configure_parser(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    with guarded_console():  # a closed pipe or a full disk under stdout/stderr never stops the work
        try:
            args = parser.parse_args(argv)
        except SystemExit as stop:  # a bad flag (2, argparse's message printed) or --help (0)
            return int(stop.code or 0)
        args.argv = ["dlrm", *argv]  # as the top-level command sees it (--nproc restarts `python -m fuselab ARGV`)
        return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
