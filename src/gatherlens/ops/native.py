"""C++ kernels shipped as source, built on first use by PyTorch's extension machinery, called as
real operators (`torch.ops.gatherlens.*`).

    >>> load_library(Path(__file__).with_name("threshold_select.cpp"), on_load=register_fakes)
    True                                        # False: no compiler, switched off, or the build failed
    >>> torch.ops.gatherlens.topk_rows(x, None, None, 8, True, 0, rows)

A kernel source defines its own operators: the schemas in `TORCH_LIBRARY_FRAGMENT(gatherlens, m)`,
the CPU kernels in `TORCH_LIBRARY_IMPL(gatherlens, CPU, m)`. The Python module beside it registers
their fake kernels (`torch.library.register_fake`) in `on_load`, so they trace under torch.compile
and show by name in the profiler. `torch.utils.cpp_extension.load` builds the source (ninja and a
C++ compiler: $CXX, else `c++`) into $GATHERLENS_CACHE/native/<stem>-<hash> (else
$XDG_CACHE_HOME/gatherlens/native, else ~/.cache/gatherlens/native); the hash covers the source,
the flags, the compiler, torch's version and the CPU (the build uses -march=native), so later
processes find it built. Without a compiler, with GATHERLENS_NATIVE=0, or when the build fails
(one GatherLensWarning line; the compiler's output is kept in build.log beside the build),
`load_library` returns False and callers take their numpy / torch path: same results, slower.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import threading
import time
import warnings
from pathlib import Path

import torch

from gatherlens.errors import GatherLensWarning
from gatherlens.paths import cache_root

# -fopenmp: at::parallel_for in a kernel runs on torch's own OpenMP threads (the process already
# holds libgomp.so.1 through torch, so the kernel links that same runtime); without it the pragma is
# ignored and the loop runs on one thread.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd", "-fopenmp")
LDFLAGS = ("-fopenmp",)
STALE_LOCK_S = 900        # a build lock older than this was left by a killed process: removed
_LOADED: dict[str, bool] = {}
_LOCK = threading.Lock()  # one build at a time in this process (worker threads may ask at once)


def native_dir() -> Path:
    """$GATHERLENS_CACHE/native, else $XDG_CACHE_HOME/gatherlens/native, else ~/.cache/gatherlens/native."""
    return cache_root() / "native"


def load_library(source: Path, on_load=None) -> bool:
    """Build (first use) and load the operators of `source`, then call on_load() once; False if it cannot be."""
    key = str(source)
    known = _LOADED.get(key)
    if known is not None:  # decided before: no lock on the hot path (a decode step asks ~100 times)
        return known
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = os.environ.get("GATHERLENS_NATIVE") != "0" and _build(source)
            if _LOADED[key] and on_load is not None:
                on_load()
        return _LOADED[key]


def _compiler() -> str | None:
    """$CXX if set (a missing one is an error worth a warning), else `c++` on PATH, else None."""
    cxx = os.environ.get("CXX")
    if cxx:
        if shutil.which(cxx) is None:
            raise FileNotFoundError(f"the compiler CXX={cxx} was not found")
        return cxx
    return shutil.which("c++")


def _build_dir(source: Path, cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = hashlib.sha256("\n".join([source.read_text(), " ".join(FLAGS + LDFLAGS), version, torch.__version__,
                                       platform.machine(), _cpu_flags()]).encode()).hexdigest()[:16]
    return native_dir() / f"{source.stem}-{digest}"


def _build(source: Path) -> bool:
    build = None
    try:
        cxx = _compiler()
        if cxx is None:
            return False                        # no compiler at all: the fallback, quietly
        build = _build_dir(source, cxx)
        library = build / f"gatherlens_{source.stem}.so"
        if library.exists() and not (build / "lock").exists():  # built before, under this very hash
            torch.ops.load_library(str(library))
        else:
            _compile_and_load(source, build)
        return True
    except Exception as e:                      # any failure to build or load: the fallback, said once
        _warn_failed(source, e, build)
        return False


def _compile_and_load(source: Path, build: Path) -> None:
    """torch.utils.cpp_extension.load into `build` (ninja: rebuilt only if out of date), its notes muted."""
    from torch.utils import cpp_extension      # imports setuptools: only when a build is due

    if not cpp_extension.is_ninja_available():
        raise FileNotFoundError("ninja is not installed (pip install ninja)")
    build.mkdir(parents=True, exist_ok=True)
    _clear_stale_lock(build / "lock")
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)            # its compiler notes: folded into our one line
    try:
        cpp_extension.load(f"gatherlens_{source.stem}", [str(source)], extra_cflags=list(FLAGS), extra_ldflags=list(LDFLAGS),
                           build_directory=str(build), is_python_module=False, verbose=False)
    finally:
        quiet.setLevel(level)


def _clear_stale_lock(lock: Path) -> None:
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
    except OSError:
        pass


def _warn_failed(source: Path, err: Exception, build: Path | None) -> None:
    """One line: what failed, the first error line of the compiler's output, where the full log is."""
    text = str(err)
    log = ""
    if build is not None and "\n" in text:
        try:
            (build / "build.log").write_text(text)
            log = f"; full log: {build / 'build.log'}"
        except OSError:
            pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = next((line for line in lines[1:] if re.search(r"error|not found", line, re.I)), lines[0] if lines else "")
    reason = re.sub(r"\s+", " ", first)[:200]
    message = (f"could not build the C++ kernel {source.name} ({type(err).__name__}: {reason}{log}); "
               f"using the numpy path (same results, slower); GATHERLENS_NATIVE=0 skips the build")
    warnings.warn_explicit(message, GatherLensWarning, filename="gatherlens", lineno=0)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()
