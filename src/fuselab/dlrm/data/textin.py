"""The byte stream ``preprocess`` hands to pyarrow's CSV reader: whole lines, valid UTF-8, truncation caught.

:class:`LineStream` wraps an input file (plain or gzip) and gives pyarrow only complete lines, so that

* a line that is not valid UTF-8 becomes an empty line (which the parser reports as a malformed row), and its
  line number is remembered in :attr:`LineStream.invalid_lines`: pyarrow would otherwise reject the whole file
  (or print an "Exception ignored ... UnicodeDecodeError" from its invalid-row handler and echo raw bytes);
* a truncated or corrupt gzip stream ends at the last complete line before the break, the break is recorded in
  :attr:`LineStream.truncated` (no ``EOFError`` / ``zlib.error`` escapes), and the rows before it are kept;
* a file whose first block holds a NUL byte is refused as binary (:class:`UnreadableInput`, a
  :class:`~fuselab._io.PathError`), and an empty file is flagged (:attr:`LineStream.empty`) before pyarrow sees it.

Lines end at ``\\n`` (Criteo's files); a ``\\r`` alone is not counted as a line end here.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

from fuselab._io import NoSpaceError, PathError, fmt_bytes


class UnreadableInput(PathError):
    """An input file that cannot be read as text (binary, not gzip although named ``.gz``, an I/O error);
    ``reason`` says why, without the path."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"input file {path}: {reason}")
        self.path, self.reason = path, reason


@contextlib.contextmanager
def os_errors_as_path_errors(what: str) -> Iterator[None]:
    """Re-raise an ``OSError`` from the system (a full disk, a folder removed mid-run) as :class:`PathError` (a full
    disk: :class:`~fuselab._io.NoSpaceError`, with the space left), one line naming the file: the CLI reports
    ``ValueError`` as a message with exit status 2, never a traceback."""
    try:
        yield
    except OSError as err:
        if err.errno is None:  # raised with a message of ours (FileNotFoundError("input file ... does not exist"))
            raise
        where = f" {err.filename}" if err.filename else ""
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            folder = Path(err.filename).parent if err.filename else Path(".")
            free = shutil.disk_usage(folder).free if folder.is_dir() else 0
            raise NoSpaceError(f"{what}{where}: {err.strerror or 'no space left on the device'} ({fmt_bytes(free)} "
                               f"free in {folder})", None, free, folder) from None
        raise PathError(f"{what}{where}: {err.strerror or err}") from None


#: bytes inspected for NUL bytes before a file is accepted as text
PEEK_BYTES = 1 << 16
_CHUNK = 1 << 20


class LineStream:
    """A read-only, non-seekable file object over ``path`` (gzip when it ends in ``.gz``); see the module doc.

    Raises :class:`UnreadableInput` (a ``ValueError`` naming the path) when the file cannot be opened or read, is not
    gzip although named ``.gz``, or holds binary data (a NUL byte in its first :data:`PEEK_BYTES` bytes).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.invalid_lines: set[int] = set()  # 1-based line numbers of lines that are not valid UTF-8
        self.truncated: str | None = None  # why the input ended early (a truncated or corrupt gzip stream)
        self.closed = False
        self._lines = 0  # complete lines handed out so far
        self._pending = b""  # bytes after the last newline, held back until their line is complete
        self._eof = False
        try:
            self.raw = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as err:
            raise UnreadableInput(self.path, f"cannot read it: {err.strerror or err}") from None
        self._source = _GzipSource(self.raw) if self.path.suffix == ".gz" else self.raw
        try:
            head = self._read_source(PEEK_BYTES)
        except UnreadableInput:
            self.close()
            raise
        if b"\x00" in head:
            self.close()
            at = head.index(b"\x00")
            raise UnreadableInput(self.path, f"binary data, not Criteo TSV text (NUL byte at offset {at})")
        self.empty = not head and self.truncated is None
        self._pending = head

    # --- the file-object protocol pyarrow uses
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        """Bytes of the file on disk consumed so far (compressed bytes for gzip): for progress bars."""
        return self.raw.tell()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.raw.close()

    def __enter__(self) -> LineStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, size: int = -1) -> bytes:
        """Up to about ``size`` bytes ending at a line end (more when one line is longer); ``b""`` at the end."""
        size = _CHUNK if size is None or size < 0 else max(size, 1)
        data = self._pending
        self._pending = b""
        while not self._eof:
            if b"\n" in data and len(data) >= size:
                break
            chunk = self._read_source(size)
            if not chunk:
                self._eof = True
                break
            data += chunk
        if not self._eof:
            cut = data.rindex(b"\n") + 1
            data, self._pending = data[:cut], data[cut:]
        elif self.truncated is not None and data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # the line cut by the break is lost with it
        return self._clean(data)

    # --- internals
    def _read_source(self, size: int) -> bytes:
        if self.truncated is not None:
            return b""
        try:
            return self._source.read(size)
        except _NotGzip as err:
            raise UnreadableInput(self.path, f"not a gzip file ({err})") from None
        except _Truncated as err:
            self.truncated = str(err)
            return b""
        except OSError as err:
            raise UnreadableInput(self.path, f"cannot read it: {err.strerror or err}") from None

    def _clean(self, data: bytes) -> bytes:
        """Count the lines of ``data`` and blank out those that are not valid UTF-8 (the newline is kept)."""
        first = self._lines + 1
        self._lines += data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1)
        if data.isascii():
            return data
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError:
            pass
        lines = data.split(b"\n")
        for k, line in enumerate(lines):
            if not line.isascii():
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    self.invalid_lines.add(first + k)
                    lines[k] = b""
        return b"\n".join(lines)


class _NotGzip(Exception):
    pass


class _Truncated(Exception):
    pass


class _GzipSource:
    """Decompress a gzip file (several members allowed) through zlib, so that every byte before a break is
    returned: ``gzip.GzipFile`` drops the output of the read call that meets the end of a truncated file.

    ``read`` returns the bytes decompressed so far; once they are used up it raises :class:`_Truncated` (the
    stream ends early or holds corrupt data) or :class:`_NotGzip` (no gzip header at the start)."""

    def __init__(self, raw):
        self.raw = raw
        self._inflate = zlib.decompressobj(wbits=31)
        self._out = b""
        self._started = False  # the file starts with the gzip magic bytes
        self._done = False
        self._error: Exception | None = None

    def read(self, size: int) -> bytes:
        while len(self._out) < size and not self._done:
            chunk = self.raw.read(_CHUNK)
            if not self._started and chunk:
                if not chunk.startswith(b"\x1f\x8b"):
                    self._done, self._error = True, _NotGzip("no gzip header")
                    break
                self._started = True
            try:
                if chunk:
                    self._feed(chunk)
                else:
                    self._done = True
                    if self._started and not self._inflate.eof:
                        self._error = _Truncated("the gzip stream ends before its end marker")
            except zlib.error as err:
                self._done, self._error = True, _Truncated(f"corrupt gzip data: {err}")
        data, self._out = self._out[:size], self._out[size:]
        if not data and self._error is not None:
            err, self._error = self._error, None
            raise err
        return data

    def _feed(self, chunk: bytes) -> None:
        while chunk:
            self._out += self._inflate.decompress(chunk)
            if not self._inflate.eof:
                return
            chunk = self._inflate.unused_data  # the next member (trailing garbage is reported by zlib)
            if chunk:
                self._inflate = zlib.decompressobj(wbits=31)
