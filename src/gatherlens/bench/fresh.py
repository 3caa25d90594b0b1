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
        shown = {k: (f"({len(v)} items)" if isinstance(v, list) else v) for k, v in spec.items()}
        raise click.ClickException(f"case {shown} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
