"""Crash-safe file replacement shared by the weight cache and the tuning checkpoints.

Example:
    >>> import os, tempfile
    >>> from langtorch.functional.loaders._atomic import atomic_write
    >>> d = tempfile.mkdtemp()
    >>> atomic_write(os.path.join(d, "x.txt"), lambda tmp: open(tmp, "w").write("hi"))
    >>> open(os.path.join(d, "x.txt")).read()
    'hi'
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

__all__ = ["atomic_write", "fsync_dir"]


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make renames inside ``directory`` durable (a no-op where the filesystem cannot).

    Example:
        >>> import tempfile
        >>> fsync_dir(tempfile.gettempdir())
    """
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # some filesystems cannot fsync a directory
        pass


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Write ``path`` through ``write(tmp_path)`` so that a crash leaves the old file or the new.

    The temp file is a unique sibling (never a PID-only name), fsynced before the rename and
    removed on any failure; the directory is fsynced after it.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "a", "b.bin")
        >>> atomic_write(p, lambda tmp: open(tmp, "wb").write(b"1"))
        >>> os.path.getsize(p)
        1
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: readers never see a partial file
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
