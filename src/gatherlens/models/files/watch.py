"""The file a quantized model reads in place, watched: a change under the running model is one clear
error (`ModelFileChanged`), never a crash or silent garbage.

    >>> watch = FileWatch(path)                    # before the file is mapped: what it is now
    >>> watch_model(model, watch, reader.data)     # after: the model and its mapping are watched
    >>> check_unchanged(model)                     # every generation step, every served request
    ModelFileChanged: the model file '/m/x.gguf' changed while in use (its size went from ...)

`load(..., quantized=True)` maps the GGUF file and runs from its blocks in place (no copy: that is
the point of the quantized model). A process that rewrites or truncates the file under it then
changes the weights mid-run (an overwrite: silent garbage) or pulls the pages away (a truncation:
the next read of them is a SIGBUS inside a C++ kernel, status 135, no message). A copy-on-write
mapping (mode "c") guards neither: its pages still come from the file until written to. Two parts:

- `check_unchanged`: one os.stat of the path per generation step (before the prompt and after
  every forward pass, models/runtime/generation.py) and per request of `gatherlens serve` (serve/pool.py),
  compared with the file's identity at load (device, inode, size, mtime and ctime in ns). It costs
  a few microseconds and catches every change that lands between two steps, and a step whose
  forward pass ran while the file changed is refused before its token is given out.
- A SIGBUS inside the mapping (a truncation landing *during* a forward pass, which no check between
  steps can see in time) is caught by a C handler (ops/fault/sigbus.cpp): it writes the same one
  `Error: the model file ... changed while in use` line to stderr and exits 1. A handler in Python
  cannot: it would run only between bytecodes, which the faulting thread never reaches.

An overwrite that lands during a forward pass can still change that one step's numbers; the check
after it refuses to hand out its token. Without a C++ compiler only the stat checks run.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path

from gatherlens.errors import GatherValueError

__all__ = ["ModelFileChanged", "FileWatch", "watch_model", "watch_of", "check_unchanged", "changed_message",
           "file_identity"]

_WATCHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> its FileWatch
CUT_SHORT = "it was cut short while the model read it"


class ModelFileChanged(GatherValueError):
    """The model file was changed, replaced or removed while a model ran from it.

        >>> raise ModelFileChanged(Path("m.gguf"), "it was removed")
        ModelFileChanged: the model file 'm.gguf' changed while in use (it was removed); ...
    """

    def __init__(self, path: Path, how: str):
        super().__init__(changed_message(path, how))
        self.path, self.how = Path(path), how


def changed_message(path: Path, how: str) -> str:
    """The one message of a changed model file (the C handler's line says it too).

        >>> changed_message(Path("m.gguf"), "it was removed")
        "the model file 'm.gguf' changed while in use (it was removed); ..."
    """
    return (f"the model file {str(path)!r} changed while in use ({how}); nothing more was read from it: "
            f"run again once the file is complete")


def file_identity(path: Path) -> tuple[int, int, int, int, int] | None:
    """(device, inode, size, mtime_ns, ctime_ns) of `path`; None when it is gone or unreadable."""
    try:
        s = os.stat(path)
    except OSError:
        return None
    return s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns


@dataclass
class FileWatch:
    """What a model file was at load, and how it differs now.

        >>> FileWatch(Path("m.gguf")).changed()        # None: as it was
    """

    path: Path
    identity: tuple | None = None
    slot: int | None = None          # its SIGBUS guard (ops/fault), None when unguarded

    def __post_init__(self):
        self.path = Path(self.path)
        if self.identity is None:
            self.identity = file_identity(self.path)

    def changed(self) -> str | None:
        """How the file differs from what it was (in words), or None when it is the same."""
        now = file_identity(self.path)
        if now == self.identity:
            return None
        if now is None:
            return "it was removed or cannot be read"
        if now[:2] != self.identity[:2]:
            return "another file was put in its place"
        if now[2] != self.identity[2]:
            return f"its size went from {self.identity[2]:,} to {now[2]:,} bytes"
        return "it was rewritten"

    def check(self) -> None:
        """Raise ModelFileChanged when the file is not what it was."""
        how = self.changed()
        if how is not None:
            raise ModelFileChanged(self.path, how)


def watch_model(model, watch: FileWatch, mapping) -> FileWatch:
    """Watch `model`, which reads `mapping` (the file's numpy memmap) in place: check_unchanged(model)
    compares the file with `watch`, and a SIGBUS inside the mapping is one line and exit 1.

        >>> watch_model(model, FileWatch(path), reader.data)
    """
    from gatherlens.ops.fault import guard_mapping, unguard_mapping

    line = f"Error: {changed_message(watch.path, CUT_SHORT)}\n"
    watch.slot = guard_mapping(mapping.__array_interface__["data"][0], mapping.nbytes, line)
    if watch.slot is not None:
        weakref.finalize(model, unguard_mapping, watch.slot)   # the mapping lives as long as the model
    _WATCHED[model] = watch
    return watch


def watch_of(model) -> FileWatch | None:
    """The FileWatch of a model that runs from its file in place, else None.

        >>> watch_of(load("smollm2", quantized=True).model).path.name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    return _WATCHED.get(model)


def check_unchanged(model) -> None:
    """ModelFileChanged when `model` runs from a file that changed since it was loaded; else nothing
    (a model that holds its weights in memory is never watched).

        >>> check_unchanged(lm.model)
    """
    watch = _WATCHED.get(model)
    if watch is not None:
        watch.check()
