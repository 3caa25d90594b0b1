"""Locks that die with their process, and the sweep that removes what killed processes left.

    >>> with hold(cache_dir / "smollm2-b179c9523d0e6a0f"):    # models/.smollm2-b179c9523d0e6a0f.lock
    ...     build_it()                                          # writes only .smollm2-....tmp-* siblings
    >>> sweep(cache_dir)                                        # removes leftovers nobody holds

Rule: every temporary file or folder for a name X in a folder is `.X.tmp-*` or `.X.trash-*`,
and it is created only while holding `.X.lock` (an exclusive `flock`). The kernel drops a
`flock` when its process ends, however it ends (kill -9 included), so a lock that can be taken
without waiting means that no live process is writing X's temporaries: they are leftovers and
are removed. The lock and the naming rule (`hold`, `Busy`, `holder`, `lock_path`, `temp_prefix`,
`trash_prefix`, `leftovers`, `sweep_name`, `remove`) live in `gatherlens.filelock` (rank 0), shared
with the native build cache (`ops/native.py`); this module adds the model cache's sweep and sizes.
"""
from __future__ import annotations

from pathlib import Path

from gatherlens.filelock import (LOCK_NAME, Busy, hold, holder, leftovers, lock_path, remove, sweep_name,
                                 temp_prefix, trash_prefix)

__all__ = ["hold", "Busy", "holder", "lock_path", "sweep", "sweep_name", "leftovers", "temp_prefix",
           "trash_prefix", "tree_size", "remove"]


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
                    if LOCK_NAME.match(p.name):
                        continue
                    size = tree_size(p)
                    remove(p)
                    removed.append((p, size))
        except OSError:  # Busy (a live writer) or a read-only folder
            continue
    return removed


def tree_size(path: Path) -> int:
    """Bytes used by a file or a folder tree (0 for what vanished meanwhile)."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0
