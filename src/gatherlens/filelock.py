"""Locks that die with their process: an exclusive `flock` on `.X.lock` beside the thing X it guards.

    >>> with hold(models / "smollm2-b179c9523d0e6a0f", on_wait=print):       # prints the holder's pid
    ...     convert()                                                        # models/.smollm2-....lock
    >>> with hold(native / "layer_ops-27721f690a4f82bc", timeout=300):       # Busy after 300 s
    ...     build()

The kernel drops a `flock` when its process ends, however it ends (kill -9 included), so a lock
that can be taken means that no live process works on X: whatever X's temporaries are left are a
dead process's. The holder writes its pid into the lock file and unlinks the file on release; a
waiter that then holds a lock on an unlinked file notices (the path's inode differs) and tries
again. Every temporary file or folder for X is `.X.tmp-*` or `.X.trash-*` beside it, created only
while holding X's lock, so the holder may remove whatever is left (`sweep_name`). Rank 0: the
model cache (`models/files/locks.py`) and the native build cache (`ops/native.py`) both lock through here.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks
    fcntl = None

__all__ = ["hold", "Busy", "holder", "lock_path", "LOCK_NAME", "temp_prefix", "trash_prefix", "leftovers",
           "sweep_name", "remove"]

LOCK_NAME = re.compile(r"^\.(?P<key>.+)\.lock$")  # the one naming rule: X's lock is `.X.lock` beside it,
_LEFTOVER = re.compile(r"^\.(?P<key>.+)\.(?:tmp|trash)-[^/]*$")  # its temporaries `.X.tmp-*`, `.X.trash-*`
POLL_S = 0.05                                      # how often a bounded wait tries again


class Busy(BlockingIOError):
    """The lock is held by another live process (at once with wait=False, or past the timeout)."""


def lock_path(target: Path) -> Path:
    """`.X.lock` beside X: `lock_path(Path("models/smollm2"))` is models/.smollm2.lock."""
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
def hold(target: Path, wait: bool = True, on_wait: Callable[[str], None] | None = None,
         timeout: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock of `target` (a file or folder path) for the `with` block.

        >>> with hold(models / "smollm2-b179c9523d0e6a0f", on_wait=print):   # prints the holder's pid
        ...     build()

    wait=False raises Busy at once when another process holds it; on_wait(pid) is called once
    before waiting; timeout (seconds) bounds the wait (Busy when it runs out; None: no bound).
    OSError (read-only or missing folder) propagates: the caller decides.
    """
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = lock_path(target)
    deadline = None if timeout is None else time.monotonic() + timeout
    fd = _acquire(path, wait, on_wait, deadline)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still holding it: waiters on this inode will retry
        os.close(fd)


def _acquire(path: Path, wait: bool, on_wait, deadline: float | None) -> int:
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
                _wait(fd, path, deadline)
            if _same_file(fd, path):
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was unlinked by the holder we waited for: take the new one


def _wait(fd: int, path: Path, deadline: float | None) -> None:
    """Block until the lock is ours; with a deadline, try every POLL_S and raise Busy past it."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Busy(f"{path} is still held by process {_pid(path)}") from None
            time.sleep(POLL_S)


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
        m = _LEFTOVER.match(name) or LOCK_NAME.match(name)
        if m:
            found.setdefault(m["key"], []).append(folder / name)
    return found


def sweep_name(target: Path) -> None:
    """Remove `target`'s temporaries; call it while holding `hold(target)` (so all are leftovers)."""
    for p in leftovers(target.parent).get(target.name, []):
        if not LOCK_NAME.match(p.name):
            remove(p)


def remove(path: Path) -> None:
    """Delete a file or a folder tree; what is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
