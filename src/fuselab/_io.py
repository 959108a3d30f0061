"""Files the CLI and the trainer write: checked before the work starts, written atomically, readable by others.

Every writer in fuselab goes through this module, so that:

- an output folder or file that cannot be written is found *before* a run starts, and reported as one line that
  names the path (:class:`PathError`, a ``ValueError``; the CLI turns it into exit status 2);
- a file is never half-written: data goes to a temporary file in the same folder, is flushed to disk, then renamed
  over the target (``os.replace``), so an interrupt, a full disk or a crash leaves the old file or the new one;
- files get the usual permissions (``0o666`` less the process umask, as ``open()`` would give), not the ``0o600``
  of :func:`tempfile.mkstemp`;
- JSON is strict: NaN and infinities are written as ``null`` (``json.dumps`` would write the invalid ``NaN``).

This module sits at the bottom of the layers: it imports nothing from fuselab.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["PathError", "atomic_write", "atomic_write_json", "atomic_write_text", "json_safe", "read_json",
           "writable_dir", "writable_file"]


class PathError(ValueError):
    """A user path that cannot be read or written; the message is one line naming the path and the reason."""


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


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any], what: str = "file") -> Path:
    """Call ``write(f)`` on a temporary binary file beside ``path``, fsync it, then rename it over ``path``.

    On any error the temporary file is removed and the old ``path`` (if any) is left as it was. An ``OSError`` is
    raised again as :class:`PathError` naming ``what`` and the path (a full disk, a folder that went away).
    """
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.",
                                   suffix=".tmp")
    except OSError as err:
        raise PathError(f"cannot write {what} {target}: {_reason(err)}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        raise PathError(f"cannot write {what} {target}: {_reason(err)}") from None
    except BaseException:
        _remove(tmp)
        raise
    return target


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
