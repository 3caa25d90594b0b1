"""Shared helpers of the fault tests (tests/test_faults_*.py): the cache fixtures, the fork server
of tests/fault_worker.py, a simulated read-only folder, the CLI runner that fails on a traceback.

Test modules import the fixtures by name (pytest finds them in the module's namespace).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
import fault_worker  # noqa: E402

from gatherlens.cli import main  # noqa: E402
from gatherlens.errors import GatherLensWarning, GatherValueError  # noqa: E402
from gatherlens.models import loading  # noqa: E402

WORKER = Path(fault_worker.__file__)
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None or shutil.which("ninja", path=os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")])) is None, reason="no C++ compiler or ninja")


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


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("Error:")]


def cpus() -> int:
    from gatherlens.commands.params import cpu_count

    return cpu_count()


def smollm2_path() -> Path:
    from gatherlens.models import resolve

    try:
        return resolve("smollm2").path
    except GatherValueError as e:   # the model package is not installed
        pytest.skip(str(e))


# -- a real full disk and a real file-size limit, in a child process ----------------------------
def small_disk_available() -> bool:
    """Whether this machine lets a process mount a tmpfs of its own (a private mount namespace)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True, timeout=60)
    return probe.returncode == 0


def on_small_disk(script: str, size_kb: int, mount: Path, *args: str, timeout: float = 600, **env) -> dict:
    """Run `script` (python -c, with `args`) with a tmpfs of `size_kb` KiB mounted at `mount` in a private
    mount namespace (the mount dies with the process; nothing outside sees it); its last stdout line,
    JSON. The script finds the mount in $SMALL_DISK and checks what is left on it before it exits."""
    if not small_disk_available():
        pytest.skip("no private tmpfs here (unshare -m and mount need CAP_SYS_ADMIN)")
    mount.mkdir(parents=True, exist_ok=True)
    shell = f'mount -t tmpfs -o size={size_kb}k tmpfs "$SMALL_DISK" && exec "$SMALL_PYTHON" -c "$SMALL_SCRIPT" "$@"'
    full = {**os.environ, **env, "SMALL_DISK": str(mount), "SMALL_PYTHON": sys.executable, "SMALL_SCRIPT": script}
    out = subprocess.run(["unshare", "-m", "bash", "-c", shell, "bash", *args], capture_output=True, text=True,
                         timeout=timeout, env=full)
    assert out.returncode == 0 and out.stdout.strip(), (out.returncode, out.stdout[-3000:], out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def with_file_limit(limit_bytes: int):
    """A preexec_fn for subprocess: files this process writes stop at `limit_bytes` (`ulimit -f`); a
    write past it fails with EFBIG (File too large): Python ignores SIGXFSZ."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
