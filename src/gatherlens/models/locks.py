"""Locks that die with their process, and the sweep that removes what killed processes left.

    >>> with hold(cache_dir / "smollm2-b179c9523d0e6a0f"):    # models/.smollm2-b179c9523d0e6a0f.lock
    ...     build_it()                                          # writes only .smollm2-....tmp-* siblings
    >>> sweep(cache_dir)                                        # removes leftovers nobody holds

Rule: every temporary file or folder for a name X in a folder is `.X.tmp-*` or `.X.trash-*`,
and it is created only while holding `.X.lock` (an exclusive `flock`). The kernel drops a
`flock` when its process ends, however it ends (kill -9 included), so a lock that can be taken
without waiting means that no live process is writing X's temporaries: they are leftovers and
are removed. A lock file is unlinked by its holder on release; a waiter that then holds a lock
on an unlinked file notices (the path's inode differs) and tries again.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks, so no sweeping either
    fcntl = None

__all__ = ["hold", "Busy", "holder", "sweep", "sweep_name", "leftovers", "temp_prefix", "trash_prefix"]

_LEFTOVER = re.compile(r"^\.(?P<key>.+)\.(?:tmp|trash)-[^/]*$")
_LOCK = re.compile(r"^\.(?P<key>.+)\.lock$")


class Busy(BlockingIOError):
    """The lock is held by another live process."""


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def temp_prefix(target: Path) -> str:
    return f".{target.name}.tmp-"


def trash_prefix(target: Path) -> str:
    return f".{target.name}.trash-"


def holder(target: Path) -> str:
    """The pid written in `target`'s lock file ('?' when unknown)."""
    return _pid(lock_path(target))


def _pid(lock_file: Path) -> str:
    try:
        return lock_file.read_text().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def hold(target: Path, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the exclusive lock of `target` (a file or folder path) for the `with` block.

        >>> with hold(models / "smollm2-b179c9523d0e6a0f", on_wait=print):   # prints the holder's pid
        ...     build()

    wait=False raises Busy at once when another process holds it; on_wait(pid) is called once
    before blocking. OSError (read-only or missing folder) propagates: the caller decides.
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = lock_path(target)
    fd = _acquire(path, wait, on_wait)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still holding it: waiters on this inode will retry
        os.close(fd)


def _acquire(path: Path, wait: bool, on_wait) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise Busy(f"{path} is held by process {_pid(path)}") from None
                if on_wait is not None:
                    on_wait(_pid(path))
                    on_wait = None
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was unlinked by the holder we waited for: take the new one


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def leftovers(folder: Path) -> dict[str, list[Path]]:
    """Temporaries and lock files in `folder`, grouped by the name they belong to."""
    found: dict[str, list[Path]] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        m = _LEFTOVER.match(name) or _LOCK.match(name)
        if m:
            found.setdefault(m["key"], []).append(folder / name)
    return found


def sweep(folder: Path) -> list[tuple[Path, int]]:
    """Remove the temporaries in `folder` that no live process holds; return (path, bytes) removed.

        >>> sweep(models)
        [(PosixPath('.../models/.smollm2-b179c9523d0e6a0f.tmp-k2x9'), 538113262)]

    Names whose lock is held are left alone; an unwritable folder is left as it is.
    """
    removed = []
    for key, paths in leftovers(folder).items():
        try:
            with hold(folder / key, wait=False):
                for p in paths:
                    if _LOCK.match(p.name):
                        continue
                    size = tree_size(p)
                    remove(p)
                    removed.append((p, size))
        except OSError:  # Busy (a live writer) or a read-only folder
            continue
    return removed


def sweep_name(target: Path) -> None:
    """Remove `target`'s temporaries; call it while holding `hold(target)` (so all are leftovers)."""
    for p in leftovers(target.parent).get(target.name, []):
        if not _LOCK.match(p.name):
            remove(p)


def tree_size(path: Path) -> int:
    """Bytes used by a file or a folder tree (0 for what vanished meanwhile)."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


def remove(path: Path) -> None:
    """Delete a file or a folder tree; what is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
