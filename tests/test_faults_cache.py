"""Fault injection in the model cache: kill -9 at each point of a conversion, two conversions at
once, damaged and truncated cached files, read-only and full disks, `cache list` / `cache clear`
beside a user's own files.

Each test's docstring says what must hold afterwards. The GGUF conversion is replaced by a tiny
random Llama (tests/fault_worker.py), so every path from the lock to os.replace is the real one
while a conversion costs milliseconds. Processes that are killed or run side by side are real
subprocesses (the fork server); read-only disks are simulated (as root, permissions are moot):
os.open and os.mkdir raise EROFS under a folder, or a named point of the conversion raises ENOSPC.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import fault_worker  # noqa: E402
from fault_helpers import (  # noqa: E402
    conversions, gatherlens_warnings, leftovers, on_small_disk, read_only, run, wait_for, with_file_limit)
from fault_helpers import converts, forks, gguf, root  # noqa: E402,F401,F811 - fixtures, found by name

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import load  # noqa: E402
from gatherlens.models import loading  # noqa: E402
from gatherlens.models.files import cache as mcache  # noqa: E402


# -- kill -9 in the middle of a conversion ------------------------------------------------------
KILL_POINTS = {
    "locked": "the lock is taken, nothing is written yet",
    "filled-model": "the weights are in the temporary folder, the tokenizer is not",
    "manifest": "every file is written, the manifest is not",
    "replace": "the manifest is written, the folder is not moved into place yet",
    "discard": "a rebuild moved the old copy aside and has not deleted it",
}


def test_kill_9_at_each_point_of_a_conversion(tmp_path, gguf, converts, forks, monkeypatch):
    """Must hold after kill -9 at any point: while the killed process lived its files were left
    alone; the next load removes every leftover (temporary folder, trash, lock file), converts
    once and leaves a sound cache that a third load reads without converting."""
    caches = {point: tmp_path / point / "cache" for point in KILL_POINTS}
    monkeypatch.setenv("GATHERLENS_CACHE", str(caches["discard"]))
    load(str(gguf))  # the copy the "discard" process's rebuild moves aside
    pids = {point: forks.start(gguf, cache, rebuild=point == "discard", pause=point)
            for point, cache in caches.items()}
    for point in KILL_POINTS:
        wait_for(caches[point].parent / "paused", f"the process paused at {point!r}")
    for point, cache in caches.items():  # live writers: the sweep must not touch their files
        monkeypatch.setenv("GATHERLENS_CACHE", str(cache))
        before = leftovers(cache)
        assert before, f"{point}: {KILL_POINTS[point]}, so something should be in progress"
        assert mcache.sweep() == [] and leftovers(cache) == before, point
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    for point, cache in caches.items():
        monkeypatch.setenv("GATHERLENS_CACHE", str(cache))
        n = len(converts)
        lm = _load_when_dead(gguf, pids[point])
        assert not lm.from_cache and len(converts) == n + 1, point
        assert leftovers(cache) == [], (point, leftovers(cache))
        assert mcache.is_valid(lm.cache_dir) and [p.name for p in (cache / "models").iterdir()] == [lm.cache_dir.name]
        assert load(str(gguf)).from_cache and len(converts) == n + 1, point


def _load_when_dead(gguf: Path, pid: int):
    """Load once the killed process is gone (its lock is released when it exits)."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/status").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text():
        assert time.monotonic() < deadline, f"process {pid} survived kill -9"
        time.sleep(0.02)
    return load(str(gguf))


def test_two_processes_converting_at_once_convert_once(tmp_path, gguf, forks, monkeypatch):
    """Must hold: while one process converts, a second one waits for it (it says so) instead of
    converting too; it then reads the first one's copy. One conversion in all, both models
    sound, nothing left behind."""
    cache = tmp_path / "cache"
    release = tmp_path / "release"
    first = forks.start(gguf, cache, FAULT_CONVERT_UNTIL=release)
    wait_for(cache.parent / "count", "the first conversion to start")
    second = forks.start(gguf, cache, FAULT_LOG=tmp_path / "second.log")
    wait_for(tmp_path / "second.log", "the second process to wait")
    assert f"waiting for process {first}" in (tmp_path / "second.log").read_text()
    release.touch()
    out = [forks.result(first), forks.result(second)]
    assert [o["from_cache"] for o in out] == [False, True] and conversions(cache) == 1
    assert out[0]["cache_dir"] == out[1]["cache_dir"] and mcache.is_valid(Path(out[0]["cache_dir"]))
    assert leftovers(cache) == []


# -- damaged and truncated cache files -----------------------------------------------------------
def _flip_one_byte_keep_mtime(folder):
    f = folder / "model.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(st.st_size // 2)
        b = fh.read(1)
        fh.seek(st.st_size // 2)
        fh.write(bytes([b[0] ^ 0x40]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # a bad disk or a sync tool: mtime as it was
    return "model.safetensors does not match its recorded hash"


def _truncate_weights(folder):
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    return "model.safetensors has 1,000 bytes instead of"


def _garbage_tokenizer(folder):
    f = folder / "tokenizer.json"
    f.write_bytes(b"\0" * f.stat().st_size)
    return "tokenizer.json does not match its recorded hash"


def _delete_config(folder):
    (folder / "config.json").unlink()
    return "config.json is missing"


def _manifest_unreadable(folder):
    (folder / mcache.MANIFEST).write_text("{half a manif")
    return f"{mcache.MANIFEST} is unreadable"


def _nan_in_an_old_format_cache(folder):
    """NaN weights under a format-1 manifest that matches them (a cache from before the check)."""
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    tensors = load_file(f)
    tensors["model.norm.weight"][3] = float("nan")
    save_file(tensors, f, metadata={"format": "pt"})
    files = {}
    for p in folder.iterdir():
        if p.name != mcache.MANIFEST:
            files[p.name] = {"size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns, "sha256": mcache._sha256(p)}
    (folder / mcache.MANIFEST).write_text(json.dumps({"format": 1, "files": files}))
    return "tensor 'model.norm.weight' holds 1 non-finite value (first at (3,): nan)"


@pytest.mark.parametrize("damage", [_flip_one_byte_keep_mtime, _truncate_weights, _garbage_tokenizer,
                                    _delete_config, _manifest_unreadable, _nan_in_an_old_format_cache],
                         ids=lambda f: f.__name__.strip("_"))
def test_damaged_cache_is_reported_once_and_rebuilt(root, gguf, converts, damage):
    """Must hold: one warning that names the damaged file; the model is converted again (never
    read from the damaged bytes: its weights equal a sound conversion's); the cache is sound."""
    folder = load(str(gguf)).cache_dir
    expected = damage(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load(str(gguf))
    said = gatherlens_warnings(caught)
    assert len(said) == 1 and "damaged" in said[0] and expected in said[0], said
    assert not lm.from_cache and len(converts) == 2 and mcache.is_valid(folder)
    sound = fault_worker.tiny_model().state_dict()
    assert all(torch.equal(v, sound[k]) for k, v in lm.model.state_dict().items())
    assert load(str(gguf)).from_cache and leftovers(root) == []


def test_a_conversion_giving_nan_fails_clearly_and_caches_nothing(root, gguf, monkeypatch):
    """Must hold: a source whose weights come out NaN is an error naming the tensor; nothing is
    cached and nothing is left behind."""
    def convert(path, say):
        model = fault_worker.tiny_model()
        with torch.no_grad():
            model.lm_head.weight[5, 7] = float("inf")
        return model, fault_worker.tokenizer()

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    with pytest.raises(GatherValueError, match=r"damaged weights: tensor '(lm_head|model.embed_tokens).weight' "
                                               r"holds 1 non-finite value \(first at \(5, 7\): inf\)"):
        load(str(gguf))
    assert not any((root / "models").iterdir()) and leftovers(root) == []


def test_truncated_gguf_is_a_clear_error_and_leaves_nothing(root, tmp_path):
    """Must hold: a truncated GGUF (a partial download or copy) is one error naming the file;
    nothing is cached, no temporary folder or lock file is left."""
    from gatherlens.models import resolve

    path = tmp_path / "partial.gguf"
    with open(resolve("smollm2").path, "rb") as f:
        path.write_bytes(f.read(1_000_000))
    with pytest.raises(GatherValueError, match=r"partial.gguf' could not be read \(damaged or truncated\?\)"):
        load(str(path))
    assert not any((root / "models").iterdir()) and leftovers(root) == []


def test_read_only_cache_warns_once_and_still_loads(root, gguf, converts, monkeypatch):
    """Must hold: one warning saying the model will be converted on every run and how to fix it
    (GATHERLENS_CACHE); the model loads; nothing is written in the cache."""
    root.mkdir()
    read_only(monkeypatch, root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load(str(gguf))
    said = gatherlens_warnings(caught)
    assert len(said) == 1, said
    assert "is not writable (Read-only file system)" in said[0] and "converted again on every run" in said[0]
    assert "GATHERLENS_CACHE" in said[0]
    assert lm.cache_dir is None and not lm.from_cache and list(root.iterdir()) == []


def test_read_only_cache_with_a_sound_copy_reads_it_silently(root, gguf, converts, monkeypatch):
    """Must hold: a read-only cache that already holds a sound copy is read (no conversion, no warning)."""
    load(str(gguf))
    read_only(monkeypatch, root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load(str(gguf))
    assert lm.from_cache and len(converts) == 1 and gatherlens_warnings(caught) == []


def test_full_disk_while_saving_warns_and_leaves_nothing(root, gguf, converts, monkeypatch):
    """Must hold: ENOSPC half-way through saving gives one warning and a usable in-memory model;
    the half-written temporary folder is gone; the next load (disk freed) caches normally."""
    def disk_full(point):
        if point == "filled-model":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(mcache, "checkpoint", disk_full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load(str(gguf))
    said = gatherlens_warnings(caught)
    assert len(said) == 1 and "No space left on device" in said[0] and "GATHERLENS_CACHE" in said[0]
    assert lm.cache_dir is None and lm.model(torch.tensor([[101, 7, 8]])).logits.isfinite().all()
    assert list((root / "models").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("GATHERLENS_CACHE", str(root))
    monkeypatch.setattr(loading, "_convert_gguf", lambda p, say: (fault_worker.tiny_model(), fault_worker.tokenizer()))
    assert mcache.is_valid(load(str(gguf)).cache_dir) and leftovers(root) == []


CONVERT_ON_A_FULL_DISK = """
import json, os, pathlib, sys, warnings
sys.path.insert(0, sys.argv[1])
import fault_worker
from gatherlens.models import load, loading
cache = pathlib.Path(os.environ.get("SMALL_DISK") or sys.argv[3]) / "cache"
os.environ["GATHERLENS_CACHE"] = str(cache)
loading._convert_gguf = fault_worker.fake_convert
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lm = load(sys.argv[2])
import torch
finite = bool(lm.model(torch.tensor([[101, 7, 8]])).logits.isfinite().all())
left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []
print(json.dumps({"said": [str(w.message) for w in caught], "finite": finite, "cache_dir": str(lm.cache_dir),
                  "left": left}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["tmpfs", "ulimit"])
def test_a_real_full_disk_or_file_limit_while_converting_warns_and_runs(tmp_path, gguf, how):
    """Must hold, on a real 1 MiB tmpfs (No space left on device) or under `ulimit -f` 1 MB (File
    too large): the conversion's save fails inside safetensors (its own error type), and the user
    sees the one warning naming the file that did not fit; the run goes on with the model in
    memory; the cache holds no temporary folder or half file. (Before issue 40: an internal error,
    `SafetensorError ... os error 28/27`; the fault test only simulated an OSError.)"""
    args = (str(Path(__file__).parent), str(gguf))
    if how == "tmpfs":
        seen = on_small_disk(CONVERT_ON_A_FULL_DISK, 1024, tmp_path / "disk", *args)
        reason = "No space left on device"
    else:
        out = subprocess.run([sys.executable, "-c", CONVERT_ON_A_FULL_DISK, *args, str(tmp_path)],
                             capture_output=True, text=True, timeout=600, preexec_fn=with_file_limit(1 << 20))
        assert out.returncode == 0, out.stderr[-3000:]
        seen, reason = json.loads(out.stdout.strip().splitlines()[-1]), "File too large"
    said = [s for s in seen["said"] if "model cache" in s]
    assert len(said) == 1 and f"could not hold the converted model ({reason} writing '" in said[0], seen["said"]
    assert "model.safetensors'" in said[0] and "converted again on every run" in said[0], said
    assert seen["finite"] and seen["cache_dir"] == "None", seen
    assert [p for p in seen["left"] if p not in ("models", "hashes.json")] == [], seen["left"]


def test_unwritable_cache_is_one_warning_line_in_the_cli(root, gguf, converts, tmp_path, monkeypatch):
    """Must hold: the CLI shows the unwritable-cache warning as one `warning:` line, then works."""
    root.mkdir()
    read_only(monkeypatch, root)
    result = run("explain", "The cat sat", "--model", str(gguf), "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    said = [ln for ln in result.output.splitlines() if "not writable" in ln]
    assert len(said) == 1 and said[0].startswith("warning: the model cache"), result.output
    assert "UserWarning" not in result.output and "GatherLensWarning" not in result.output


def test_cache_list_shows_sizes_and_clear_keeps_what_a_live_process_writes(root, gguf, converts):
    """Must hold: `cache list` shows each converted model with its size and state and a killed
    conversion's leftover as such; `cache clear` removes everything no live process is writing,
    says how much it freed, and keeps (and names) what a live process holds."""
    from gatherlens.models.files import locks

    folder = load(str(gguf)).cache_dir
    leftover = root / "models" / f".{folder.name}.tmp-killed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"\0" * 5000)
    listing = run("cache", "list").output
    assert f"{folder.name}: ok" in listing and "interrupted conversion" in listing
    assert "4.9 KiB  .tiny-" in listing and "MiB  in all" in listing and str(root) in listing
    busy = root / "models" / "other-0123456789abcdef"
    busy.mkdir()
    with locks.hold(busy):  # another process building "other": its lock is held
        result = run("cache", "clear")
    assert result.exit_code == 0 and "removed 3 entries" in result.output, result.output
    assert "kept other-0123456789abcdef: process" in result.output
    assert sorted(p.name for p in (root / "models").iterdir()) == ["other-0123456789abcdef"]
    assert not (root / "hashes.json").exists()


def _cache_with_a_users_folder(root: Path, gguf: Path) -> dict:
    """A converted model, a killed conversion's leftovers, and what a user put under models/."""
    folder = load(str(gguf)).cache_dir
    mine = root / "models" / "my-llama"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text('{"model_type": "llama"}')
    (mine / "model.safetensors").write_bytes(b"\1" * 3000)
    outside = root.parent / "elsewhere"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"\2" * 100)
    (root / "models" / "linked").symlink_to(outside)
    (root / "models" / "notes.txt").write_text("mine")
    (root / "models" / ".my-llama.backup").write_text("mine too")
    (root / "models" / ".gone-0123456789abcdef.lock").write_text("12345\n")       # a killed holder's lock
    (root / "models" / ".gone-0123456789abcdef.tmp-x1").mkdir()
    return {"folder": folder, "mine": mine, "outside": outside}


def test_cache_clear_removes_only_what_is_its_own(root, gguf, converts):
    """Must hold: `cache list` shows a user's folder (and file, link) as not gatherlens' own;
    `cache clear` removes the converted model, leftovers, stale lock and sidecar, says it left
    each of the user's entries, and leaves them byte for byte (a link and its target too)."""
    made = _cache_with_a_users_folder(root, gguf)
    listing = run("cache", "list")
    assert listing.exit_code == 0 and f"{made['folder'].name}: ok" in listing.output
    for name in ("my-llama", "linked", "notes.txt"):
        assert f"{name}: not gatherlens' own (no gatherlens-manifest.json in it): `cache clear` leaves it" \
            in listing.output, listing.output
    result = run("cache", "clear")
    assert result.exit_code == 0 and "removed 3 entries" in result.output, result.output
    for name in ("my-llama", "linked", "notes.txt", ".my-llama.backup"):
        assert f"kept {name}: not gatherlens' own" in result.output, result.output
    assert sorted(p.name for p in (root / "models").iterdir()) == [".my-llama.backup", "linked", "my-llama",
                                                                   "notes.txt"]
    assert (made["mine"] / "model.safetensors").read_bytes() == b"\1" * 3000
    assert (root / "models" / "linked" / "weights.bin").read_bytes() == b"\2" * 100
    assert not (root / "hashes.json").exists() and leftovers(root) == ["models/.my-llama.backup"]


@pytest.mark.parametrize("where", ["root", "models"])
def test_cache_commands_on_a_file_say_so_and_touch_nothing(tmp_path, monkeypatch, where):
    """Must hold: a cache path (or its models/ folder) that is a file is one error line saying
    so, for `cache list` (not "empty") and `cache clear`; the file is left as it was."""
    if where == "root":
        path = cache = tmp_path / "cache-file"
    else:
        cache, path = tmp_path / "cache", tmp_path / "cache" / "models"
        cache.mkdir()
    path.write_text("not a cache")
    monkeypatch.setenv("GATHERLENS_CACHE", str(cache))
    for command in ("list", "clear"):
        result = run("cache", command)
        assert result.exit_code == 1 and "empty" not in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith(f"Error: the model cache '{cache}'")
        assert "where a folder should be" in result.output and "GATHERLENS_CACHE" in result.output
    assert path.read_text() == "not a cache"
