"""The converted-model cache: one folder per source file, keyed by the file's hash.

    $GATHERLENS_CACHE, else $XDG_CACHE_HOME/gatherlens, else ~/.cache/gatherlens:
        hashes.json                                   sha256 of source files, by (path, size, mtime)
        models/smollm2-<sha256[:16]>/                 config.json  model.safetensors  tokenizer.json ...
                                                      gatherlens-manifest.json (written last)

    >>> folder = entry_dir("smollm2", file_sha256(gguf_path))
    >>> problem(folder)          # None when every file matches the manifest, else what is wrong
    'model.safetensors does not match its recorded hash'

The manifest records every file's size and xxh3-128 hash; `problem` re-hashes every file on
each load (a damaged byte anywhere is found, whatever its modification time says). A folder is
built in a temporary sibling and moved into place with os.replace, so a reader never sees half
a cache; it is built only while holding the folder's lock (see `gatherlens.models.files.locks`), and
`sweep` removes the temporaries of killed builds.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import xxhash

from gatherlens.paths import cache_root
from gatherlens.models.files import locks

__all__ = ["cache_root", "models_dir", "file_sha256", "file_memo", "remember", "kept_path", "entry_dir", "problem", "is_valid",
           "read_manifest", "manifest_says", "build_atomically", "refresh_manifest", "discard", "sweep", "checkpoint",
           "MANIFEST", "FORMAT"]

MANIFEST = "gatherlens-manifest.json"
FORMAT = 2  # 2: xxh3-128 per file and "weights_finite"; 1 (sha256 and mtime) is still read
_SIDECAR = "hashes.json"
_CHUNK = 1 << 20


def models_dir() -> Path:
    return cache_root() / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def content_hash(path: Path) -> str:
    """xxh3-128 of a file's bytes (read through mmap; the GIL is released while hashing)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return xxhash.xxh3_128_hexdigest(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return xxhash.xxh3_128_hexdigest(m)


def file_sha256(path: Path) -> str:
    """sha256 of a source file, memoized in the cache's sidecar by (path, size, mtime_ns)."""
    known = file_memo(path, "sha256")
    if isinstance(known, str):
        return known
    digest = _sha256(Path(path).resolve())
    remember(path, "sha256", digest)
    return digest


def _memo_key(path: Path, what: str) -> str:
    """The sidecar's key of a fact about a file as it is now: its path, size and mtime_ns (a write moves
    them), and what the fact is (a sha256's key has no suffix: the sidecar of earlier versions reads on)."""
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    return key if what == "sha256" else f"{key}|{what}"


def file_memo(path: Path, what: str):
    """What `remember` recorded of this file as it is now under `what`, or None (never recorded, or the
    file changed since).

        >>> file_memo(gguf_path, "values-finite")   # True once check_gguf's scan of this file passed
    """
    return _read_json_dict(cache_root() / _SIDECAR).get(_memo_key(path, what))


def kept_path(path: Path, what: str, suffix: str) -> Path:
    """Where something made from this file as it is now is kept: $cache/<what>/<xxh3 of the memo key><suffix>,
    so each version of the file (path, size, mtime_ns) has its own, never another version's."""
    return cache_root() / what / f"{xxhash.xxh3_64_hexdigest(_memo_key(path, what).encode())}{suffix}"


def remember(path: Path, what: str, value) -> None:
    """Record `value` (JSON) under `what` for the file as it is now; best effort (a read-only cache folder
    only costs redoing the work next time)."""
    key, sidecar = _memo_key(path, what), cache_root() / _SIDECAR
    try:
        sidecar.parent.mkdir(parents=True, exist_ok=True)
        with locks.hold(sidecar, wait=True):
            known = {k: v for k, v in _read_json_dict(sidecar).items() if os.path.exists(k.split("|")[0])}
            _write_json_atomically(sidecar, {**known, key: value}, sidecar)  # gone files' facts dropped
    except OSError:
        pass


def _read_json_dict(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def entry_dir(name: str, digest: str) -> Path:
    """Where the converted copy of a source file with this hash lives."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return models_dir() / f"{safe}-{digest[:16]}"


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def manifest_says(folder: Path, key: str) -> bool:
    """True when the folder's manifest holds `key` with a true value (False if unreadable)."""
    try:
        return bool(read_manifest(folder).get(key))
    except (OSError, ValueError, AttributeError):
        return False


def problem(folder: Path) -> str | None:
    """None when every file the manifest lists is there with its recorded size and hash;
    otherwise what is wrong, in a few words ("model.safetensors is missing", ...)."""
    try:
        files = read_manifest(folder)["files"]
        if not isinstance(files, dict) or not files:
            return f"{MANIFEST} lists no files"
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    try:
        for rel, meta in files.items():  # sizes first: a cheap stat finds truncation
            size = (folder / rel).stat().st_size
            if size != meta["size"]:
                return f"{rel} has {size:,} bytes instead of {meta['size']:,}"
        for rel, meta in files.items():
            if not _hash_matches(folder / rel, meta):
                return f"{rel} does not match its recorded hash"
    except FileNotFoundError as err:
        return f"{Path(err.filename).name} is missing"
    except (OSError, KeyError, TypeError) as err:
        return f"{MANIFEST} or its files are unreadable ({type(err).__name__})"
    return None


def _hash_matches(path: Path, meta: dict) -> bool:
    if "xxh3_128" in meta:
        return content_hash(path) == meta["xxh3_128"]
    return _sha256(path) == meta["sha256"]  # format 1, until refresh_manifest rewrites it


def is_valid(folder: Path) -> bool:
    """True when the folder matches its manifest (see `problem`)."""
    return problem(folder) is None


def _file_table(folder: Path) -> dict:
    """Size and hashes of every file; mtime_ns and sha256 keep format 1 readers (older
    gatherlens versions sharing this cache) accepting the folder instead of rebuilding it."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            st = p.stat()
            files[str(p.relative_to(folder))] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                 "xxh3_128": content_hash(p), "sha256": _sha256(p)}
    return files


def build_atomically(folder: Path, fill: Callable[[Path], None], meta: dict) -> Path:
    """Fill a temporary sibling of `folder`, write its manifest, and move it into place.

    Call it while holding `locks.hold(folder)`: leftovers of killed builds are removed first,
    and a damaged `folder` already there is moved aside and deleted.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    locks.sweep_name(folder)
    tmp = Path(tempfile.mkdtemp(prefix=locks.temp_prefix(folder), dir=folder.parent))
    try:
        fill(tmp)
        checkpoint("manifest")
        _write_json_atomically(tmp / MANIFEST, {**meta, "format": FORMAT, "files": _file_table(tmp)}, tmp / MANIFEST)
        checkpoint("replace")
        discard(folder)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def refresh_manifest(folder: Path, **extra) -> bool:
    """Rewrite an older manifest with xxh3 hashes and `extra` fields; False when busy or read-only."""
    try:
        with locks.hold(folder, wait=False):
            manifest = {**read_manifest(folder), **extra, "format": FORMAT, "files": _file_table(folder)}
            _write_json_atomically(folder / MANIFEST, manifest, folder)
        return True
    except (OSError, ValueError):
        return False


def discard(folder: Path) -> None:
    """Move a (damaged) cache folder aside and delete it; readers never see it half-deleted."""
    if not folder.exists():
        return
    trash = Path(tempfile.mkdtemp(prefix=locks.trash_prefix(folder), dir=folder.parent))
    os.replace(folder, trash / "old")
    checkpoint("discard")
    shutil.rmtree(trash, ignore_errors=True)


def sweep() -> list[tuple[Path, int]]:
    """Remove what killed conversions left in the cache (when no live process holds it)."""
    return locks.sweep(cache_root()) + locks.sweep(models_dir())


def _write_json_atomically(path: Path, data, owner: Path) -> None:
    """Write JSON through a temporary `.<owner>.tmp-*` sibling of `owner`, then os.replace."""
    fd, tmp = tempfile.mkstemp(prefix=locks.temp_prefix(owner), dir=owner.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def checkpoint(point: str) -> None:
    """Fault-injection hook for tests: with GATHERLENS_FAULT_PAUSE=<point>, write this pid to
    $GATHERLENS_FAULT_MARKER and wait here until killed. Points: locked, filled-model, manifest,
    replace, discard."""
    if os.environ.get("GATHERLENS_FAULT_PAUSE") != point:
        return
    marker = os.environ.get("GATHERLENS_FAULT_MARKER")
    if marker:
        Path(marker).write_text(str(os.getpid()))
    while True:
        time.sleep(60)
