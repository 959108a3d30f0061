"""The console the commands print to: how wide it is, and streams whose failure never stops the work.

* :func:`console_width`: ``COLUMNS`` when it holds a positive integer, else the terminal's width, else
  :data:`DEFAULT_WIDTH` (output piped, redirected to a file, a CI log).
* :func:`make_console`: a rich ``Console`` of that width (imports rich on first use).
* :func:`wrap_fields`: fields joined on lines that fit a width (a summary line that would run past it breaks
  between two fields, never inside one).
* :func:`guarded_console`: ``sys.stdout`` and ``sys.stderr`` replaced by :class:`GuardedStream` for the duration of
  a command. A write or flush that fails (the reader of a pipe is gone, ``EPIPE``; a full disk under a redirect,
  ``ENOSPC``; any ``OSError``) turns that stream off: its file descriptor is pointed at ``os.devnull``, so neither
  Python nor a C library writing to it fails again, and every later write is dropped. The work goes on: a training
  run whose ``| tee log`` died with the Ctrl-C still finishes its step, writes its checkpoint and exits 130.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

#: columns of the console when ``COLUMNS`` is unset and the output is not a terminal
DEFAULT_WIDTH = 100


def console_width(stream: IO[str] | None = None) -> int:
    """``COLUMNS`` (a positive integer), else the width of the terminal ``stream`` (default ``sys.stdout``) is,
    else :data:`DEFAULT_WIDTH`."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):  # no file descriptor (a captured stream), or not a terminal
        pass
    return DEFAULT_WIDTH


def make_console(**options: Any):
    """A ``rich.console.Console`` of :func:`console_width` columns, without highlighting (``options`` passed on)."""
    from rich.console import Console

    options.setdefault("width", console_width())
    options.setdefault("highlight", False)
    return Console(**options)


def wrap_fields(fields: Iterable[str], width: int | None = None, sep: str = "   ", indent: str = "  ") -> list[str]:
    """``fields`` joined by ``sep`` on lines of at most ``width`` columns (default :func:`console_width`); a line
    after the first starts with ``indent``. A field longer than the width gets a line of its own."""
    width = console_width() if width is None else width
    lines: list[str] = []
    for field in fields:
        if lines and len(lines[-1]) + len(sep) + len(field) <= width:
            lines[-1] += sep + field
        else:
            lines.append((indent if lines else "") + field)
    return lines


class GuardedStream:
    """A text stream that passes writes on to ``stream`` until one fails, then drops them (see the module doc).

    ``failed`` holds the error that turned it off (None while it works)."""

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.failed: OSError | None = None

    def write(self, text: str) -> int:
        if self.failed is None:
            try:
                return self.stream.write(text)
            except OSError as err:
                self._turn_off(err)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self.stream.flush()
            except OSError as err:
                self._turn_off(err)

    def isatty(self) -> bool:
        if self.failed is not None:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError):
            return False

    def _turn_off(self, err: OSError) -> None:
        self.failed = err
        with contextlib.suppress(AttributeError, OSError, ValueError):
            fd = self.stream.fileno()
            sink = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(sink, fd)
            finally:
                os.close(sink)
        with contextlib.suppress(OSError, ValueError):  # what the stream still buffers goes to os.devnull now
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer, ...: those of the stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def guarded_console() -> Iterator[tuple[GuardedStream, GuardedStream]]:
    """Run the block with ``sys.stdout`` and ``sys.stderr`` guarded (already guarded streams are kept); both are
    flushed and put back at the end."""
    saved = sys.stdout, sys.stderr
    out, err = (s if isinstance(s, GuardedStream) else GuardedStream(s) for s in saved)
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        out.flush()
        err.flush()
        sys.stdout, sys.stderr = saved
