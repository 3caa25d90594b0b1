"""What the model cache holds, how big it is, and clearing it (`gatherlens cache list|clear`).

    >>> [(i.name, i.size, i.state) for i in inventory()]
    [('smollm2-b179c9523d0e6a0f', 541999168, 'ok'), ('hashes.json', 193, 'source hashes')]
    >>> clear()        # what gatherlens made there and no live process is writing
    Cleared(removed=[...], freed=541999361, kept=[])

`clear` removes only what it can prove is its own: a model folder holding its manifest
(gatherlens-manifest.json, written last by every conversion), the temporaries and locks of its
naming rule (`.X.tmp-*`, `.X.trash-*`, `.X.lock`, see `gatherlens.models.files.locks`) and the hash
sidecar. Anything else (a user's own model folder put there, a file) is listed as not its own
and left as it is. A folder a process is building (its lock is held) is listed as such and
never removed; a temporary folder whose lock nobody holds is what a killed conversion left.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gatherlens.errors import GatherValueError
from gatherlens.models.files import cache
from gatherlens.models.files import locks

__all__ = ["Item", "Cleared", "inventory", "clear", "check_root", "FOREIGN"]

_TEMP = re.compile(r"^\.(?P<key>.+)\.(?:tmp|trash)-")
_LOCK = re.compile(r"^\.(?P<key>.+)\.lock$")
FOREIGN = f"not gatherlens' own (no {cache.MANIFEST} in it)"


@dataclass
class Item:
    name: str
    path: Path
    size: int          # bytes on disk
    state: str         # "ok", "damaged: ...", "being written by process N", "left by ...", FOREIGN...
    source: str = ""   # the file it was converted from
    own: bool = True   # made by gatherlens: `clear` may remove it


@dataclass
class Cleared:
    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    kept: list[tuple[Path, str]] = field(default_factory=list)   # (path, why)


def check_root() -> Path:
    """The cache folder, or a GatherValueError when it (or its models/ folder) is not a folder.

    >>> check_root()        # GATHERLENS_CACHE=notes.txt
    GatherValueError: the model cache 'notes.txt' is a file, not a folder: nothing is cached there ...
    """
    root = cache.cache_root()
    for path in (root, cache.models_dir()):
        if path.exists() and not path.is_dir():
            raise GatherValueError(
                f"the model cache {str(root)!r} {'is' if path == root else 'has'} a file"
                f"{'' if path == root else f' {str(path.name)!r}'} where a folder should be: nothing is "
                f"cached there (set GATHERLENS_CACHE, or XDG_CACHE_HOME, to a folder)")
    return root


def inventory(verify: bool = True) -> list[Item]:
    """Every converted model, leftover temporary, foreign entry and the hash sidecar in the cache.

    verify: re-hash each model folder against its manifest (as a load does).
    """
    check_root()
    folder = cache.models_dir()
    items = [_item(p, verify) for p in (sorted(folder.iterdir()) if folder.is_dir() else [])
             if not _LOCK.match(p.name)]
    sidecar = cache.cache_root() / "hashes.json"
    if sidecar.is_file():
        items.append(Item(sidecar.name, sidecar, sidecar.stat().st_size, "source hashes"))
    return items


def _item(p: Path, verify: bool) -> Item:
    """What one entry of models/ is: a leftover, one of gatherlens' folders, or someone else's."""
    m = _TEMP.match(p.name)
    if m:
        pid = _writer(p.parent / m["key"])
        state = (f"being written by process {pid}" if pid else
                 "left by an interrupted conversion (removed by the next load or `cache clear`)")
        return Item(p.name, p, locks.tree_size(p), state)
    if p.is_symlink() or not p.is_dir() or not (p / cache.MANIFEST).is_file():
        return Item(p.name, p, locks.tree_size(p), f"{FOREIGN}: `cache clear` leaves it", own=False)
    bad = cache.problem(p) if verify else None
    return Item(p.name, p, locks.tree_size(p), f"damaged: {bad}" if bad else "ok", _source(p))


def _writer(target: Path) -> str | None:
    """The pid holding `target`'s lock, or None when no live process holds it."""
    try:
        with locks.hold(target, wait=False):
            return None
    except locks.Busy:
        return locks.holder(target)
    except OSError:  # a read-only cache: nobody can be writing it
        return None


def _source(folder: Path) -> str:
    try:
        return str(cache.read_manifest(folder).get("source", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def clear() -> Cleared:
    """Remove what gatherlens made in the cache and no live process is writing; keep the rest."""
    done = Cleared()
    for item in inventory(verify=False):
        _clear_one(item, done)
    for path, size in cache.sweep():  # leftovers beside the sidecar, and stale lock files
        done.removed.append(path)
        done.freed += size
    return done


def _clear_one(item: Item, done: Cleared) -> None:
    key = _TEMP.match(item.name)["key"] if _TEMP.match(item.name) else item.name
    if not item.own:
        pid = _writer(item.path.parent / key)
        done.kept.append((item.path, f"process {pid} is writing it" if pid else f"{FOREIGN}; left as it is"))
        return
    try:
        with locks.hold(item.path.parent / key, wait=False):
            locks.remove(item.path)
    except locks.Busy:
        done.kept.append((item.path, f"process {locks.holder(item.path.parent / key)} is writing it"))
        return
    except OSError as err:
        done.kept.append((item.path, err.strerror or str(err)))
        return
    if item.path.exists():
        done.kept.append((item.path, "could not be removed (read-only?)"))
        return
    done.removed.append(item.path)
    done.freed += item.size
