"""The converted-model cache: one folder per source file, keyed by the file's hash.

    ~/.cache/gatherlens/models/smollm2-<sha256[:16]>/      (or $XDG_CACHE_HOME/gatherlens/...)
        config.json  model.safetensors  tokenizer.json ...  gatherlens-manifest.json

A folder is built in a temporary sibling and moved into place with os.replace, so a reader never
sees half a cache. The manifest, written last, lists every file with its size, mtime and sha256:
a folder whose files no longer match it (truncated, edited, missing) is damaged and rebuilt.
Hashing the multi-megabyte source file is memoized in a sidecar keyed by (path, size, mtime).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["cache_root", "file_sha256", "entry_dir", "is_valid", "build_atomically", "discard", "MANIFEST"]

MANIFEST = "gatherlens-manifest.json"
_SIDECAR = "hashes.json"
_CHUNK = 1 << 20


def cache_root() -> Path:
    """$XDG_CACHE_HOME/gatherlens, else ~/.cache/gatherlens (read each call, so tests can move it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gatherlens"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoized in the cache's sidecar by (path, size, mtime_ns)."""
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    sidecar = cache_root() / _SIDECAR
    try:
        known = json.loads(sidecar.read_text())
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    if isinstance(known.get(key), str):
        return known[key]
    digest = _sha256(path)
    known[key] = digest
    try:  # best effort: a read-only cache folder only costs a re-hash next time
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomically(sidecar, known)
    except OSError:
        pass
    return digest


def entry_dir(name: str, digest: str) -> Path:
    """Where the converted copy of a source file with this hash lives."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return cache_root() / "models" / f"{safe}-{digest[:16]}"


def is_valid(folder: Path) -> bool:
    """True when every file the manifest lists is there, unchanged (size and mtime, else sha256)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not files:
            return False
        for rel, meta in files.items():
            st = (folder / rel).stat()
            if st.st_size != meta["size"]:
                return False
            if st.st_mtime_ns != meta["mtime_ns"] and _sha256(folder / rel) != meta["sha256"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def build_atomically(folder: Path, fill: Callable[[Path], None], meta: dict) -> Path:
    """Fill a temporary sibling of `folder`, write its manifest, and move it into place.

    A damaged `folder` already there is moved aside and deleted. If another process finished the
    same folder first, its copy is kept.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        fill(tmp)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                st = p.stat()
                files[str(p.relative_to(tmp))] = {
                    "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(p),
                }
        _write_json_atomically(tmp / MANIFEST, {**meta, "files": files})
        if folder.exists():
            if is_valid(folder):  # someone else built it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
                return folder
            discard(folder)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not is_valid(folder):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def discard(folder: Path) -> None:
    """Move a (damaged) cache folder aside and delete it; readers never see it half-deleted."""
    if not folder.exists():
        return
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.trash-", dir=folder.parent))
    os.replace(folder, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


def _write_json_atomically(path: Path, data) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
