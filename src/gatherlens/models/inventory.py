"""What the model cache holds, how big it is, and clearing it (`gatherlens cache list|clear`).

    >>> [(i.name, i.size, i.state) for i in inventory()]
    [('smollm2-b179c9523d0e6a0f', 541999168, 'ok'), ('hashes.json', 193, 'source hashes')]
    >>> clear()        # everything no live process is writing
    Cleared(removed=[...], freed=541999361, kept=[])

A folder a process is building (its lock is held) is listed as such and never removed; a
temporary folder whose lock nobody holds is what a killed conversion left.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gatherlens.models import cache, locks

__all__ = ["Item", "Cleared", "inventory", "clear"]

_TEMP = re.compile(r"^\.(?P<key>.+)\.(?:tmp|trash)-")


@dataclass
class Item:
    name: str
    path: Path
    size: int          # bytes on disk
    state: str         # "ok", "damaged: ...", "being written by process N", "left by ..."
    source: str = ""   # the file it was converted from


@dataclass
class Cleared:
    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    kept: list[tuple[Path, str]] = field(default_factory=list)   # (path, why)


def inventory(verify: bool = True) -> list[Item]:
    """Every converted model, leftover temporary and the hash sidecar in the cache.

    verify: re-hash each model folder against its manifest (as a load does).
    """
    items = []
    folder = cache.models_dir()
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _TEMP.match(p.name)
        if m:
            pid = _writer(folder / m["key"])
            state = (f"being written by process {pid}" if pid else
                     "left by an interrupted conversion (removed by the next load or `cache clear`)")
            items.append(Item(p.name, p, locks.tree_size(p), state))
        elif p.is_dir() and not p.name.startswith("."):
            bad = cache.problem(p) if verify else None
            items.append(Item(p.name, p, locks.tree_size(p), f"damaged: {bad}" if bad else "ok", _source(p)))
    sidecar = cache.cache_root() / "hashes.json"
    if sidecar.is_file():
        items.append(Item(sidecar.name, sidecar, sidecar.stat().st_size, "source hashes"))
    return items


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
    """Remove every model folder, leftover and sidecar that no live process is writing."""
    done = Cleared()
    for item in inventory(verify=False):
        key = _TEMP.match(item.name)["key"] if _TEMP.match(item.name) else item.name
        try:
            with locks.hold(item.path.parent / key, wait=False):
                locks.remove(item.path)
        except locks.Busy:
            done.kept.append((item.path, f"process {locks.holder(item.path.parent / key)} is writing it"))
            continue
        except OSError as err:
            done.kept.append((item.path, err.strerror or str(err)))
            continue
        if item.path.exists():
            done.kept.append((item.path, "could not be removed (read-only?)"))
            continue
        done.removed.append(item.path)
        done.freed += item.size
    return done
