"""Files the CLI and the trainer write: checked before the work starts, written atomically, readable by others.

Every writer in fuselab goes through this module, so that:

- an output folder or file that cannot be written is found *before* a run starts, and reported as one line that
  names the path (:class:`PathError`, a ``ValueError``; the CLI turns it into exit status 2);
- a file is never half-written: data goes to a temporary file in the same folder, is flushed to disk, then renamed
  over the target (``os.replace``), so an interrupt, a full disk or a crash leaves the old file or the new one;
  the temporary file's name holds the writer's process id (``.<name>.<pid>.<random>.tmp``), so that the one a
  killed process left behind is told apart from one being written (:func:`remove_stale_temp_files`);
- a full disk is reported as such (:class:`NoSpaceError`: how much was needed, how much is free, where), also when
  the library that wrote gave no reason (numpy's ``OSError("... requested and 0 written")``, torch's
  ``RuntimeError("... file write failed")``); with a size hint the space is checked before anything is written;
- files get the usual permissions (``0o666`` less the process umask, as ``open()`` would give), not the ``0o600``
  of :func:`tempfile.mkstemp`;
- JSON is strict: NaN and infinities are written as ``null`` (``json.dumps`` would write the invalid ``NaN``).

This module sits at the bottom of the layers: it imports nothing from fuselab.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["NoSpaceError", "PathError", "atomic_write", "atomic_write_json", "atomic_write_text", "fmt_bytes",
           "json_safe", "read_json", "remove_stale_temp_files", "writable_dir", "writable_file"]


class PathError(ValueError):
    """A user path that cannot be read or written; the message is one line naming the path and the reason."""


class NoSpaceError(PathError):
    """The file system is full: the message says what was written where, the space it needed and the space free.

    ``needed`` (bytes; None when unknown), ``free`` (bytes), ``folder``."""

    def __init__(self, message: str, needed: int | None, free: int, folder: Path):
        super().__init__(message)
        self.needed, self.free, self.folder = needed, free, folder


#: errno values that mean "no space": the disk is full, or the user's quota is spent
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: free space below which a write that failed without a reason is taken for a full disk
_NEARLY_FULL = 1 << 20


def fmt_bytes(n: int | float) -> str:
    """``n`` bytes as 512 B, 3.2 KiB, 1.5 MiB, 2.0 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def writable_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Create ``path`` (and its parents) if needed and check that a file can be created in it.

    Raises :class:`PathError` naming ``what`` and the path when it exists as a file, cannot be created, or is not
    writable (a probe file is created and removed: permission bits alone miss read-only mounts and root's rights).
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise PathError(f"{what} {folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".fuselab-write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise PathError(f"{what} {folder} is not writable: {_reason(err)}") from None
    return folder


def writable_file(path: str | os.PathLike, what: str = "output file") -> Path:
    """Check that ``path`` can be written (its folder is created if needed); an existing folder there is an error."""
    target = Path(path)
    if target.is_dir():
        raise PathError(f"{what} {target} is a folder, not a file")
    writable_dir(target.parent if str(target.parent) else Path("."), f"folder of the {what}")
    if target.exists() and not os.access(target, os.W_OK):
        raise PathError(f"{what} {target} is not writable")
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def check_space(folder: str | os.PathLike, needed: int, what: str, target: str | os.PathLike) -> None:
    """Raise :class:`NoSpaceError` when ``folder``'s file system has less than ``needed`` bytes free."""
    free = _free_bytes(Path(folder))
    if free is not None and free < needed:
        raise NoSpaceError(f"no space for {what} {target}: it needs about {fmt_bytes(needed)}, "
                           f"{fmt_bytes(free)} are free in {folder}", needed, free, Path(folder))


def _os_error_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` ``exc`` is, or the first one its causes and contexts hold."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _space_error(exc: BaseException, folder: Path, what: str, target: Path, needed: int | None,
                 written: int) -> NoSpaceError | None:
    """A :class:`NoSpaceError` when ``exc`` (raised while writing ``target``) comes from a full file system: an
    ``ENOSPC``/``EDQUOT`` in its chain, or a write that failed without an errno while almost nothing is free."""
    cause = _os_error_in(exc)
    free = _free_bytes(folder)
    full = cause is not None and cause.errno in _NO_SPACE
    if not full and (cause.errno is None if cause is not None else isinstance(exc, RuntimeError)):
        full = free is not None and free < max(_NEARLY_FULL, needed or 0)  # a library's write error, no reason
    if not full:
        return None
    need = f"about {fmt_bytes(needed)}" if needed else f"more than the {fmt_bytes(written)} written before it filled"
    free_text = f"{fmt_bytes(free)} are free" if free is not None else "the free space is unknown"
    return NoSpaceError(f"no space left on the device for {what} {target}: it needs {need}, {free_text} in "
                        f"{folder}", needed, free or 0, folder)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], what: str = "file",
                 size_hint: int | None = None) -> Path:
    """Call ``write(f)`` on a temporary binary file beside ``path``, fsync it, then rename it over ``path``.

    On any error the temporary file is removed and the old ``path`` (if any) is left as it was. A full file system
    raises :class:`NoSpaceError` (``size_hint``: the bytes the file will take, checked against the free space
    before anything is written); another ``OSError`` is raised again as :class:`PathError` naming ``what`` and the
    path (a folder that went away, no permission).
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if size_hint:
        check_space(folder, size_hint, what, target)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.{os.getpid()}.", suffix=_TEMP_SUFFIX)
    except OSError as err:
        raise _space_error(err, folder, what, target, size_hint, 0) or PathError(
            f"cannot write {what} {target}: {_reason(err)}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        written = _size(tmp)
        _remove(tmp)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        full = _space_error(exc, folder, what, target, size_hint, written)
        if full is not None:
            raise full from None
        if isinstance(exc, OSError):
            raise PathError(f"cannot write {what} {target}: {_reason(exc)}") from None
        raise
    return target


_TEMP_SUFFIX = ".tmp"
#: a temporary file of :func:`atomic_write`: ``.<target name>.<pid>.<8 random characters of mkstemp>.tmp``
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temp_files(folder: str | os.PathLike, target: str = "*") -> list[Path]:
    """Remove the temporary files :func:`atomic_write` left in ``folder`` when its process was killed mid-write:
    only names of its own pattern whose target matches the glob ``target``, and only when the process that made
    them is gone (not this one, not another that is alive). Returns the files removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None or not fnmatch.fnmatchcase(match["target"], target):
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _alive(pid) or not entry.is_file():
            continue
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def atomic_write_text(path: str | os.PathLike, text: str, what: str = "file") -> Path:
    """:func:`atomic_write` of UTF-8 text."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda f: f.write(data), what)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (recursively through dicts, lists and tuples)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def atomic_write_json(path: str | os.PathLike, obj: Any, what: str = "JSON file", indent: int | None = 2) -> Path:
    """:func:`atomic_write_text` of strict JSON (non-finite floats become ``null``; a trailing newline)."""
    text = json.dumps(json_safe(obj), indent=indent, allow_nan=False, default=str) + "\n"
    return atomic_write_text(path, text, what)


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Parse the JSON file at ``path``; a missing, unreadable or corrupt file raises :class:`PathError` naming it."""
    target = Path(path)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PathError(f"{what} {target} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = _reason(err) if isinstance(err, OSError) else "not UTF-8 text"
        raise PathError(f"cannot read {what} {target}: {reason}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise PathError(f"{what} {target} is not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") \
            from None
