"""The user's output paths: one rule for every file or folder a command writes, checked before
any slow work starts and checked again when the output is written.

    >>> pages = output_file("pages.svg", "--pages", suffixes=(".svg", ".html"))  # before the model loads
    >>> write_output(pages, svg, "--pages")                   # at the end: exclusive create
    >>> folder = output_dir("pics", "--out", force=False)     # missing or empty (or --force)
    PosixPath('pics')

The rule, in one place:
- a file: one of `suffixes` (when given); not a folder; no file on the way to it; its folder
  exists; not there yet unless `force`; writable;
- a folder: no file on the way to it; missing or empty unless `force`; writable.
"Writable" is a probe file created (and removed) where the output will go: the one test that a
read-only mount, a folder without write permission and a missing parent all fail the same way,
for root too. A late write (`open_output`, `write_output`) checks the path again and writes a
temporary file beside the target (`.gatherlens-tmp-PID-…`), which becomes the target at the end:
without `force` by `os.link`, which refuses a target that appeared since the first check (it is
kept, never overwritten), with `force` by a rename over it. A reader never sees half a file, and a
killed run leaves no target, only its temporary file, which the next check of that folder removes
(its process is gone). Errors are GatherValueError naming the option and the path.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from gatherlens.errors import GatherValueError

__all__ = ["output_file", "output_dir", "open_output", "write_output", "writable_file", "writable_dir",
           "pictures_dir", "clean_stale_temps", "output_folder", "write_new", "TEMP_PREFIX"]

TEMP_PREFIX = ".gatherlens-tmp-"   # + pid-hex-name: a late write's temporary file, beside its target
# this module's temporary files: today's, and the ".name.pid-hex.tmp" of earlier versions
_TEMP_NAME = re.compile(r"\.gatherlens-tmp-(?P<pid>[0-9]+)-[0-9a-f]{8}-|\..+\.(?P<old>[0-9]+)-[0-9a-f]{8}\.tmp$")
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV}
_CLEANED: set[str] = set()         # folders already cleaned by this process


def output_file(path: str | os.PathLike, what: str, *, force: bool = False,
                suffixes: tuple[str, ...] = ()) -> Path:
    """`path` as a Path when a new file (or with `force` a replaced one) can be written there.

    >>> output_file("pages.png", "--pages", suffixes=(".svg", ".html"))
    GatherValueError: --pages 'pages.png' must end in .svg or .html
    """
    p = Path(path).expanduser()
    if suffixes and p.suffix.lower() not in suffixes:
        raise GatherValueError(f"{what} {str(p)!r} must end in {' or '.join(suffixes)}")
    _check_file_path(p, what)
    clean_stale_temps(p.parent)
    if p.exists() and not force:
        raise GatherValueError(f"{what} {str(p)!r} exists; pass --force to overwrite it")
    return writable_file(p, what)


def output_dir(path: str | os.PathLike, what: str, *, force: bool = False) -> Path:
    """`path` as a Path when files can be written into it: missing (made later), empty, or `force`.

    >>> output_dir("notes.txt/report", "--out")
    GatherValueError: --out 'notes.txt/report' cannot be a folder: 'notes.txt' is a file
    """
    p = writable_dir(path, what)
    for folder in (p, p.parent):   # a killed run's temporaries: inside (files), beside (output_folder's)
        if folder.is_dir():
            clean_stale_temps(folder)
    present = sorted(e.name for e in p.iterdir()) if p.is_dir() else []
    if present and not force:
        shown = ", ".join(present[:5]) + (", …" if len(present) > 5 else "")
        raise GatherValueError(f"{what} {str(p)!r} is not empty; pass --force to write into it (files of the "
                               f"same names are replaced), or choose another folder. It holds "
                               f"{len(present)} entries: {shown}")
    return p


@contextlib.contextmanager
def open_output(path: str | os.PathLike, what: str, *, force: bool = False,
                binary: bool = False) -> Iterator[IO]:
    """`with open_output(path, "--pages") as fh: fh.write(...)`: the late write, checked again.

    The block writes a temporary file beside the target (TEMP_PREFIX, this process's id), which
    becomes the target when the block ends: without force by a hard link that refuses an
    existing target (a file that appeared meanwhile is refused and kept), with force by a rename
    over it. A failure, or a kill, never leaves a half-written target; a killed run's temporary
    file is removed by the next output check in that folder.
    """
    p = Path(path).expanduser()
    _check_file_path(p, what)
    clean_stale_temps(p.parent)
    if not force and p.exists():
        raise _made_meanwhile(p, what)
    mode, kw = ("b", {}) if binary else ("", {"encoding": "utf-8"})
    tmp = p.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{p.name[:120]}")
    with _removed_on_failure(tmp):
        try:
            with open(tmp, "x" + mode, **kw) as fh:
                yield fh
        except OSError as err:   # a full disk fails a write, which names no file: name the target
            if err.filename is None:
                raise OSError(err.errno, err.strerror, str(p)) from None
            raise
        _publish(tmp, p, what, force)


def _publish(tmp: Path, p: Path, what: str, force: bool) -> None:
    """Make the written temporary file `tmp` the target `p` (see open_output)."""
    if force:
        os.replace(tmp, p)
        return
    try:
        os.link(tmp, p)                      # atomic, and refuses an existing target
    except FileExistsError:
        raise _made_meanwhile(p, what) from None
    except OSError as err:
        if err.errno not in _NO_LINKS:
            raise
        try:                                 # a file system without hard links: claim the name, then rename
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            raise _made_meanwhile(p, what) from None
        os.replace(tmp, p)
        return
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _made_meanwhile(p: Path, what: str) -> GatherValueError:
    return GatherValueError(f"{what} {str(p)!r} was created meanwhile (after the check at the start); "
                            f"it is kept: pass --force to overwrite it")


def clean_stale_temps(folder: str | os.PathLike) -> list[str]:
    """Remove the temporary output files in `folder` whose process is gone (a killed run's); once
    per folder and process. Returns the names removed. Only names this module makes are touched."""
    key = os.path.abspath(folder)
    if key in _CLEANED:
        return []
    _CLEANED.add(key)
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_NAME.match(entry.name)
        if not m or _alive(int(m["pid"] or m["old"])) or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(entry.path) if entry.is_dir() else os.unlink(entry.path)
            removed.append(entry.name)
    return removed


@contextlib.contextmanager
def output_folder(path: str | os.PathLike, what: str, *, force: bool = False,
                  owned=lambda name: True) -> Iterator[Path]:
    """`with output_folder("report", "--out", force=True, owned=REPORT_FILES.match) as tmp:` write every
    file into `tmp`; the folder `path` gets them only when the block ends, complete.

    `tmp` is a new hidden folder beside `path` (TEMP_PREFIX, this process's id). At the end it becomes
    `path` by one rename when `path` is missing or empty; a folder that filled meanwhile is refused
    (kept) without `force`. With `force`, the files of `path` that `owned(name)` calls its own (an
    earlier run's) go and the new ones come in by renames, the user's other files stay; until the
    block ends the earlier output is untouched. A failure (Ctrl-C, a full disk) removes `tmp`; a
    killed run's `tmp` is removed by the next output check there (its process is gone).
    """
    p = Path(path).expanduser()
    p = p.resolve() if p.is_symlink() else p   # a link to a folder: the folder it names
    tmp = p.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-{p.name[:120]}")
    os.mkdir(tmp)
    try:
        yield tmp
        _swap_in(tmp, p, what, force, owned)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)


def write_new(path: str | os.PathLike, data: str | bytes, shown: str | os.PathLike | None = None) -> Path:
    """Write `data` (text as UTF-8, or bytes) to the new file `path` (in an output_folder's `tmp`); an
    OSError names `shown` (the user's path the file becomes, not the temporary one), else `path` where
    the system named no file (a full disk fails the write, not the open)."""
    p = Path(path)
    try:
        with open(p, "xb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as err:
        if shown is not None or err.filename is None:
            raise OSError(err.errno, err.strerror, str(shown or p)) from None
        raise
    return p


def _swap_in(tmp: Path, p: Path, what: str, force: bool, owned) -> None:
    """Make the written folder `tmp` the output folder `p` (see output_folder)."""
    with contextlib.suppress(OSError):
        os.rmdir(p)                            # an empty folder (ours from the check, or the user's) goes
    if not p.exists():
        try:
            os.rename(tmp, p)
            return
        except OSError as err:                 # filled meanwhile: as below
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    if not p.is_dir():
        raise GatherValueError(f"{what} {str(p)!r} cannot be a folder: a file was put there meanwhile")
    if not force:
        raise _made_meanwhile(p, what)
    trash = p.with_name(f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}-old-{p.name[:120]}")
    os.mkdir(trash)
    try:
        for entry in os.scandir(p):            # the earlier output's files, out of the way
            if owned(entry.name) and entry.is_file(follow_symlinks=False):
                os.rename(entry.path, trash / entry.name)
        for entry in os.scandir(tmp):          # the new ones in
            os.rename(entry.path, p / entry.name)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(trash)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (on this machine); True when it cannot be told."""
    if pid == os.getpid() or os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def write_output(path: str | os.PathLike, data: str | bytes, what: str, *, force: bool = False) -> Path:
    """Write `data` (text as UTF-8, or bytes) to `path` by `open_output`'s rule; returns the path."""
    with open_output(path, what, force=force, binary=isinstance(data, bytes)) as fh:
        fh.write(data)
    return Path(path).expanduser()


def writable_file(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path when a file can be written there (its folder must exist; it may exist).

    >>> writable_file("/proc/x.svg", "-o/--out")
    GatherValueError: -o/--out '/proc/x.svg' cannot be written (No such file or directory when ...
    """
    p = Path(path).expanduser()
    _check_file_path(p, what)
    _probe(p.parent, p, what)
    if p.exists() and not os.access(p, os.W_OK):
        raise GatherValueError(f"{what} {str(p)!r} exists and is not writable")
    return p


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path when files can be written into it (it is created later if missing).

    >>> writable_dir("notes.txt/report", "--out")
    GatherValueError: --out 'notes.txt/report' cannot be a folder: 'notes.txt' is a file
    """
    p = Path(path).expanduser()
    _nowhere(p, what)
    blocker = _file_on_the_way(p)
    if blocker is not None:
        raise GatherValueError(f"{what} {str(p)!r} cannot be a folder: {str(blocker)!r} is a file")
    existing = next(a for a in (p, *p.parents) if a.exists())
    _probe(existing, p, what)
    return p


def pictures_dir(path: str | os.PathLike, what: str, force: bool) -> Path:
    """`output_dir` under its earlier name: a folder for pictures, one holding files only with `force`."""
    return output_dir(path, what, force=force)


def _nowhere(p: Path, what: str) -> None:
    """A symbolic link at `p` that leads nowhere (a loop, a missing target) is refused: writing through
    it would fail late (a loop) or create a file the user did not name (a dangling link's target)."""
    if p.is_symlink() and not p.exists():
        raise GatherValueError(f"{what} {str(p)!r} is a symbolic link that leads nowhere (a loop, or a target that "
                               f"does not exist); give a plain path")


def _check_file_path(p: Path, what: str) -> None:
    """A file can go at `p`: it is not a folder, nothing on the way is a file, its folder exists."""
    _nowhere(p, what)
    if p.is_dir():
        raise GatherValueError(f"{what} {str(p)!r} is a folder; give a file path")
    blocker = _file_on_the_way(p.parent)
    if blocker is not None:
        raise GatherValueError(f"{what} {str(p)!r} cannot be written: {str(blocker)!r} is a file, not a folder")
    if not p.parent.exists():
        raise GatherValueError(f"{what} {str(p)!r} cannot be written: folder {str(p.parent)!r} does not exist")


@contextlib.contextmanager
def _removed_on_failure(p: Path) -> Iterator[None]:
    """Remove `p` (a file this module created) when the block fails."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            p.unlink()
        raise


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
