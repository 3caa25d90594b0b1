"""C++ kernels shipped as source, built on first use by PyTorch's extension machinery, called as
real operators (`torch.ops.gatherlens.*`).

    >>> load_library(Path(__file__).with_name("threshold_select.cpp"), on_load=register_fakes)
    True                                        # False: no compiler and no sound build, switched off, failed
    >>> torch.ops.gatherlens.topk_rows(x, None, None, 8, True, 0, rows)

A kernel source defines its own operators: the schemas in `TORCH_LIBRARY_FRAGMENT(gatherlens, m)`,
the CPU kernels in `TORCH_LIBRARY_IMPL(gatherlens, CPU, m)`. The Python module beside it registers
their fake kernels (`torch.library.register_fake`) in `on_load`, so they trace under torch.compile
and show by name in the profiler. `torch.utils.cpp_extension.load` builds the source (ninja and a
C++ compiler: $CXX, else `c++`; `#include "x.h"` is looked up beside the source and in ops/include)
into $GATHERLENS_CACHE/native/<stem>-<hash> (else $XDG_CACHE_HOME/gatherlens/native, else
~/.cache/gatherlens/native); the hash covers the source and every local header it includes, the
flags, the compiler, torch's version and the CPU (the build uses -march=native), so later
processes find it built. $GATHERLENS_NATIVE_CFLAGS adds flags after those (`-mno-avx512f -mno-avxvnni`:
the AVX2 loops on an AVX-512 machine, to measure them or check them against the reference): another
hash, another build. Setup copies each sound build into the environment's own folder
(`installed_dir()`: <sys.prefix>/share/gatherlens/native, `python -m gatherlens.ops.kernels --install`),
which is looked in first: an empty or new cache ($GATHERLENS_CACHE) then needs no build.

Nothing unverified is loaded: a finished build writes `gatherlens-native.json` (the library's size
and xxh3-128) and a load checks the library against it first. A build runs in a temporary folder
`.<stem>-<hash>.tmp-*` beside its place, under the `flock` of `.<stem>-<hash>.lock`
(`gatherlens.filelock`: the kernel drops it when its process dies, so a killed build never blocks
the next one, and torch's own `lock` file only ever sits in a temporary folder the next holder
removes), then moves into place. A damaged build (truncated, garbage) is rebuilt, said in one
GatherLensWarning line; a process waits at most BUILD_WAIT_S for another's build (one line when
it starts waiting), then takes its fallback. Without a compiler a sound build made earlier still
loads. Without one and without such a build, with GATHERLENS_NATIVE=0, or when the build fails
(one GatherLensWarning line; the compiler's output is kept in build.log in the build's folder),
`load_library` returns False and callers take their numpy / torch path: slower, and the same results except that a quantized
model without the q8act operator rounds differently (its text may change slightly).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import secrets
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import torch
import xxhash

from gatherlens.errors import GatherLensWarning
from gatherlens.filelock import Busy, hold, holder, remove, sweep_name, temp_prefix, trash_prefix
from gatherlens.paths import cache_root

# -fopenmp: at::parallel_for in a kernel runs on torch's own OpenMP threads (the process already
# holds libgomp.so.1 through torch, so the kernel links that same runtime); without it the pragma is
# ignored and the loop runs on one thread.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd", "-fopenmp")
LDFLAGS = ("-fopenmp",)
INCLUDE = Path(__file__).with_name("include")  # headers shared by several kernels
MANIFEST = "gatherlens-native.json"           # written last: a folder without it holds no finished build
BUILD_WAIT_S = 300.0      # the longest wait for another process's build (one takes 15-60 s), then the fallback
_LOADED: dict[str, bool] = {}
_LOCK = threading.Lock()  # one build at a time in this process (worker threads may ask at once)
_INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def native_dir() -> Path:
    """$GATHERLENS_CACHE/native, else $XDG_CACHE_HOME/gatherlens/native, else ~/.cache/gatherlens/native."""
    return cache_root() / "native"


def installed_dir() -> Path:
    """Where setup installs the kernels it built, beside the package's environment:
    $GATHERLENS_NATIVE_INSTALLED, else <sys.prefix>/share/gatherlens/native (a venv's own folder)."""
    return Path(os.environ.get("GATHERLENS_NATIVE_INSTALLED") or Path(sys.prefix) / "share" / "gatherlens" / "native")


def load_library(source: Path, on_load=None) -> bool:
    """Build (first use) and load the operators of `source`, then call on_load() once; False if it cannot be."""
    key = str(source)
    if _LOADED.get(key):  # loaded before: no lock on the hot path (a decode step asks ~100 times)
        return True
    # a failure is remembered for the cache folder it was tried in ($GATHERLENS_CACHE may change in a process)
    failed = f"{key}\0{os.environ.get('GATHERLENS_NATIVE')}\0{native_dir()}"
    if failed in _LOADED:
        return False
    with _LOCK:
        if key not in _LOADED and failed not in _LOADED:
            ok = os.environ.get("GATHERLENS_NATIVE") != "0" and _build(source)
            _LOADED[key if ok else failed] = ok
            if ok and on_load is not None:
                on_load()
        return _LOADED.get(key, False)


def _compiler() -> str | None:
    """$CXX if set (a missing one is an error worth a warning), else `c++` on PATH, else None."""
    cxx = os.environ.get("CXX")
    if cxx:
        if shutil.which(cxx) is None:
            raise FileNotFoundError(f"the compiler CXX={cxx} was not found")
        return cxx
    return shutil.which("c++")


def _build(source: Path) -> bool:
    build, doing = None, "build"
    try:
        key = _key(source)
        if _load_sound(installed_dir(), source, key):  # installed by setup: no build, whatever the cache
            return True
        try:
            cxx = _compiler()
        except FileNotFoundError:
            if _load_any_sound(source, key):    # built earlier (with another compiler): still good
                return True
            raise
        if cxx is None:                         # no compiler at all: a sound earlier build, else the fallback
            return _load_any_sound(source, key)
        build = _build_dir(key, source, cxx)
        library, _ = _verified(build, key)
        if library is None:
            return _build_locked(source, build, key)
        doing = "load"
        torch.ops.load_library(str(library))    # built before under this very hash, and sound
        return True
    except Exception as e:                      # any failure to build or load: the fallback, said once
        _warn_failed(source, e, build, doing)
        return False


def cflags() -> tuple[str, ...]:
    """The compiler flags of a build: FLAGS, then any of $GATHERLENS_NATIVE_CFLAGS (split on spaces)."""
    return FLAGS + tuple(os.environ.get("GATHERLENS_NATIVE_CFLAGS", "").split())


def _key(source: Path) -> str:
    """What a build depends on besides the compiler: source and local headers, flags, torch, the CPU."""
    parts = [source.read_text(), *_headers(source), " ".join(cflags() + LDFLAGS), torch.__version__,
             platform.machine(), _cpu_flags()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _headers(source: Path) -> list[str]:
    """Name and text of every local header `source` includes (`#include "x.h"`), and theirs, once each."""
    seen: dict[Path, str] = {}
    todo = [source]
    while todo:
        for name in _INCLUDE_LINE.findall(todo.pop().read_text()):
            found = next((d / name for d in _include_dirs(source) if (d / name).is_file()), None)
            if found is not None and found.resolve() not in seen:
                seen[found.resolve()] = f"{name}\n{found.read_text()}"
                todo.append(found)
    return [seen[p] for p in sorted(seen)]


def _include_dirs(source: Path) -> list[Path]:
    return [d for d in (source.parent, INCLUDE) if d.is_dir()]


def _build_dir(key: str, source: Path, cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    return native_dir() / f"{source.stem}-{hashlib.sha256((key + version).encode()).hexdigest()[:16]}"


def _verified(build: Path, key: str) -> tuple[Path | None, str]:
    """(the library, "") when `build`'s manifest vouches for it; else (None, what is wrong: "" if unbuilt)."""
    try:
        manifest = json.loads((build / MANIFEST).read_text())
        name, size, digest = manifest["library"], manifest["size"], manifest["xxh3_128"]
    except FileNotFoundError:
        return None, ""                         # never built, or the build did not finish: build, quietly
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"its {MANIFEST} is unreadable ({type(e).__name__})"
    if manifest.get("key") != key or not isinstance(name, str) or Path(name).name != name:
        return None, f"its {MANIFEST} belongs to another build"
    library = build / name
    try:
        data = library.read_bytes()
    except OSError as e:
        return None, f"{name} cannot be read ({e.strerror or type(e).__name__})"
    if len(data) != size:
        return None, f"{name} is {len(data):,} bytes, {size:,} were built"
    if xxhash.xxh3_128_hexdigest(data) != digest:
        return None, f"{name} does not match its recorded hash"
    return library, ""


def _load_any_sound(source: Path, key: str) -> bool:
    """Without a compiler: load a sound build of `source` made earlier (any compiler), newest first."""
    return _load_sound(native_dir(), source, key)


def _load_sound(folder: Path, source: Path, key: str) -> bool:
    """Load the newest sound build of `source` (this very key, any compiler) found in `folder`."""
    folders = sorted(folder.glob(f"{source.stem}-*"), key=_mtime, reverse=True)
    library = next((lib for lib in (_verified(f, key)[0] for f in folders) if lib is not None), None)
    if library is not None:
        torch.ops.load_library(str(library))
    return library is not None


def install_builds(sources: list[Path]) -> dict[str, str]:
    """Copy the sound cache build of each source into `installed_dir()` (setup runs this after
    building), so a process with an empty or new cache loads them at once; {source name: what happened}.
    Each copy lands whole (a temporary folder renamed into place) and is verified again when loaded."""
    done = {}
    for source in sources:
        key = _key(source)
        installed = [f for f in installed_dir().glob(f"{source.stem}-*") if _verified(f, key)[0] is not None]
        if installed:
            done[source.name] = f"installed in {installed[0]}"
            continue
        found = [f for f in sorted(native_dir().glob(f"{source.stem}-*"), key=_mtime, reverse=True)
                 if _verified(f, key)[0] is not None]
        if not found:
            done[source.name] = "no sound build to install"
            continue
        target = installed_dir() / found[0].name
        try:
            _copy_whole(found[0], target)
            done[source.name] = f"installed in {target}"
        except OSError as e:
            done[source.name] = f"not installed ({e.strerror or type(e).__name__}: {target})"
    return done


def _copy_whole(build: Path, target: Path) -> None:
    """`build` copied to `target`, replacing an older copy only once the new one is complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f"{temp_prefix(target)}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        shutil.copytree(build, temp, ignore=shutil.ignore_patterns("*.o", "*.ninja", ".ninja*", "lock"))
        trash = target.parent / f"{trash_prefix(target)}{os.getpid()}"
        if target.exists():
            os.replace(target, trash)
        os.replace(temp, target)
        remove(trash)
    finally:
        remove(temp)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _build_locked(source: Path, build: Path, key: str) -> bool:
    """Build under `build`'s flock (waiting at most BUILD_WAIT_S for another process), then load."""
    build.parent.mkdir(parents=True, exist_ok=True)
    try:
        with hold(build, timeout=BUILD_WAIT_S, on_wait=lambda pid: _warn(
                f"waiting for another process building the C++ kernel {source.name} (pid {pid}), "
                f"at most {BUILD_WAIT_S:g} s")):
            library, problem = _verified(build, key)   # the process we waited for may have built it
            if library is not None:
                torch.ops.load_library(str(library))
                return True
            if problem:
                _warn(f"the built C++ kernel {source.name} in {build} is damaged ({problem}); rebuilding it")
            _compile_and_load(source, build, key)
            return True
    except Busy:
        _warn(f"gave up waiting {BUILD_WAIT_S:g} s for process {holder(build)}, which is building the C++ "
              f"kernel {source.name}; using the torch / numpy path in this process (slower; a quantized model "
              f"may give slightly different text)")
        return False


def _compile_and_load(source: Path, build: Path, key: str) -> None:
    """Build into a fresh temporary folder (loading it), write its manifest, move it into `build`'s place.

    Called holding `build`'s lock: a killed build's temporary folder (with torch's own `lock` file in
    it) and trash are a dead process's, removed first."""
    sweep_name(build)
    with contextlib.suppress(OSError):
        (build / "lock").unlink()               # torch's baton in a folder of an older layout
    temp = build.parent / f"{temp_prefix(build)}{os.getpid()}-{secrets.token_hex(4)}"
    temp.mkdir()                                # the umask's mode, as the folder it replaces
    try:
        library = Path(_cpp_load(source, temp))
        data = library.read_bytes()
        manifest = {"source": source.name, "key": key, "library": library.name, "size": len(data),
                    "xxh3_128": xxhash.xxh3_128_hexdigest(data)}
        (temp / f".{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=1) + "\n")
        os.replace(temp / f".{MANIFEST}.tmp", temp / MANIFEST)
        trash = build.parent / f"{trash_prefix(build)}{os.getpid()}"
        if build.exists():
            os.replace(build, trash)            # a damaged or older build: aside, then removed
        os.replace(temp, build)
        remove(trash)
    finally:
        remove(temp)                            # gone after the move; a failed build's folder removed


def _cpp_load(source: Path, folder: Path) -> str:
    """torch.utils.cpp_extension.load into `folder` (built and loaded); the library's path. Its notes muted."""
    from torch.utils import cpp_extension      # imports setuptools: only when a build is due

    if not cpp_extension.is_ninja_available():
        raise FileNotFoundError("ninja is not installed (pip install ninja)")
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)            # its compiler notes: folded into our one line
    try:
        return cpp_extension.load(f"gatherlens_{source.stem}", [str(source)], extra_cflags=list(cflags()),
                                  extra_ldflags=list(LDFLAGS), extra_include_paths=[str(d) for d in _include_dirs(source)],
                                  build_directory=str(folder), is_python_module=False, verbose=False)
    finally:
        quiet.setLevel(level)


def _warn(message: str) -> None:
    warnings.warn_explicit(message, GatherLensWarning, filename="gatherlens", lineno=0)


def _warn_failed(source: Path, err: Exception, build: Path | None, doing: str) -> None:
    """One line: what failed, the first error line of the compiler's output, where the full log is."""
    text = str(err)
    log = ""
    if build is not None and "\n" in text:
        try:
            build.mkdir(parents=True, exist_ok=True)
            (build / "build.log").write_text(text)
            log = f"; full log: {build / 'build.log'}"
        except OSError:
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((line for line in lines[1:] if re.search(r"error|not found", line, re.I)), lines[0] if lines else "")
    reason = re.sub(r"\s+", " ", first)[:200]
    _warn(f"could not {doing} the C++ kernel {source.name} ({type(err).__name__}: {reason}{log}); "
          f"using the torch / numpy path (slower; a quantized model without q8act may give slightly "
          f"different text); GATHERLENS_NATIVE=0 skips the build")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()
