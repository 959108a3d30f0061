"""Start N processes on this host, as ``torchrun --standalone --nproc-per-node N`` does.

* :func:`spawn_local`: run a picklable function in N processes (torch's elastic launcher); returns each rank's
  return value; a failed rank stops the others and raises ``ChildFailedError`` naming it.
* :func:`run_module`: ``python -m M ARGS`` in N processes (what ``fuselab dlrm train --nproc N`` calls, with its
  own arguments minus ``--nproc``); returns an exit status: 0, the failed rank's exit code, or 128 + the signal
  that stopped the launcher.
* ``python -m fuselab.dlrm.distributed.launch --nproc N [--module M] [--] ARGS...``: ``torchrun --standalone
  --nproc-per-node N -m M ARGS...`` (M: ``fuselab``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from .parallel import MULTICAST_OFF


def spawn_local(nproc: int, fn: Callable[..., Any], args: Sequence[Any] = (), *, monitor_interval: float = 0.1
                ) -> list[Any]:
    """Run ``fn(*args)`` in ``nproc`` fresh processes (spawn) with torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` of a free port); ``fn`` calls
    :func:`.parallel.init_from_env`. Returns ``[return value of rank 0, ..., rank nproc-1]``.

    Raises ``ValueError`` for ``nproc < 1``, ``torch.distributed.elastic.multiprocessing.errors.ChildFailedError``
    when a rank fails (the others are terminated; no restarts).

    The elastic agent installs handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT in the calling process (they raise
    an exception instead of ending it) and leaves them there; the caller's handlers are put back on return, so
    that a process forked later (a ``multiprocessing`` pool) still ends on SIGTERM."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"fuselab-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=monitor_interval, start_method="spawn")
    with _signal_handlers_kept():
        results = elastic_launch(config, fn)(*args)
    return [results[r] for r in range(nproc)]


def run_module(nproc: int, module_args: Sequence[str], module: str = "fuselab", *,
               monitor_interval: float = 0.5) -> int:
    """Run ``python -m module module_args`` in ``nproc`` processes on this host (torchrun's environment, a free
    port, no restarts); this process is the launcher and waits. On SIGINT/SIGTERM it forwards the signal to the
    ranks and gives them up to 30 s to finish (the trainer writes its checkpoint) before killing them.

    Returns 0 when every rank exits 0, else the exit code of the lowest rank that failed by itself (not by SIGINT
    or SIGTERM, which the launcher sends the others once one fails; a rank killed by a signal: 128 + its number),
    or 130/143 when every rank stopped on such a signal, or 128 + the signal that stopped the launcher.
    Raises ``ValueError`` for ``nproc < 1``."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"fuselab-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=monitor_interval)
    try:
        with _signal_handlers_kept():
            elastic_launch(config, sys.executable)("-m", module, *module_args)
    except ChildFailedError as exc:
        codes = {rank: (128 - f.exitcode if f.exitcode < 0 else f.exitcode) for rank, f in exc.failures.items()}
        # a rank that died on its own first; those stopped by a signal (the launcher ends the others with SIGTERM
        # once one fails) only when every rank was
        own = [rank for rank, code in codes.items() if code not in (130, 143)]
        return codes[min(own or codes)]
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Restore the handlers of the signals torch's elastic agent takes over (main thread only: elsewhere it takes
    none, and Python allows no change)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    saved = {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(sig, handler)


def torchrun_argv(nproc: int, module_args: Sequence[str], module: str = "fuselab") -> list[str]:
    """torchrun's argument list for ``nproc`` processes on this host running ``python -m module module_args``."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    return ["--standalone", f"--nproc-per-node={nproc}", "-m", module, *module_args]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuselab.dlrm.distributed.launch",
                                     description="Run `python -m fuselab ARGS` in N processes on this host.")
    parser.add_argument("--nproc", type=int, required=True, help="processes (one per GPU; gloo on CPU)")
    parser.add_argument("--module", default="fuselab", help="the module each process runs (default: fuselab)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of `python -m fuselab`")
    ns = parser.parse_args(argv)
    rest = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    for key, value in MULTICAST_OFF.items():
        os.environ.setdefault(key, value)
    torchrun.main(torchrun_argv(ns.nproc, rest, ns.module))
    return 0


if __name__ == "__main__":
    sys.exit(main())
