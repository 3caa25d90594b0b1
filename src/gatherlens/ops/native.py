"""Small C++ kernels shipped as source, compiled once by the system compiler, loaded with ctypes.

    >>> lib = load_kernel(Path(__file__).with_name("threshold_select.cpp"))   # None: no compiler
    >>> lib.select_rows_f32(ptr, rows, L, k, vals_ptr, idx_ptr)              # releases the GIL

Like `torch.compile` on CPU (inductor's C++ backend), a kernel needs a C++ compiler ($CXX, else
`c++`/`g++`) at first use; the shared library is cached under $GATHERLENS_CACHE/native (else
$XDG_CACHE_HOME/gatherlens/native, else ~/.cache/gatherlens/native), named by a hash of the
source, the flags, the compiler and the CPU (it is built with -march=native), so later processes
load it in milliseconds. Without a compiler, or with GATHERLENS_NATIVE=0, `load_kernel` returns
None and callers take their numpy path (same results, slower).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC")
_LOADED: dict[str, ctypes.CDLL | None] = {}


def native_dir() -> Path:
    """$GATHERLENS_CACHE/native, else $XDG_CACHE_HOME/gatherlens/native, else ~/.cache/gatherlens/native."""
    root = os.environ.get("GATHERLENS_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "gatherlens")
    return Path(root) / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def load_kernel(source: Path) -> ctypes.CDLL | None:
    """The compiled library of `source` (built on first use, then cached), or None if it cannot be."""
    key = str(source)
    if key not in _LOADED:
        _LOADED[key] = None if os.environ.get("GATHERLENS_NATIVE") == "0" else _build(source)
    return _LOADED[key]


def _build(source: Path) -> ctypes.CDLL | None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
        digest = hashlib.sha256("\n".join([source.read_text(), " ".join(FLAGS), version, platform.machine(),
                                           _cpu_flags()]).encode()).hexdigest()[:16]
        lib = native_dir() / f"{source.stem}-{digest}.so"
        if not lib.exists():
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:  # build aside, then rename: a
                out = Path(tmp) / lib.name                              # reader never sees half a file
                subprocess.run([cxx, *FLAGS, str(source), "-o", str(out)], check=True,
                               capture_output=True, text=True, timeout=300)
                os.replace(out, lib)
        return ctypes.CDLL(str(lib))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        warnings.warn(f"gatherlens: could not build {source.name} ({detail.strip()[:300]}); "
                      f"using the numpy path", RuntimeWarning, stacklevel=3)
        return None
