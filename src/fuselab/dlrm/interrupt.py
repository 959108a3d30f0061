"""Stopping a training run on SIGINT/SIGTERM without losing it: the signal is noted, the loop finishes its step,
the trainer writes a checkpoint and raises :class:`TrainingInterrupted`.

A second signal :attr:`SignalCatcher.REPEAT_S` seconds or more after the first interrupts at once
(``KeyboardInterrupt``); a second one sooner is the same interruption delivered twice (by the terminal and by a
launcher such as torchrun) and is ignored. Handlers are installed in the main thread only, and the previous ones
are put back afterwards.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path


class TrainingInterrupted(Exception):
    """Training stopped by a signal after a checkpoint was written; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}; checkpoint {checkpoint}")


class SignalCatcher:
    """Notes SIGINT and SIGTERM while :meth:`catching` is active; ``signum`` is the first one (None: none)."""

    #: a second signal at least this long after the first stops at once
    REPEAT_S = 1.0

    def __init__(self) -> None:
        self.signum: int | None = None
        self._at = 0.0

    def _on_signal(self, signum: int, frame) -> None:
        now = time.monotonic()
        if self.signum is not None:
            if now - self._at >= self.REPEAT_S:  # a second Ctrl-C: stop now
                raise KeyboardInterrupt
            return  # the same interruption delivered twice (terminal and launcher)
        self.signum, self._at = signum, now

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
