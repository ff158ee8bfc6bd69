"""Atomic replacement of a directory that other processes may be reading, and an inter-process lock.

``exchange(a, b)`` swaps two directory entries in one step (Linux ``renameat2(RENAME_EXCHANGE)``): a
reader resolving ``a`` sees either the old or the new directory, never nothing. Where the kernel or file
system lacks it (ENOSYS / EINVAL / EOPNOTSUPP), it falls back to two renames (``a`` -> ``b`` parked, then
``b`` -> ``a``), which leaves ``a`` missing for the moment between them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import pathlib
import uuid

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)


def exchange(a: pathlib.Path, b: pathlib.Path) -> None:
    """Swaps the directory entries ``a`` and ``b`` (same file system). Afterwards ``a`` holds what ``b``
    held and ``b`` holds ``a``'s old content. Raises OSError on failure (nothing changed)."""
    if _renameat2 is not None:
        rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise OSError(err, f"renameat2(RENAME_EXCHANGE) {a} <-> {b}: {os.strerror(err)}")
    parked = a.with_name(f".{a.name}.old-{uuid.uuid4().hex}")
    os.rename(a, parked)
    os.rename(b, a)
    os.rename(parked, b)


@contextlib.contextmanager
def locked(lock_path: pathlib.Path):
    """Holds an exclusive ``flock`` on ``lock_path`` (created if missing, never deleted: deleting lock
    files races) for the ``with`` block. Blocks until the lock is free."""
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
