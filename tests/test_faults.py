"""Fault injection: the model cache and the user's files under kills, damage, read-only and full
disks, concurrent conversions and folders removed mid-write.

Each test's docstring says what must hold afterwards. The GGUF conversion is replaced by a tiny
random Llama (tests/fault_worker.py), so every path from the lock to os.replace is the real one
while a conversion costs milliseconds. Processes that are killed or run side by side are real
subprocesses; read-only and full disks are simulated (as root, permissions are moot): os.open
and os.mkdir raise EROFS under a folder, or a named point of the conversion raises ENOSPC.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import fault_worker  # noqa: E402

from gatherlens.cli import main  # noqa: E402
from gatherlens.errors import GatherLensWarning, GatherValueError  # noqa: E402
from gatherlens.models import cache as mcache  # noqa: E402
from gatherlens.models import load, loading  # noqa: E402

WORKER = Path(fault_worker.__file__)


# -- fixtures and helpers --------------------------------------------------------------------
@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty cache of this test's own (GATHERLENS_CACHE)."""
    monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 16)
    return path


@pytest.fixture
def converts(monkeypatch):
    """Conversions in this process are the tiny model; returns the list of converted paths."""
    calls = []

    def convert(path, say):
        calls.append(path)
        return fault_worker.tiny_model(), fault_worker.tokenizer()

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    return calls


def leftovers(root: Path) -> list[str]:
    """Everything in the cache that is not a finished model folder or the hash sidecar."""
    found = [p.name for p in root.glob(".*")] if root.is_dir() else []
    models = root / "models"
    found += [f"models/{p.name}" for p in models.glob(".*")] if models.is_dir() else []
    return sorted(found)


def gatherlens_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, GatherLensWarning)]


class Forks:
    """The fork server of tests/fault_worker.py: each start() is a new gatherlens process."""

    def __init__(self):
        self.server = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.server.stdout.readline().strip() != "ready":
            pytest.fail(f"the fork server did not start: {self.server.stderr.read()[-2000:]}")
        self.results: dict[int, Path] = {}

    def start(self, gguf: Path, cache: Path, rebuild: bool = False, pause: str | None = None, **env) -> int:
        cache.parent.mkdir(parents=True, exist_ok=True)
        env = {"GATHERLENS_CACHE": str(cache), "FAULT_COUNT": str(cache.parent / "count"),
               **{k: str(v) for k, v in env.items()}}
        if pause:
            env.update(GATHERLENS_FAULT_PAUSE=pause, GATHERLENS_FAULT_MARKER=str(cache.parent / "paused"))
        result = cache.parent / f"result-{len(self.results)}.json"
        spec = {"gguf": str(gguf), "rebuild": rebuild, "env": env, "result": str(result)}
        self.server.stdin.write(json.dumps(spec) + "\n")
        self.server.stdin.flush()
        pid = int(self.server.stdout.readline())
        self.results[pid] = result
        return pid

    def result(self, pid: int) -> dict:
        wait_for(self.results[pid], f"process {pid} to finish")
        out = json.loads(self.results[pid].read_text())
        assert "error" not in out, out["error"]
        return out

    def close(self) -> None:
        self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()


@pytest.fixture(scope="module")
def forks():
    server = Forks()
    yield server
    server.close()


def wait_for(path: Path, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def conversions(cache: Path) -> int:
    count = cache.parent / "count"
    return len(count.read_text().split()) if count.exists() else 0


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


# -- read-only and full disks ------------------------------------------------------------------
def read_only(monkeypatch, folder: Path) -> None:
    """Writes under `folder` fail with EROFS (os.open for writing, os.mkdir), as on a read-only mount."""
    real_open, real_mkdir = os.open, os.mkdir
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def under(path) -> bool:
        return Path(os.path.abspath(path)).is_relative_to(folder)

    def fake_open(path, flags, *a, **k):
        if flags & writing and under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **k)

    def fake_mkdir(path, *a, **k):
        if under(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)


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


# -- the command line under environment faults -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "tiny"
    fault_worker.tiny_model().save_pretrained(folder)
    fault_worker.tokenizer().save_pretrained(folder)
    return folder


def run(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def no_load(monkeypatch):
    """Make loading a model a test failure: the check must come before any slow work."""
    import gatherlens.models

    monkeypatch.setattr(gatherlens.models, "load", lambda *a, **k: pytest.fail("the model was loaded"))


@pytest.mark.parametrize("case", ["under-a-file", "read-only"])
def test_explain_out_is_checked_before_the_model_loads(tmp_path, monkeypatch, case):
    """Must hold: --out that cannot be written is one error line before the model loads."""
    (tmp_path / "a-file").write_text("mine")
    out = tmp_path / "a-file" / "report" if case == "under-a-file" else tmp_path / "ro" / "report"
    if case == "read-only":
        (tmp_path / "ro").mkdir()
        read_only(monkeypatch, tmp_path / "ro")
    no_load(monkeypatch)
    result = run("explain", "hi", "--out", str(out))
    assert result.exit_code == 1
    assert ("is a file" if case == "under-a-file" else "Read-only file system") in result.output
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.parametrize("args", [["gather", "--shape", "4,5", "--index", "[[1,2]]", "-o", "{ro}/g.svg"],
                                  ["gather", "--shape", "4,5", "--index", "[[1,2]]", "-o", "{ro}/g.png"],
                                  ["gather", "--mistakes", "-o", "{ro}/m.png"],
                                  ["eval", "--out", "{ro}/q.json"], ["eval", "--plot", "{ro}/q.png"],
                                  ["bench", "embedding", "--json", "{ro}/b.json"]],
                         ids=["gather-svg", "gather-png", "mistakes-png", "eval-out", "eval-plot", "bench-json"])
def test_unwritable_outputs_fail_in_one_line_before_any_work(tmp_path, monkeypatch, args):
    """Must hold: an output in a read-only folder is one error line naming it; nothing is written."""
    (tmp_path / "ro").mkdir()
    read_only(monkeypatch, tmp_path / "ro")
    no_load(monkeypatch)
    result = run(*[a.format(ro=tmp_path / "ro") for a in args])
    assert result.exit_code != 0 and "Read-only file system" in result.output, result.output
    assert list((tmp_path / "ro").iterdir()) == []


def test_report_folder_removed_while_writing(tiny_dir, tmp_path, monkeypatch):
    """Must hold: one error line naming the missing path; no temporary file anywhere; the
    user's file beside the report folder untouched."""
    out = tmp_path / "report"
    (tmp_path / "notes.txt").write_text("mine")
    real_replace = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).parent == out and out.exists():
            shutil.rmtree(out)  # another program (or the user) removes the folder mid-write
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    result = run("explain", "The cat sat", "--model", str(tiny_dir), "--out", str(out))
    assert result.exit_code == 1 and "No such file or directory" in result.output, result.output
    assert len(result.output.strip().splitlines()[-1]) < 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_disk_full_while_writing_a_report_keeps_the_users_files(tiny_dir, tmp_path, monkeypatch):
    """Must hold: ENOSPC in the middle of writing the report (with --force) is one error line;
    the user's own file in the folder is untouched and no temporary file is left."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    real_replace, calls = os.replace, []

    def replace(src, dst, *a, **k):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    result = run("explain", "The cat sat", "--model", str(tiny_dir), "--out", str(out), "--force")
    assert result.exit_code == 1 and "No space left on device" in result.output, result.output
    assert (out / "notes.txt").read_text() == "mine"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("remove,named", [("model.safetensors", "has no weights: none of model.safetensors"),
                                          ("tokenizer.json", "has no tokenizer: none of tokenizer.json")])
def test_incomplete_model_folder_names_the_missing_file(tiny_dir, tmp_path, remove, named):
    """Must hold: a model folder missing its weights or tokenizer is one error line naming it."""
    folder = tmp_path / "incomplete"
    shutil.copytree(tiny_dir, folder)
    (folder / remove).unlink()
    for extra in ("vocab.txt",) if remove == "tokenizer.json" else ():
        (folder / extra).unlink(missing_ok=True)
    result = run("explain", "hi", "--model", str(folder), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1 and named in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_missing_shard_is_named(tiny_dir, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"")
    with pytest.raises(GatherValueError, match="missing model-00002-of-00002.safetensors"):
        load(str(folder))


def test_internal_error_is_one_line_and_the_traceback_goes_to_a_file(tmp_path, monkeypatch):
    """Must hold: an unexpected exception prints one line saying where the full traceback is."""
    import gatherlens.models

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(gatherlens.models, "load", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    result = run("explain", "hi", "--out", str(tmp_path / "r"))
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert "internal error (RuntimeError: boom)" in line and "Please report it" in line
    saved = next(tmp_path.glob("gatherlens-error-*.txt")).read_text()
    assert "Traceback" in saved and "RuntimeError: boom" in saved


def test_unwritable_cache_is_one_warning_line_in_the_cli(root, gguf, converts, tmp_path, monkeypatch):
    """Must hold: the CLI shows the unwritable-cache warning as one `warning:` line, then works."""
    root.mkdir()
    read_only(monkeypatch, root)
    result = run("explain", "The cat sat", "--model", str(gguf), "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    said = [ln for ln in result.output.splitlines() if "not writable" in ln]
    assert len(said) == 1 and said[0].startswith("warning: the model cache"), result.output
    assert "UserWarning" not in result.output and "GatherLensWarning" not in result.output


def test_non_finite_report_numbers_fail_naming_where(tiny_dir, tmp_path):
    """Must hold: a model whose finite weights overflow to NaN/inf in the forward pass gives an
    error naming the first non-finite number of the report; no report is written."""
    folder = tmp_path / "huge"
    shutil.copytree(tiny_dir, folder)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors = {k: v * 1e30 if k in ("model.norm.weight", "lm_head.weight") else v for k, v in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = run("explain", "The cat sat", "--model", str(folder), "--out", str(tmp_path / "r"))
    assert result.exit_code == 1 and "non-finite number at" in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_long_bad_inputs_are_quoted_shortened():
    """Must hold: a 5,000-digit number is echoed as its first 40 characters and '…'."""
    for args in (["gather", "--shape", "4,5", "--index", "[[" + "9" * 5000 + "]]"],
                 ["explain", "hi", "--top-k", "9" * 5000]):
        result = run(*args)
        assert result.exit_code == 2 and "…" in result.output and len(result.output) < 600, result.output


def test_cache_list_shows_sizes_and_clear_keeps_what_a_live_process_writes(root, gguf, converts):
    """Must hold: `cache list` shows each converted model with its size and state and a killed
    conversion's leftover as such; `cache clear` removes everything no live process is writing,
    says how much it freed, and keeps (and names) what a live process holds."""
    from gatherlens.models import locks

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
