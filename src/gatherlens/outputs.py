"""The user's output paths, checked writable before any slow work starts.

    >>> out = writable_file("figs/pick.png", "-o/--out")      # before the model loads
    >>> writable_dir("report", "--out")                         # may not exist yet
    PosixPath('report')

A check creates (and removes) a probe file where the output will go: that is the one test a
read-only mount, a folder without write permission, a path under a file and a missing parent
all fail the same way, for root too. Errors are GatherValueError naming the option and path.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from gatherlens.errors import GatherValueError

__all__ = ["writable_file", "writable_dir", "pictures_dir"]


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path when a file can be written there (its folder must exist).

    >>> writable_file("/proc/x.svg", "-o/--out")
    GatherValueError: -o/--out '/proc/x.svg' cannot be written (No such file or directory when ...
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise GatherValueError(f"{what} {str(p)!r} is a folder; give a file path")
    parent = p.parent
    if parent.exists() and not parent.is_dir():
        raise GatherValueError(f"{what} {str(p)!r} cannot be written: {str(parent)!r} is a file, not a folder")
    if not parent.exists():
        blocker = _file_on_the_way(parent)
        if blocker is not None:
            raise GatherValueError(f"{what} {str(p)!r} cannot be written: {str(blocker)!r} is a file, "
                                   f"not a folder")
        raise GatherValueError(f"{what} {str(p)!r} cannot be written: folder {str(parent)!r} does not exist")
    _probe(parent, p, what)
    if p.exists() and not os.access(p, os.W_OK):
        raise GatherValueError(f"{what} {str(p)!r} exists and is not writable")
    return p


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path when files can be written into it (it is created later if missing).

    >>> writable_dir("notes.txt/report", "--out")
    GatherValueError: --out 'notes.txt/report' cannot be a folder: 'notes.txt' is a file
    """
    p = Path(path).expanduser()
    blocker = _file_on_the_way(p)
    if blocker is not None:
        raise GatherValueError(f"{what} {str(p)!r} cannot be a folder: {str(blocker)!r} is a file")
    existing = next(a for a in (p, *p.parents) if a.exists())
    _probe(existing, p, what)
    return p


def pictures_dir(path: str | os.PathLike, what: str, force: bool) -> Path:
    """`writable_dir`, and a folder that already holds files only with `force` (its pictures
    would be replaced)."""
    p = writable_dir(path, what)
    if p.is_dir() and any(p.iterdir()) and not force:
        raise GatherValueError(f"{what} {str(p)!r} is not empty; pass --force to replace its pictures")
    return p


def _file_on_the_way(p: Path) -> Path | None:
    """The first path component of `p` that exists and is not a folder, if any."""
    for a in reversed((p, *p.parents)):
        if a.exists() and not a.is_dir():
            return a
        if not a.exists():
            return None
    return None


def _probe(folder: Path, target: Path, what: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".gatherlens-probe-", dir=folder)
    except OSError as err:
        raise GatherValueError(f"{what} {str(target)!r} cannot be written ({err.strerror or err} when "
                               f"creating a file in {str(folder)!r})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
