"""Run one benchmark case in a fresh Python process, so that each case's peak memory and
allocator state are its own.

    >>> run_fresh("gatherlens.bench.decode", {"context": 8192, "threads": 2, ...})

The child imports `module`, reads the spec as JSON on stdin, calls `module.run_case(spec)` and
prints its result as JSON on the last line of stdout. `spec["threads"]` sets OMP_NUM_THREADS.
`run_script` does the same for a standalone script under another interpreter (a peer's virtualenv:
bench/llamacpp_case.py under llama-cpp-python's).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import click


def worker(run_case) -> None:
    """The child's side: spec on stdin, result on the last line of stdout."""
    spec = json.loads(sys.stdin.read())
    print(json.dumps(run_case(spec)))


def run_fresh(module: str, spec: dict) -> dict:
    """The parent's side: `worker(module.run_case)` in a new interpreter; its result."""
    code = f"import {module} as case; from gatherlens.bench.fresh import worker; worker(case.run_case)"
    return _run([sys.executable, "-c", code], spec)


def run_script(python: str, script: str, spec: dict) -> dict:
    """Run `python script` with the spec on stdin; its last stdout line (JSON) is the result."""
    return _run([python, script], spec)


def _run(argv: list[str], spec: dict) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]))
    proc = subprocess.run(argv, input=json.dumps(spec), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise click.ClickException(failure(spec, proc.returncode, proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def failure(spec: dict, returncode: int, stderr: str) -> str:
    """One line for a case that failed: a gatherlens error's own words; anything else (a traceback, a
    signal) as an internal error whose full output is kept in a file, never printed raw."""
    import re
    import tempfile

    shown = ", ".join(f"{k}={v}" for k, v in spec.items() if k in ("model", "gguf", "case", "context", "threads"))
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    said = re.match(r"^(?:[\w.]+\.)?Gather\w*Error: (.*)$", last)
    if said:
        return f"{said[1]} (case {shown})"
    fd, path = tempfile.mkstemp(prefix="gatherlens-bench-case-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(f"spec: {json.dumps(spec)}\nexit status: {returncode}\n\n{stderr}")
    why = f"exit status {returncode}" if not last else last[:200]
    return f"internal error in a benchmark case ({shown}): {why}; its full output is in {path}. Please report it"
