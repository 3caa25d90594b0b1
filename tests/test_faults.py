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
from gatherlens.models.files import cache as mcache  # noqa: E402
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


# -- outputs written late: checked at the start, checked again as they are written --------------
def test_a_file_made_after_the_check_is_refused_and_kept(tmp_path):
    """Must hold: without --force the late write creates the file exclusively: a file that
    appeared since the check at the start is refused by name and left as it was."""
    from gatherlens.outputs import output_file, write_output

    path = output_file(tmp_path / "pages.svg", "--pages", suffixes=(".svg",))
    path.write_text("another program's file")                      # created meanwhile
    with pytest.raises(GatherValueError, match=r"--pages .*pages.svg' was created meanwhile.*--force"):
        write_output(path, "<svg/>", "--pages")
    assert path.read_text() == "another program's file"
    assert write_output(path, "<svg/>", "--pages", force=True) == path and path.read_text() == "<svg/>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.svg"]   # no temporary file left


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_a_failure_while_writing_leaves_no_half_file(tmp_path, force):
    """Must hold: a write that fails midway leaves no half-written output and no temporary
    file; with --force the file it was replacing is still whole."""
    from gatherlens.outputs import open_output

    path = tmp_path / "results.json"
    if force:
        path.write_text("the earlier results")
    with pytest.raises(OSError, match="No space left"):
        with open_output(path, "--json", force=force) as fh:
            fh.write("{\"half\": ")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == (["results.json"] if force else [])
    assert not force or path.read_text() == "the earlier results"


def test_the_output_rule_names_what_is_wrong(tmp_path):
    """Must hold: each refusal is one GatherValueError naming the option, the path and the way out."""
    from gatherlens.outputs import output_dir, output_file, write_output

    (tmp_path / "dir.svg").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    cases = [(lambda: output_file(tmp_path / "dir.svg", "--pages", force=True), "is a folder; give a file path"),
             (lambda: output_file(tmp_path / "p.png", "--pages", suffixes=(".svg", ".html")),
              "must end in .svg or .html"),
             (lambda: output_file(tmp_path / "notes.txt", "--out"), "exists; pass --force"),
             (lambda: output_file(tmp_path / "notes.txt" / "p.svg", "--out"), "is a file, not a folder"),
             (lambda: output_file(tmp_path / "no" / "p.svg", "--out"), "does not exist"),
             (lambda: output_dir(tmp_path, "--out"), "is not empty; pass --force"),
             (lambda: output_dir(tmp_path / "notes.txt" / "pics", "--out"), "is a file"),
             (lambda: write_output(tmp_path / "gone" / "p.svg", "x", "--pages"), "does not exist")]
    for call, message in cases:
        with pytest.raises(GatherValueError, match=message):
            call()
    assert output_dir(tmp_path, "--out", force=True) == tmp_path and output_dir(tmp_path / "new", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


# -- issue 21: damaged user models, what the cache may remove, switches, page choice --------------
def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _as_bin(folder: Path, cut) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(cut((folder / "pytorch_model.bin").read_bytes()))


USER_DAMAGE = {
    "truncated-safetensors": (lambda d: _half(d / "model.safetensors"),
                              "could not be read (damaged or truncated?): model.safetensors: Error while deserializing"),
    "garbage-safetensors": (lambda d: (d / "model.safetensors").write_bytes(bytes(range(256)) * 20),
                            "could not be read (damaged or truncated?): model.safetensors: Error while deserializing"),
    "empty-safetensors": (lambda d: (d / "model.safetensors").write_bytes(b""),
                          "model.safetensors: Error while deserializing header: header too small"),
    "garbage-tokenizer": (lambda d: (d / "tokenizer.json").write_bytes(b"\0" * 64),
                          "could not be read (damaged or truncated?): its tokenizer: "),
    "a-tensor-missing": (_drop_tensor, "damaged weights: 'model.norm.weight' is missing from its weight files"),
    "truncated-bin": (lambda d: _as_bin(d, lambda b: b[: len(b) // 2]),
                      "a PyTorch weight file is truncated or damaged"),
    "garbage-bin": (lambda d: _as_bin(d, lambda b: bytes(range(256)) * 8),
                    "pytorch_model.bin is not a PyTorch weight file"),
}


@pytest.mark.parametrize("case", list(USER_DAMAGE))
def test_damaged_file_in_a_users_model_is_one_line_naming_it(tiny_dir, tmp_path, root, case):
    """Must hold: a user's model folder with a truncated, garbage or incomplete file is one
    `Error:` line naming the folder and the file (never "internal error ... Please report it");
    exit 1; no report; the user's files left byte for byte; nothing written in the cache."""
    damage, said = USER_DAMAGE[case]
    folder = tmp_path / "mine"
    shutil.copytree(tiny_dir, folder)
    damage(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run("explain", "The cat sat", "--model", str(folder), "--out", str(tmp_path / "r"))
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and last.startswith(f"Error: model {'folder ' if 'missing' in said else ''}'{folder}")
    assert said in last and "internal error" not in result.output and len(last) < 400, result.output
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (tmp_path / "r").exists() and not root.exists()


def test_damaged_file_mapping_leaves_bugs_alone(tmp_path):
    """Must hold: the one mapping of damaged-file errors names only what the libraries raise on
    a damaged file; any other error (a bug) still surfaces as itself, not as the user's file."""
    from safetensors import SafetensorError

    from gatherlens.models.files.integrity import damage, readable

    assert damage(SafetensorError("Error while deserializing header: header too large"), "model.safetensors") \
        == "model.safetensors: Error while deserializing header: header too large"
    assert damage(RuntimeError("PytorchStreamReader failed reading zip archive")).startswith("a PyTorch weight file")
    assert damage(Exception("Error while initializing WordPiece")) == "Error while initializing WordPiece"
    for bug in (RuntimeError("shape mismatch in a matmul"), TypeError("bad call"), AttributeError("x")):
        assert damage(bug) is None
        with pytest.raises(type(bug)):
            with readable(tmp_path):
                raise bug


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


def _config_file(model, folder: Path) -> dict:
    model.save_pretrained(folder)
    return json.loads((folder / "config.json").read_text())


def _with_contexts(model):
    from gatherlens.models import topk_attention_enabled
    from gatherlens.models.runtime.decoding import sparse_decoding

    with topk_attention_enabled(model, 4), sparse_decoding(model, budget=8, page_size=4):
        pass


def test_switches_leave_the_config_as_it_was(tiny_dir, tmp_path):
    """Must hold: after each switch and its undoing (top-k, sparse decoding, both interleaved, the
    context managers) model.config is the loaded one exactly (to_dict equal, no gatherlens key)
    and save_pretrained writes the same config.json as before any switch."""
    from gatherlens.models import use_dense_attention, use_topk_attention
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    model = load(str(tiny_dir)).model
    original, saved = model.config.to_dict(), _config_file(model, tmp_path / "before")
    rounds = {"topk": lambda m: use_dense_attention(use_topk_attention(m, top_k=3)),
              "sparse": lambda m: use_dense_decoding(use_sparse_decoding(m, budget=8, page_size=4)),
              "both": lambda m: use_dense_attention(use_dense_decoding(use_sparse_decoding(use_topk_attention(m, 2)))),
              "contexts": _with_contexts}
    for name, switch in rounds.items():
        switch(model)
        assert model.config.to_dict() == original, name
        assert not [k for k in vars(model.config) if k.startswith("gatherlens")], name
        assert _config_file(model, tmp_path / name) == saved, name
        assert model.config._attn_implementation == "sdpa", name


def test_a_non_finite_key_never_takes_a_forced_page():
    """Must hold: page 0 (documented as always read) and the newest page are chosen at every
    step even when other pages hold NaN or inf keys (their bounds are NaN/inf); the pages of
    NaN keys are read last (as many pages are read as with finite keys)."""
    from gatherlens.ops.sparse import PagedKVCache, select_pages

    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)   # (B, Hkv, L, D)
    clean = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    clean.append(keys, values)
    keys[:, :, 20:28] = float("nan")                                     # pages 5 and 6
    keys[:, 1, 30] = float("inf")                                        # page 7 of head 1
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    cache.append(keys, values)
    query = torch.randn(1, 4, 1, 8)                                      # (B, Hq, 1, D)
    for budget in (8, 12, 24):
        pages, _ = select_pages(query, cache, budget=budget)             # (1, 2, n)
        assert (pages[..., 0] == 0).all() and (pages[..., -1] == 15).all(), (budget, pages)
        assert not torch.isin(pages[0, 0], torch.tensor([5, 6])).any(), (budget, pages)   # NaN ranks last
        assert pages.shape[-1] == select_pages(query, clean, budget=budget)[0].shape[-1]


def test_sharded_page_owners_raise_no_warning():
    """Must hold: the owners of a page choice that reads every page (an expanded, strided
    tensor) come without torch's non-contiguous searchsorted warning, and equal the ranks
    computed one page at a time."""
    from gatherlens.trace.sharded import ShardedPageSelection

    pages = torch.arange(7).expand(1, 2, 7)                              # (B, Hsel, N), strided
    sel = ShardedPageSelection(pages=pages, bounds=[None, None], lse=torch.zeros(1, 4, 1), lengths=(16, 12),
                               rank=0, page_size=4, budget=64, query_heads=4, kv_heads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        owners = sel.owners()                                            # (1, 2, 7)
    assert owners.tolist() == [[[0, 0, 0, 0, 1, 1, 1]] * 2]


# -- late writes of the commands: a file made between the check at the start and the write ----------
def _made_meanwhile(monkeypatch, module, name: str, path: Path, content: bytes) -> None:
    """Wrap `module.name` (the work a command does between its start check and its write) so that
    another program creates `path` while it runs; the work itself is the real one."""
    real = getattr(module, name)

    def work(*args, **kwargs):
        result = real(*args, **kwargs)
        path.write_bytes(content)                                   # another program's file, meanwhile
        return result

    monkeypatch.setattr(module, name, work)


@pytest.mark.parametrize("suffix,head", [(".svg", b"<svg"), (".png", b"\x89PNG")])
def test_gather_picture_made_meanwhile_is_kept_without_force(tmp_path, monkeypatch, suffix, head):
    """Must hold: `gatherlens gather -o FILE` refuses, by name, a FILE that appeared while it drew
    and leaves it as it was; with --force it replaces it with the picture; no temporary file left."""
    import gatherlens.commands.gather as gather_command

    out = tmp_path / f"g{suffix}"
    _made_meanwhile(monkeypatch, gather_command, "_build", out, b"another program's file")
    args = ("gather", "--shape", "3,3", "--index", "[[0,1,2]]", "-o", str(out))
    result = run(*args)
    assert result.exit_code == 1 and "was created meanwhile" in result.output and "--force" in result.output
    assert out.read_bytes() == b"another program's file"
    out.unlink()
    result = run(*args, "--force")
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(head) and sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_bench_page_made_meanwhile_is_kept_without_force(tmp_path, monkeypatch):
    """Must hold: `gatherlens bench page -o FILE` checks FILE first and creates it exclusively: a
    FILE made while it read the results is refused and kept; with --force it is replaced."""
    import gatherlens.bench.page as bench_page
    from gatherlens.bench.output import write_results

    results, out = tmp_path / "decode.json", tmp_path / "benchmarks.md"
    write_results(results, "decode", {"threads": 2}, [{"context": 8192, "speedup": 2.5}], force=False)
    _made_meanwhile(monkeypatch, bench_page, "page", out, b"my notes")
    result = run("bench", "page", str(results), "-o", str(out))
    assert result.exit_code == 1 and "benchmarks.md' was created meanwhile" in result.output, result.output
    assert out.read_bytes() == b"my notes"
    out.unlink()
    result = run("bench", "page", str(results), "-o", str(out), "--force")
    assert result.exit_code == 0 and "| 8192 | 2.5 |" in out.read_text(), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks.md", "decode.json"]


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_eval_table_made_meanwhile_is_kept_without_force(tmp_path, suffix):
    """Must hold: eval's one CSV/JSON writer, given the command's --force (False), refuses a file
    made since the check at the start and keeps it; with force=True it replaces it whole."""
    from gatherlens.eval.io import write_table
    from gatherlens.outputs import output_file

    what = f"--{suffix[1:]}"
    path = output_file(tmp_path / f"q{suffix}", what, suffixes=(suffix,))   # the check at the start
    path.write_text("another program's file")                              # created meanwhile
    rows = [{"setting": "dense", "perplexity": 17.9}, {"setting": "budget=512", "perplexity": 18.3}]
    with pytest.raises(GatherValueError, match=rf"{what} .*q\{suffix}' was created meanwhile.*--force"):
        write_table(path, rows, ("setting", "perplexity"), {"model": "tiny"}, force=False, what=what)
    assert path.read_text() == "another program's file"
    write_table(path, rows, ("setting", "perplexity"), {"model": "tiny"}, force=True, what=what)
    text = path.read_bytes().decode("utf-8")
    if suffix == ".json":
        assert json.loads(text) == {"meta": {"model": "tiny"}, "rows": rows}
    else:
        assert text == "setting,perplexity\r\ndense,17.9\r\nbudget=512,18.3\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_non_finite_key_never_takes_a_forced_page_in_triton_or_dist():
    """Must hold: the Triton page choice (in its CPU interpreter) and dist's per-rank candidates
    follow the same rule as select_pages: page 0 and the newest page always, NaN pages last."""
    import os

    from gatherlens.dist.pages import local_candidates
    from gatherlens.ops.sparse import PagedKVCache

    bounds = torch.tensor([[[float("nan"), 3.0, float("inf"), float("nan"), 1.0]]])  # (B, H, N_r)
    cb, ci = local_candidates(bounds, offset=0, n=3, total=5)
    assert set(ci[0, 0].tolist()) == {0, 4, 2}, ci            # both forced pages kept, inf next, nan out
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    pytest.importorskip("triton")
    from gatherlens.ops.sparse.triton_decode import triton_select_pages

    torch.manual_seed(0)
    keys, values = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)   # (B, Hkv, L, D)
    keys[:, :, 20:28] = float("nan")                                     # pages 5 and 6
    cache = PagedKVCache(batch=1, kv_heads=2, head_dim=8, page_size=4)
    cache.append(keys, values)
    pages, _ = triton_select_pages(torch.randn(1, 4, 1, 8), cache, budget=12)  # (1, 2, n) unsorted
    for row in pages[0]:
        assert {0, 15} <= set(row.tolist()) and not ({5, 6} & set(row.tolist())), pages


# -- the native build cache (ops/native.py) ------------------------------------------------------
TINY_OP = Path(__file__).parent / "native" / "tiny_op.cpp"   # one int operator: a build costs seconds
LOAD_TINY = ("import sys, torch; from pathlib import Path; from gatherlens.ops.native import load_library; "
             "ok = load_library(Path(sys.argv[1])); "
             "print('loaded', ok, torch.ops.gatherlens_test.twice(21) if ok else None, flush=True)")
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja", path=os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")])) is None, reason="no C++ compiler or ninja")


def load_tiny(cache: Path, timeout: float = 240, **env) -> subprocess.CompletedProcess:
    """tests/native/tiny_op.cpp loaded in a fresh process (a SIGBUS fails the test, not pytest)."""
    full = {**os.environ, "GATHERLENS_CACHE": str(cache), **env}
    full.pop("GATHERLENS_NATIVE", None)
    return subprocess.run([sys.executable, "-W", "always", "-c", LOAD_TINY, str(TINY_OP)], env=full,
                          capture_output=True, text=True, timeout=timeout)


def native_warnings(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if "GatherLensWarning" in line]


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    """A cache holding one sound build of tiny_op.cpp, made once for these tests (copy it, then damage)."""
    cache = tmp_path_factory.mktemp("native") / "cache"
    out = load_tiny(cache)
    assert out.returncode == 0 and "loaded True 42" in out.stdout, out.stderr[-3000:]
    (build,) = (cache / "native").iterdir()
    return build


def copy_build(tiny_build: Path, tmp_path: Path) -> Path:
    """This test's own cache with the sound build in it; returns the build's folder."""
    shutil.copytree(tiny_build.parent, tmp_path / "cache" / "native")
    return tmp_path / "cache" / "native" / tiny_build.name


@needs_compiler
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_native_build_is_said_once_and_rebuilt(tiny_build, tmp_path, damage):
    """Must hold: a truncated or garbage kernel library in the cache is never loaded (no SIGBUS):
    the next load says in one line that it is damaged, rebuilds it and runs it; the run after that
    is silent, and nothing else is left in the cache."""
    build = copy_build(tiny_build, tmp_path)
    (so,) = build.glob("*.so")
    size = so.stat().st_size
    so.write_bytes(so.read_bytes()[:4096] if damage == "truncated" else os.urandom(size))
    out = load_tiny(tmp_path / "cache")
    assert out.returncode == 0 and "loaded True 42" in out.stdout, out.stderr[-3000:]
    (line,) = native_warnings(out)
    assert "tiny_op.cpp" in line and "is damaged" in line and "rebuilding it" in line, line
    assert "could not build" not in out.stderr
    again = load_tiny(tmp_path / "cache")
    assert "loaded True 42" in again.stdout and not native_warnings(again), again.stderr[-3000:]
    assert sorted(p.name for p in build.parent.iterdir()) == [build.name]


@needs_compiler
def test_a_native_build_killed_midway_leaves_no_lock_that_blocks(tmp_path):
    """Must hold: kill -9 during the first build (ninja and the compiler too) leaves our lock file
    and torch's `lock` in the build's temporary folder; the next run is not blocked by either (nor
    by a torch `lock` in the build's folder itself): it builds in bounded time, and loads."""
    cache = tmp_path / "cache"
    env = {**os.environ, "GATHERLENS_CACHE": str(cache)}
    builder = subprocess.Popen([sys.executable, "-c", LOAD_TINY, str(TINY_OP)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((cache / "native").glob(".tiny_op-*.tmp-*/lock")):      # torch's baton: building now
        assert builder.poll() is None and time.monotonic() < deadline, "the builder never started building"
        time.sleep(0.05)
    os.killpg(builder.pid, signal.SIGKILL)
    builder.wait()
    (lock,) = (cache / "native").glob(".tiny_op-*.lock")
    build = cache / "native" / lock.name[1:].removesuffix(".lock")
    build.mkdir()
    (build / "lock").write_text("")                                       # an older layout's baton, too
    (build / "gatherlens_tiny_op.so").write_bytes(b"\x7fELF" + bytes(60))  # and a cut-short library
    start = time.monotonic()
    out = load_tiny(cache, timeout=180)
    assert out.returncode == 0 and "loaded True 42" in out.stdout, out.stderr[-3000:]
    assert not native_warnings(out), out.stderr                           # nothing built was damaged
    assert sorted(p.name for p in (cache / "native").iterdir()) == [build.name]
    assert time.monotonic() - start < 180
    umask = os.umask(0o022)
    os.umask(umask)
    assert build.stat().st_mode & 0o777 == 0o777 & ~umask                 # a folder like any other, not 0700


@needs_compiler
def test_a_live_native_builder_is_waited_for_at_most_build_wait_s(tiny_build, tmp_path, monkeypatch):
    """Must hold: while another live process holds the build's lock, a load says whom it waits for,
    gives up after BUILD_WAIT_S with one line and takes the fallback (False), building nothing."""
    from gatherlens.ops import native

    build = copy_build(tiny_build, tmp_path)
    (build / native.MANIFEST).unlink()                                    # so this one would build
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from gatherlens.filelock import hold\nwith hold(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(120)", str(build)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("GATHERLENS_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(native, "BUILD_WAIT_S", 1.0)
        source = tmp_path / TINY_OP.name
        shutil.copy(TINY_OP, source)                                      # its own entry in native's memo
        start = time.monotonic()
        with pytest.warns(GatherLensWarning) as caught:
            assert native.load_library(source) is False
        assert time.monotonic() - start < 10
    finally:
        holder.kill()
        holder.wait()
    said = [str(w.message) for w in caught]
    assert said[0].startswith(f"waiting for another process building the C++ kernel tiny_op.cpp (pid {holder.pid})")
    assert said[1].startswith(f"gave up waiting 1 s for process {holder.pid}") and len(said) == 2, said
    assert not list(build.glob("*.so.tmp*")) and not list(build.parent.glob(".*.tmp-*"))


@needs_compiler
def test_a_sound_native_build_loads_without_a_compiler(tiny_build, tmp_path):
    """Must hold: with no c++ on PATH (or a $CXX that is not there) a sound build in the cache loads,
    even beside a stale torch `lock`; a damaged one is not loaded (False, no crash)."""
    build = copy_build(tiny_build, tmp_path)
    (build / "lock").write_text("")                                       # torch's baton, left by a kill
    for env in ({"PATH": str(tmp_path / "empty")}, {"CXX": str(tmp_path / "no-such-c++")}):
        out = load_tiny(tmp_path / "cache", timeout=60, **env)
        assert out.returncode == 0 and "loaded True 42" in out.stdout, (env, out.stderr[-3000:])
        assert not native_warnings(out), out.stderr
    (so,) = build.glob("*.so")
    so.write_bytes(so.read_bytes()[:4096])
    out = load_tiny(tmp_path / "cache", timeout=60, PATH=str(tmp_path / "empty"))
    assert out.returncode == 0 and "loaded False None" in out.stdout, out.stderr[-3000:]



@needs_compiler
def test_installed_native_builds_load_with_an_empty_cache_and_no_compiler(tiny_build, tmp_path):
    """Must hold: setup's installed copy (GATHERLENS_NATIVE_INSTALLED, else the venv's share folder) loads
    in a process whose cache is new and empty, even with no compiler; a damaged copy is never loaded."""
    copy_build(tiny_build, tmp_path)
    installed = tmp_path / "venv-share"
    code = ("import sys; from pathlib import Path; from gatherlens.ops.native import install_builds; "
            "print(install_builds([Path(sys.argv[1])]))")
    env = {**os.environ, "GATHERLENS_CACHE": str(tmp_path / "cache"), "GATHERLENS_NATIVE_INSTALLED": str(installed)}
    out = subprocess.run([sys.executable, "-c", code, str(TINY_OP)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "installed in" in out.stdout, out.stderr[-3000:]
    (copy,) = installed.iterdir()
    assert copy.name == tiny_build.name and not list(installed.glob(".*")), list(installed.iterdir())
    empty = {"GATHERLENS_NATIVE_INSTALLED": str(installed), "PATH": str(tmp_path / "empty")}
    out = load_tiny(tmp_path / "new-cache", timeout=60, **empty)
    assert out.returncode == 0 and "loaded True 42" in out.stdout, out.stderr[-3000:]
    assert not native_warnings(out) and not (tmp_path / "new-cache" / "native").exists(), out.stderr
    (so,) = copy.glob("*.so")
    so.write_bytes(so.read_bytes()[:4096])                                    # damaged: not loaded from there
    out = load_tiny(tmp_path / "new-cache", timeout=60, **empty)
    assert out.returncode == 0 and "loaded False None" in out.stdout, out.stderr[-3000:]


# -- issue 29: one int rule on the command line, text files, kills while writing, stop signals ------
def _error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


def _cpus() -> int:
    from gatherlens.commands.params import cpu_count

    return cpu_count()


@pytest.mark.parametrize("args, message", [
    (["generate", "hi", "--threads", "999"], "Error: --threads = 999 is outside the valid range [1, {cpus}]"),
    (["generate", "hi", "--threads", "0"], "Error: --threads = 0 is outside the valid range [1, {cpus}]"),
    (["generate", "hi", "--max-new-tokens", "²"],
     "Error: --max-new-tokens = '²' is not an integer; give one in [1, inf)"),
    (["explain", "hi", "--top-k", "٣"], "Error: --top-k = '٣' is not an integer; give one in [1, inf)"),
    (["explain", "hi", "--layer", "1_0"],
     "Error: --layer = '1_0' is not an integer; write it with the digits 0-9 and an optional leading -"),
    (["serve", "--port", "0"], "Error: --port = 0 is outside the valid range [1, 65535]"),
    (["eval", "-k", "8,²"], "Error: -k/--top-k = '8,²' must be comma-separated positive integers: '²' is not an integer; give one "
                            "in [1, inf)"),
    (["lookup", "--ids", "3,+1"], "Error: --ids = '3,+1' must be comma-separated integers: '+1' is not an integer; write it "
                                  "with the digits 0-9 and an optional leading -"),
    (["generate", "--file", "/dev/null"], "Error: text file '/dev/null' is not a regular file (a device, a pipe "
                                          "or a socket); give a UTF-8 text file"),
], ids=["threads-high", "threads-zero", "superscript", "arabic-indic", "underscore", "port", "list", "plus",
        "dev-null"])
def test_cli_ints_and_text_files_are_one_error_line(monkeypatch, args, message):
    """Must hold: every int option is read by gatherlens.params' one rule (ASCII digits, one range
    wording) and --threads stops at this machine's CPUs; /dev/null is named for what it is. One
    `Error:` line, exit 1 or 2, no traceback, before any model loads."""
    no_load(monkeypatch)
    result = run(*args)
    assert result.exit_code in (1, 2), result.output
    assert _error_lines(result) == [message.format(cpus=_cpus())], result.output


def test_a_text_file_loses_its_byte_order_mark(tmp_path, monkeypatch):
    """Must hold: --file with a UTF-8 BOM gives the model the text without it; an empty file is
    named empty."""
    import gatherlens.commands.generate as generate_command

    seen = {}

    def stop(text, *a, **k):
        seen["text"] = text
        raise GatherValueError("stopped here")

    monkeypatch.setattr(generate_command, "_run", stop)
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfIt is a truth")
    result = run("generate", "--file", str(tmp_path / "bom.txt"))
    assert _error_lines(result) == ["Error: stopped here"] and seen["text"] == "It is a truth"
    (tmp_path / "empty.txt").write_bytes(b"\xef\xbb\xbf \n")
    result = run("generate", "--file", str(tmp_path / "empty.txt"))
    assert result.exit_code == 1 and _error_lines(result) == [f"Error: text file {str(tmp_path / 'empty.txt')!r} is empty"]


def test_a_model_with_no_positions_is_named(tiny_dir, tmp_path):
    """Must hold: a config (or GGUF context_length) of 0 positions is one error naming it, not
    "ask for fewer than 0 new tokens"."""
    folder = tmp_path / "zero"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 0}))
    result = run("generate", "hi", "--model", str(folder), "--max-new-tokens", "2")
    assert result.exit_code == 1 and "fewer than 0" not in result.output, result.output
    assert _error_lines(result) == [
        "Error: model 'zero' says it has 0 positions (max_position_embeddings, a GGUF's context_length): it "
        "cannot hold a prompt and a new token; its config is damaged or incomplete (it needs at least 2)"]


KILLED_WRITER = """
import sys, time
from gatherlens.outputs import open_output
path, force, ready = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
with open_output(path, "--plot", force=force, binary=True) as fh:   # eval --plot's writer (eval/plot.py)
    fh.write(b"\\x89PNG half a plot")
    fh.flush()
    open(ready, "w").close()
    time.sleep(120)
"""


def _killed_while_writing(path: Path, force: bool) -> int:
    """A real process writing `path` by the output rule, killed with SIGKILL mid-write; its pid."""
    ready = path.with_name("ready")
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), "1" if force else "0", str(ready)])
    wait_for(ready, "the writer to start writing", timeout=60)
    ready.unlink()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    return child.pid


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_kill_9_while_writing_a_plot_blocks_nothing_and_leaves_nothing(tmp_path, monkeypatch, force):
    """Must hold: a run killed (kill -9) while writing --plot leaves no target (with --force the
    earlier file whole), only a hidden `.gatherlens-tmp-PID-…` file, which the rerun's output
    check removes (its process is gone); the rerun is not blocked. A live writer's file is kept."""
    import gatherlens.models
    from gatherlens import outputs

    path = tmp_path / "q.png"
    if force:
        path.write_bytes(b"the earlier plot")
    pid = _killed_while_writing(path, force)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*(["q.png"] if force else []), *[n for n in left if n.startswith(f".gatherlens-tmp-{pid}-")]])
    assert len(left) == (2 if force else 1), left
    assert not force or path.read_bytes() == b"the earlier plot"

    def stop(*a, **k):
        raise GatherValueError("stop")

    monkeypatch.setattr(gatherlens.models, "load", stop)
    monkeypatch.setattr(outputs, "_CLEANED", set())
    result = run("eval", "--text", str(WORKER), "--plot", str(path), *(["--force"] if force else []))
    assert _error_lines(result) == ["Error: stop"], result.output           # not "exists", not blocked
    assert sorted(p.name for p in tmp_path.iterdir()) == (["q.png"] if force else [])
    assert outputs.write_output(path, b"\x89PNG whole", "--plot", force=force) == path
    assert path.read_bytes() == b"\x89PNG whole" and sorted(p.name for p in tmp_path.iterdir()) == ["q.png"]


def test_a_live_writers_temporary_file_is_kept(tmp_path):
    """Must hold: the stale-file sweep removes only files of processes that are gone."""
    from gatherlens.outputs import clean_stale_temps

    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "q.png"), "0", str(ready)])
    try:
        wait_for(ready, "the writer to start writing", timeout=60)
        (tmp_path / "notes.42-deadbeef.txt").write_text("mine")
        assert clean_stale_temps(tmp_path) == []
        assert any(p.name.startswith(f".gatherlens-tmp-{child.pid}-") for p in tmp_path.iterdir())
    finally:
        child.kill()
        child.wait(timeout=30)


SLOW_GENERATE = """
import sys, time, pathlib
import gatherlens.commands.generate as g
ready, real = pathlib.Path(sys.argv[1]), g._write
def slow(piece, result):                    # the real writer, slowed so that a signal lands mid-run
    real(piece, result)
    if len(result.new_ids) >= 3:
        ready.touch()
    time.sleep(0.05)
g._write = slow
from gatherlens.cli import main
main(sys.argv[2:], prog_name="gatherlens")
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_during_generate_stops_like_ctrl_c(tiny_dir, tmp_path, signame):
    """Must hold: SIGTERM (kill) or SIGHUP (a closed terminal) during `generate` stops it as Ctrl-C
    does: the continuation so far, the summary naming the signal, --pages written; exit 0."""
    ready, pages = tmp_path / "ready", tmp_path / "pages.svg"
    child = subprocess.Popen([sys.executable, "-c", SLOW_GENERATE, str(ready), "generate", "The cat sat",
                              "--model", str(tiny_dir), "--max-new-tokens", "50", "--pages", str(pages)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready, "three generated tokens", timeout=120)
        child.send_signal(getattr(signal, signame))
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert f"stopped ({signame}) after" in err and "Traceback" not in err, err
    assert "wrote" in err and pages.read_text().startswith("<svg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pages.svg", "ready"]


def test_a_damaged_gguf_block_is_one_error_without_a_numpy_warning(root, gguf, monkeypatch, capfd):
    """Must hold: a GGUF block with an inf scale (dequantized by gguf's numpy code: inf x 0) is the
    one `Error: ... damaged weights` line, with no raw numpy RuntimeWarning before it."""
    import numpy as np

    def convert(path, say):
        model = fault_worker.tiny_model()
        scale, codes = np.float16("inf"), np.array([0, 3], dtype=np.int8)   # what a damaged Q8_0 block holds
        row = torch.from_numpy(scale.astype(np.float32) * codes.astype(np.float32))  # (2,): nan, inf
        with torch.no_grad():
            model.lm_head.weight[5, 7:9] = row
        return model, fault_worker.tokenizer()

    monkeypatch.setattr(loading, "_convert_gguf", convert)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)           # a numpy warning would fail the run
        result = run("generate", "hi", "--model", str(gguf), "--max-new-tokens", "2")
    assert result.exit_code == 1 and "RuntimeWarning" not in result.output + capfd.readouterr().err
    assert _error_lines(result)[0].startswith(f"Error: model file {str(gguf)!r} converts to damaged weights"), result.output


def test_a_native_build_hash_covers_the_local_headers_it_includes(tmp_path):
    """Must hold: editing a header a kernel includes (`#include "x.h"`, beside it or included by
    such a header) makes a new build; system headers (<...>) are left to the compiler's version."""
    from gatherlens.ops import native

    (tmp_path / "a.h").write_text('#pragma once\n#include "b.h"\n')
    (tmp_path / "b.h").write_text("int b();\n")
    source = tmp_path / "k.cpp"
    source.write_text('#include <cstdint>\n#include "a.h"\nint k() { return 1; }\n')
    before = native._key(source)
    assert native._key(source) == before
    (tmp_path / "b.h").write_text("int b(int);\n")
    assert native._key(source) != before


def test_switches_refuse_models_they_cannot_change(monkeypatch):
    """Must hold: `use_topk_attention` on a Mamba model (no attention layers) and `use_sparse_decoding`
    on Mamba or BERT (no causal attention) raise one GatherValueError naming the class and what is
    needed, instead of a silent no-op; the model is left as it was. BERT still takes top-k."""
    import transformers

    from gatherlens.models.attention.topk import use_dense_attention, use_topk_attention
    from gatherlens.models.runtime.decoding import use_sparse_decoding

    mamba = transformers.MambaForCausalLM(transformers.MambaConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, state_size=4)).eval()
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)).eval()
    before = mamba.config.to_dict()
    cases = [(lambda: use_topk_attention(mamba, 4), r"MambaForCausalLM \(mamba\) has no attention layers, so top-k "
                                                     r"attention has nothing to replace.*needs a Transformer"),
             (lambda: use_sparse_decoding(mamba), r"MambaForCausalLM \(mamba\) has no attention layers, so sparse "
                                                  r"decoding"),
             (lambda: use_sparse_decoding(bert), r"BertModel \(bert\) has bidirectional attention \(an encoder\), so "
                                                 r"sparse decoding has no next token.*decoder-only causal LM")]
    for call, message in cases:
        with pytest.raises(GatherValueError, match=message):
            call()
    assert mamba.config.to_dict() == before
    assert use_dense_attention(use_topk_attention(bert, 2)) is bert


# -- a model file changed under a running model (models/files/watch.py, ops/fault/sigbus.cpp) ----
def test_a_model_file_watch_says_how_the_file_changed(tmp_path):
    """Must hold: FileWatch notices a rewrite of the same size, a size change, a file put in its
    place and a removal, each said in words; check() raises the one ModelFileChanged message."""
    from gatherlens.models.files.watch import FileWatch, ModelFileChanged

    path = tmp_path / "m.gguf"
    path.write_bytes(b"x" * 100)
    watch = FileWatch(path)
    assert watch.changed() is None
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert watch.changed() == "it was rewritten"
    watch = FileWatch(path)
    os.truncate(path, 10)
    assert watch.changed() == "its size went from 100 to 10 bytes"
    with pytest.raises(ModelFileChanged, match=r"^the model file '.*m\.gguf' changed while in use \(its size"):
        watch.check()
    watch = FileWatch(path)
    (tmp_path / "new").write_bytes(b"y" * 10)
    os.replace(tmp_path / "new", path)
    assert watch.changed() == "another file was put in its place"
    path.unlink()
    assert watch.changed() == "it was removed or cannot be read"


SIGBUS_MAPPING = """
import os, sys
import numpy as np
from gatherlens.ops.fault import guard_mapping, kernel_loaded
path, other = sys.argv[1], sys.argv[2]
for p in (path, other):
    with open(p, "wb") as f:
        f.write(b"x" * (1 << 20))
m, o = np.memmap(path, mode="c"), np.memmap(other, mode="c")
assert kernel_loaded()
guard_mapping(m.__array_interface__["data"][0], m.nbytes, "Error: the mapped file changed while in use\\n")
os.truncate(path, 0)
os.truncate(other, 0)
print("reading", flush=True)
print(int((o if sys.argv[3] == "other" else m)[-1]))
"""


@needs_compiler
@pytest.mark.parametrize("which", ["guarded", "other"])
def test_a_sigbus_in_a_guarded_mapping_is_one_line_and_exit_1(tmp_path, which):
    """Must hold: reading a guarded mapping whose file was cut short writes the guard's one line and
    exits 1 (not SIGBUS, 135); a fault in another mapping still dies by SIGBUS as before."""
    out = subprocess.run([sys.executable, "-c", SIGBUS_MAPPING, str(tmp_path / "a"), str(tmp_path / "b"), which],
                         capture_output=True, text=True, timeout=300)
    assert "reading" in out.stdout, out.stderr
    if which == "guarded":
        assert out.returncode == 1 and out.stderr.strip() == "Error: the mapped file changed while in use", out
    else:
        assert out.returncode == -signal.SIGBUS, out


def _smollm2_copy(tmp_path: Path) -> Path:
    from gatherlens.models import resolve

    try:
        source = resolve("smollm2").path
    except GatherValueError as e:   # the model package is not installed
        pytest.skip(str(e))
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(source, copy)
    return copy


def _change(path: Path, how: str) -> None:
    if how == "truncate":
        os.truncate(path, 4096)
    else:                               # overwrite the second half in place, same size
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(os.urandom(size - size // 2))


def _one_changed_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "changed while in use" in lines[0] and "copy.gguf" in lines[0], err
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_a_gguf_changed_under_generate_quantized_is_one_error_line(tmp_path, how):
    """Must hold: the GGUF truncated or overwritten in place while `generate --quantized` runs from
    it ends the run with exit 1 and one `Error: the model file ... changed while in use` line, no
    traceback (before: SIGBUS, status 135, no message; or silent garbage)."""
    copy = _smollm2_copy(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "gatherlens", "generate", "Once upon a time", "--quantized",
                              "--model", str(copy), "--max-new-tokens", "64"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.read(1), "no token was generated"     # the first token is out: mid-run
        _change(copy, how)
        out, err = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == 1, err.decode()
    _one_changed_line(err.decode())


CUT_MID_STEP = """
import os, sys
import gatherlens.commands.generate as g
import gatherlens.models.runtime.generation as generation
path, real = sys.argv[1], g._write
generation.check_unchanged = lambda model: None      # no check between steps: the next read faults
def cut(piece, result):
    real(piece, result)
    if len(result.new_ids) == 2:
        os.truncate(path, 4096)
g._write = cut
from gatherlens.cli import main
main(sys.argv[2:], prog_name="gatherlens")
"""


@needs_compiler
@pytest.mark.slow
def test_a_gguf_cut_short_inside_a_forward_pass_is_the_same_line(tmp_path):
    """Must hold: a truncation no check between steps sees in time (here: the checks switched off)
    faults inside the model's kernels; the SIGBUS guard says the same one line and exits 1."""
    copy = _smollm2_copy(tmp_path)
    out = subprocess.run([sys.executable, "-c", CUT_MID_STEP, str(copy), "generate", "Once upon a time",
                          "--quantized", "--model", str(copy), "--max-new-tokens", "8"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "cut short while the model read it" in _one_changed_line(out.stderr)


# -- a GGUF is checked before it runs (issue 29: models/gguf/check.py) -----------------------------
def _gguf_tensor(reader, name: str):
    return next(t for t in reader.tensors if t.name == name)


def _gguf_scale(name: str, row: int, at: int, value: float):
    """Set the fp16 at byte `at` of row `row` of tensor `name` (a block's d or m) to `value`."""
    import numpy as np

    def patch(reader):
        _gguf_tensor(reader, name).data[row, at:at + 2] = np.array([value], np.float16).view(np.uint8)
    return patch


def _gguf_dims(name: str, axis: int, value: int):
    """ggml's dims of tensor `name`: axis 0 is the width, axis 1 the rows."""
    return lambda reader: _gguf_tensor(reader, name).field.parts[3].__setitem__(axis, value)


def _gguf_type(name: str, number: int):
    return lambda reader: _gguf_tensor(reader, name).field.parts[4].__setitem__(0, number)


def _gguf_meta(key: str, value: int):
    def patch(reader):
        field = reader.fields[key]
        field.parts[field.data[0]][0] = value
    return patch


def _patched_gguf(source: Path, path: Path, patch) -> Path:
    """A copy of `source` patched in place through gguf's reader in "r+" mode, as the user did."""
    from gatherlens.models.gguf.config import open_gguf   # gguf.GGUFReader, its header parsed faster

    shutil.copyfile(source, path)
    reader = open_gguf(path, mode="r+")
    patch(reader)
    reader.data.flush()
    del reader
    return path


def _smollm2_path() -> Path:
    from gatherlens.models import resolve

    try:
        return resolve("smollm2").path
    except GatherValueError as e:   # the model package is not installed
        pytest.skip(str(e))


def _tiny_llama_gguf(path: Path, kinds: dict | None = None, extra: dict | None = None) -> Path:
    """A 2-block Llama GGUF like SmolLM2's (64 wide, 4 heads of 16 over 2 KV heads, 256 feed-forward, 96
    tokens; Q8_0 embedding, Q4_1 matrices, F32 norms) of zero blocks; `kinds`: tensor -> another ggml type
    (any gguf knows: IQ4_XS, Q2_K, F16, ...); `extra`: more tensors (name -> shape, F32 if 1-D)."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as T

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 2, "context_length": 128, "embedding_length": 64, "feed_forward_length": 256,
                       "attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 16}.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_uint32("llama.vocab_size", 96)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(96)])
    shapes = {"token_embd": (96, 64), "output_norm": (64,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm": (64,), f"blk.{i}.ffn_norm": (64,), f"blk.{i}.attn_q": (64, 64),
                       f"blk.{i}.attn_k": (32, 64), f"blk.{i}.attn_v": (32, 64), f"blk.{i}.attn_output": (64, 64),
                       f"blk.{i}.ffn_gate": (256, 64), f"blk.{i}.ffn_up": (256, 64), f"blk.{i}.ffn_down": (64, 256)})
    shapes.update(extra or {})
    for name, shape in shapes.items():
        kind = (kinds or {}).get(name, T.F32 if len(shape) == 1 else T.Q8_0 if name == "token_embd" else T.Q4_1)
        if kind in (T.F32, T.F16):
            writer.add_tensor(f"{name}.weight", np.ones(shape, np.float32 if kind == T.F32 else np.float16))
            continue
        weights, nbytes = gguf.GGML_QUANT_SIZES[kind]
        raw = np.zeros((shape[0], shape[1] // weights * nbytes), np.uint8)  # (rows, row bytes): zero blocks
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory) -> Path:
    return _tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# case -> (the patch, what the one error line says), on the tiny Llama GGUF (every case B and C of
# issue 29, with the tiny model's sizes: SmolLM2's, in the CLI test below, read the same)
TINY_FAULTS = {
    "B: attn_q with too few rows": (
        _gguf_dims("blk.1.attn_q.weight", 1, 48),
        r"does not match its own metadata: blk.1.attn_q.weight is 48 rows of 64 weights; head_count 4 x head_dim 16 "
        r"and embedding_length 64 expect 64 rows of 64 weights$"),
    "B: attn_q too narrow": (
        _gguf_dims("blk.1.attn_q.weight", 0, 32),
        r"blk.1.attn_q.weight is 64 rows of 32 weights; .* expect 64 rows of 64 weights$"),
    "B: ffn_down one row short": (
        _gguf_dims("blk.0.ffn_down.weight", 1, 63),
        r"blk.0.ffn_down.weight is 63 rows of 256 weights; embedding_length 64 and feed_forward_length 256 expect "
        r"64 rows of 256 weights$"),
    "B: ffn_down rows not whole blocks (gguf's reader fails)": (
        _gguf_dims("blk.0.ffn_down.weight", 0, 255),
        r"blk.0.ffn_down.weight is 64 rows of 255 weights; .* expect 64 rows of 256 weights$"),
    "B: a norm too narrow": (
        _gguf_dims("blk.1.attn_norm.weight", 0, 50),
        r"blk.1.attn_norm.weight is 50 weights; embedding_length 64 expects 64 weights$"),
    "B: embedding_length": (
        _gguf_meta("llama.embedding_length", 32),
        r"token_embd.weight is 96 rows of 64 weights; vocabulary 96 \(tokenizer.ggml.tokens\) and embedding_length 32 "
        r"expect 96 rows of 32 weights \(19 more tensors disagree with it\)$"),
    "C: head_count": (
        _gguf_meta("llama.attention.head_count", 8),
        r"blk.0.attn_q.weight is 64 rows of 64 weights; head_count 8 x head_dim 16 and embedding_length 64 expect "
        r"128 rows of 64 weights \(3 more"),
    "C: head_count_kv": (
        _gguf_meta("llama.attention.head_count_kv", 4),
        r"blk.0.attn_k.weight is 32 rows of 64 weights; head_count_kv 4 x head_dim 16 and embedding_length 64 "
        r"expect 64 rows of 64 weights"),
    "C: head_count_kv that does not divide head_count": (
        _gguf_meta("llama.attention.head_count_kv", 3),
        r"blk.0.attn_k.weight is 32 rows of 64 weights; head_count_kv 3 x head_dim 16"),
    "C: Q4_1 blocks declared Q8_0": (
        _gguf_type("blk.0.attn_q.weight", 8),
        r"blk.0.attn_q.weight as Q8_0 \(64 rows of 64 weights\) is 4,352 bytes, but the next tensor, "
        r"blk.0.attn_k.weight, starts 2,560 bytes after it: its type or shape does not describe its data$"),
    "C: Q8_0 blocks declared Q4_1": (
        _gguf_type("token_embd.weight", 3),
        r"token_embd.weight as Q4_1 \(96 rows of 64 weights\) is 3,840 bytes, but the next tensor, output_norm.weight, "
        r"starts 6,528 bytes after it"),
    "C: block_count one short (its last block unused)": (
        _gguf_meta("llama.block_count", 1),
        r"it holds blk.1.attn_norm.weight and 8 more that nothing reads \(a llama model of block_count 1 reads "
        r"blk.0 to blk.0, token_embd, output_norm and output\)$"),
    "C: block_count one over": (
        _gguf_meta("llama.block_count", 3),
        r"it lacks blk.2.attn_norm.weight and 8 more, which block_count 3 and the llama architecture need$"),
    "C: context_length 0": (
        _gguf_meta("llama.context_length", 0),
        r"has bad metadata: llama.context_length is 0; it must be a positive whole number$"),
    "C: vocab_size against the token list": (
        _gguf_meta("llama.vocab_size", 100),
        r"has bad metadata: llama.vocab_size 100 but tokenizer.ggml.tokens holds 96 tokens$"),
    "a type number ggml does not have (gguf's reader fails)": (
        _gguf_type("blk.0.attn_v.weight", 99),
        r"holds tensors quantized=True cannot run: type 99 \(blk.0.attn_v.weight: 32 rows of 64 weights\); it runs "
        r"matrices in Q8_0, .*F16; use another preset of the model \(a file in those types\)$"),
}


@pytest.mark.parametrize("case", list(TINY_FAULTS))
def test_a_gguf_of_wrong_shapes_or_lying_metadata_is_one_error_naming_what_disagrees(tiny_llama_gguf, tmp_path,
                                                                                    case):
    """Must hold (issue 29, cases B and C): a tensor of the wrong shape, metadata that lies or a type
    that does not describe its data is one GatherValueError naming the file, the tensor or key, what
    the metadata expects and what was found: from the header alone, before anything is loaded."""
    import re

    from gatherlens.models.gguf.check import open_checked

    patch, said = TINY_FAULTS[case]
    path = _patched_gguf(tiny_llama_gguf, tmp_path / "damaged.gguf", patch)
    with pytest.raises(GatherValueError) as caught:
        open_checked(path, quantized=True)
    message = str(caught.value)
    assert message.startswith(f"model file {str(path)!r} ") and "\n" not in message and "np." not in message
    assert re.search(said, message), message


# case -> (the patch of the shipped SmolLM2 Q4_1 GGUF, what the one error line says); block 3 of a
# Q4_1 row starts at byte 3 * 20 (layout.py: d at 0, m at 2)
SMOLLM2_FAULTS = {
    "A: NaN scale in the embedding row of 'The'": (
        _gguf_scale("token_embd.weight", 504, 0, float("nan")),
        r"is damaged: token_embd.weight row 504, block 0: its fp16 scale d is nan; every block scale must be finite"),
    "A: NaN scale in an attn_q block": (
        _gguf_scale("blk.10.attn_q.weight", 7, 3 * 20, float("nan")),
        r"is damaged: blk.10.attn_q.weight row 7, block 3: its fp16 scale d is nan"),
    "A: inf min in an attn_q block": (
        _gguf_scale("blk.10.attn_q.weight", 7, 3 * 20 + 2, float("inf")),
        r"is damaged: blk.10.attn_q.weight row 7, block 3: its fp16 scale m is inf"),
    "B: attn_q 512 rows": (
        _gguf_dims("blk.3.attn_q.weight", 1, 512),
        r"does not match its own metadata: blk.3.attn_q.weight is 512 rows of 576 weights; head_count 9 x "
        r"head_dim 64 and embedding_length 576 expect 576 rows of 576 weights$"),
    "C: head_count 8": (
        _gguf_meta("llama.attention.head_count", 8),
        r"blk.0.attn_output.weight is 576 rows of 576 weights; embedding_length 576 and head_count 8 x head_dim 64 "
        r"expect 576 rows of 512 weights \(59 more tensors disagree with it\)$"),
    "C: block_count 29": (
        _gguf_meta("llama.block_count", 29),
        r"it holds blk.29.attn_norm.weight and 8 more that nothing reads \(a llama model of block_count 29 reads "
        r"blk.0 to blk.28"),
}


@pytest.mark.parametrize("case", [c for c in SMOLLM2_FAULTS if c.startswith("A")])
def test_a_non_finite_block_scale_is_one_error_naming_tensor_block_and_field(tmp_path, case):
    """Must hold (issue 29, case A): a NaN or inf fp16 scale in one block of the shipped file (the
    embedding row of "The", one attn_q block) is found by the load-time scale check, never run."""
    import re

    from gatherlens.models.gguf.check import open_checked

    patch, said = SMOLLM2_FAULTS[case]
    path = _patched_gguf(_smollm2_path(), tmp_path / "damaged.gguf", patch)
    with pytest.raises(GatherValueError) as caught:
        open_checked(path, quantized=True)
    assert re.search(said, str(caught.value)) and str(caught.value).startswith(f"model file {str(path)!r}")


def test_the_shipped_gguf_passes_the_check_in_milliseconds():
    """Must hold: the check runs on every load, so it costs milliseconds: SmolLM2's 98 MB, 272 tensors,
    every fp16 scale of its 4.9 million blocks (about 25 ms here; the bound leaves room for a loaded machine)."""
    from gatherlens.models.gguf.check import check_gguf
    from gatherlens.models.gguf.config import open_gguf

    path = _smollm2_path()
    reader = open_gguf(path, mode="c")
    check_gguf(reader, path, quantized=False)   # the pages mapped once, as the load maps them
    start = time.perf_counter()
    check_gguf(reader, path, quantized=True)
    assert time.perf_counter() - start < 0.5


def test_a_sound_tiny_gguf_passes_and_an_iq2_matrix_runs_in_float_only(tiny_llama_gguf, tmp_path):
    from gguf import GGMLQuantizationType as T

    from gatherlens.models.gguf.check import open_checked

    open_checked(tiny_llama_gguf, quantized=True)
    path = _tiny_llama_gguf(tmp_path / "iq2.gguf", {"blk.0.ffn_down": T.IQ2_XXS})
    open_checked(path, quantized=False)
    with pytest.raises(GatherValueError, match=r"cannot run: IQ2_XXS \(blk.0.ffn_down.weight: 64 rows of 256 "
                                               r"weights\); .*try without --quantized \(quantized=True\)"):
        open_checked(path, quantized=True)


def test_unsupported_types_are_all_named_before_anything_slow(tmp_path, monkeypatch):
    """Must hold: a file in formats the quantized path cannot run is refused at once, before the
    config, tokenizer or any block is read: one line naming every such type by ggml's name (IQ2_XXS
    for an IQ2_XXS tensor), its first tensor and that tensor's shape in plain integers, and the float
    path as the way out; no numpy types in it."""
    from gguf import GGMLQuantizationType as T

    import gatherlens.models.gguf.quantized as quantized
    from gatherlens.ops.quant.formats.registry import FORMATS

    path = _tiny_llama_gguf(tmp_path / "iq.gguf", {"blk.0.ffn_down": T.IQ2_XXS, "blk.1.ffn_down": T.IQ2_XXS,
                                                   "blk.0.attn_output": T.MXFP4})
    monkeypatch.setattr(quantized, "_config_and_tokenizer", lambda *a: pytest.fail("read past the check"))
    result = run("generate", "--quantized", "--model", str(path), "--max-new-tokens", "2", "hi")
    assert result.exit_code == 1 and len(_error_lines(result)) == 1, result.output
    assert _error_lines(result)[0] == (
        f"Error: model file {str(path)!r} holds tensors quantized=True cannot run: MXFP4 (blk.0.attn_output.weight: "
        f"64 rows of 64 weights); IQ2_XXS (blk.0.ffn_down.weight: 64 rows of 256 weights, and 1 more); it runs "
        f"matrices in {', '.join(FORMATS)} and vectors in F32, F16, BF16; try without --quantized (quantized=True): the "
        f"float32 path dequantizes them")


@pytest.mark.parametrize("case,quantized", [
    ("A: NaN scale in the embedding row of 'The'", True), ("A: NaN scale in the embedding row of 'The'", False),
    ("B: attn_q 512 rows", True), ("C: head_count 8", True), ("C: block_count 29", False)])
def test_generate_on_a_damaged_gguf_is_one_error_line_and_writes_nothing(root, tmp_path, case, quantized):
    """Must hold: what the user sees from `generate` (and `serve`, which loads the same way) on the
    shipped file damaged: exit 1, one `Error:` line naming the file and the fault, no traceback, no
    internal error, no output file, nothing cached (the float path checks before it converts)."""
    import re

    patch, said = SMOLLM2_FAULTS[case]
    path = _patched_gguf(_smollm2_path(), tmp_path / "damaged.gguf", patch)
    pages = tmp_path / "pages.svg"
    flag = ["--quantized"] if quantized else []
    result = run("generate", *flag, "--model", str(path), "--max-new-tokens", "2", "--pages", str(pages), "hi")
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"Error: model file {str(path)!r}"), \
        result.output
    assert re.search(said, lines[0]) and "internal error" not in lines[0], lines[0]
    models = root / "models"
    assert not pages.exists() and not (models.exists() and any(models.iterdir()))


def test_a_gguf_cut_inside_its_data_names_the_first_tensor_past_the_end(tmp_path):
    """Must hold: a file truncated after its header (a partial download) names the first tensor whose
    data is missing; one cut inside the header keeps the reader's own words (test above)."""
    from gatherlens.models.gguf.check import open_checked

    path = tmp_path / "partial.gguf"
    with open(_smollm2_path(), "rb") as f:
        path.write_bytes(f.read(50_000_000))
    with pytest.raises(GatherValueError, match=r"partial.gguf' is truncated: blk\.\d+\.\w+\.weight's data ends at "
                                               r"byte [\d,]+, past the end of the file \(50,000,000 bytes\)"):
        open_checked(path)


def test_quantized_table_from_a_file_that_is_not_gguf_names_it(tmp_path):
    from gatherlens.ops.quant import QuantizedTable

    path = tmp_path / "notes.gguf"
    path.write_text("just text")
    with pytest.raises(GatherValueError, match=r"path '.*notes.gguf' is not a readable GGUF file \(GGUF magic invalid\)"):
        QuantizedTable.from_gguf(path, "token_embd.weight")


def test_a_tensor_the_model_does_not_apply_is_named_in_a_warning_not_refused(tmp_path):
    """Llama 3.x files carry rope_freqs.weight (RoPE frequency factors transformers does not apply):
    the check warns once, naming it and what differs, and the file runs; any other stray tensor is refused."""
    import gguf

    from gatherlens.errors import GatherLensWarning
    from gatherlens.models.gguf.check import check_gguf

    path = _tiny_llama_gguf(tmp_path / "rope.gguf", extra={"rope_freqs": (8,)})
    with pytest.warns(GatherLensWarning, match=r"rope.gguf: rope_freqs.weight: .*not applied"):
        check_gguf(gguf.GGUFReader(path), path, quantized=True)
    stray = _tiny_llama_gguf(tmp_path / "stray.gguf", extra={"blk.0.attn_q_norm": (16,)})
    with pytest.raises(GatherValueError, match=r"blk.0.attn_q_norm.weight that nothing reads"):
        check_gguf(gguf.GGUFReader(stray), stray, quantized=True)
