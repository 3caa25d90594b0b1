"""The native build cache (ops/native.py): damaged builds, builds killed midway, a live builder
waited for, no compiler, installed builds, and the build hash over local headers."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fault_helpers import needs_compiler  # noqa: E402

from gatherlens.errors import GatherLensWarning  # noqa: E402


# -- the native build cache (ops/native.py) ------------------------------------------------------


TINY_OP = Path(__file__).parent / "native" / "tiny_op.cpp"   # one int operator: a build costs seconds


LOAD_TINY = ("import sys, torch; from pathlib import Path; from gatherlens.ops.native import load_library; "
             "ok = load_library(Path(sys.argv[1])); "
             "print('loaded', ok, torch.ops.gatherlens_test.twice(21) if ok else None, flush=True)")


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


def test_extra_compiler_flags_from_the_environment_make_another_build(tmp_path, monkeypatch):
    """$GATHERLENS_NATIVE_CFLAGS (the AVX2 loops on an AVX-512 machine: `-mno-avx512f`) come after FLAGS and
    enter the build's hash: a build with them never stands in for one without."""
    from gatherlens.ops import native

    source = tmp_path / "k.cpp"
    source.write_text("int k() { return 1; }\n")
    monkeypatch.delenv("GATHERLENS_NATIVE_CFLAGS", raising=False)
    plain = native._key(source)
    assert native.cflags() == native.FLAGS
    monkeypatch.setenv("GATHERLENS_NATIVE_CFLAGS", "-mno-avx512f  -mno-avxvnni")
    assert native.cflags() == (*native.FLAGS, "-mno-avx512f", "-mno-avxvnni") and native._key(source) != plain
