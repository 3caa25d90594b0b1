"""The peers of `gatherlens bench generate`: llama.cpp on the same GGUF, and the quantized model.

    >>> python, note = llama_python(None)          # --llama-python, else $GATHERLENS_LLAMA_PYTHON
    >>> run_llamacpp(python, gguf_of("smollm2"), prompt, threads=2)["ms"]
    22.8

llama.cpp runs under llama-cpp-python's own interpreter (an optional bench extra in its own
virtualenv, never a dependency), as bench/llamacpp_case.py in a fresh process, with the prompt
tokens our own cases used. Each peer that cannot run is skipped with a one-line note.
"""
from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path

import click

from gatherlens.bench.fresh import run_script

ENV = "GATHERLENS_LLAMA_PYTHON"
STEPS = 32  # greedy steps timed by llama.cpp; the median is its ms/token
SCRIPT = Path(__file__).with_name("llamacpp_case.py")


def llama_python(option: str | None) -> tuple[str | None, str]:
    """The interpreter that runs llama.cpp, or (None, why it is skipped).

    An explicit --llama-python that cannot import llama_cpp is an error; so is $GATHERLENS_LLAMA_PYTHON.
    """
    path = option or os.environ.get(ENV)
    if not path:
        return None, f"llama.cpp row skipped: no --llama-python and ${ENV} is not set"
    where = "--llama-python" if option else f"${ENV}"
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        what = "is a folder" if os.path.isdir(path) else "does not exist" if not os.path.lexists(path) else \
            "is not an executable file"
        raise click.BadParameter(f"{path!r} {what}: give the python of a virtualenv with llama-cpp-python",
                                 param_hint=where)
    try:
        proc = subprocess.run([path, "-c", "import llama_cpp"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise click.BadParameter(f"{path!r} cannot be run: {e}", param_hint=where) from None
    if proc.returncode != 0:
        raise click.BadParameter(f"{path!r} cannot import llama_cpp (pip install llama-cpp-python there): "
                                 f"{proc.stderr.strip().splitlines()[-1:]}", param_hint=where)
    return path, ""


def gguf_of(model_name: str) -> Path | None:
    """The model's GGUF file, or None for a Hugging Face folder (no llama.cpp or quantized rows then)."""
    from gatherlens.models.files.registry import resolve

    source = resolve(model_name)
    return source.path if source.kind == "gguf" else None


def quantized_note(gguf: Path | None) -> str:
    """Why the quantized rows are skipped ('' when `gatherlens.load(name, quantized=True)` can run)."""
    from gatherlens.models import load

    if gguf is None:
        return "quantized rows skipped: the model is not a GGUF file"
    if "quantized" not in inspect.signature(load).parameters:
        return "quantized rows skipped: gatherlens.load(name, quantized=True) is not available in this version"
    return ""


def run_llamacpp(python: str, gguf: Path, prompt: list[int], threads: int) -> dict:
    """One llama.cpp case: prefill `prompt`, time STEPS greedy steps (bench/llamacpp_case.py's result)."""
    spec = dict(gguf=str(gguf), prompt=prompt, threads=threads, steps=STEPS)
    return run_script(python, str(SCRIPT), spec)


def run_llamacpp_greedy(python: str, gguf: Path, prompt: list[int], threads: int, steps: int) -> dict:
    """llama.cpp's `steps` greedy tokens after `prompt` on the same file: {"tokens": [...]}."""
    spec = dict(gguf=str(gguf), prompt=prompt, threads=threads, greedy=steps)
    return run_script(python, str(SCRIPT), spec)
