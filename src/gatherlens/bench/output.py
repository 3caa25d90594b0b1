"""Where every benchmark's results go: one JSON layout, checked before any timing starts.

    >>> path = check_json_path(Path("decode.json"), force=False)     # before the slow work
    >>> write_results(path, "decode", meta, rows)                    # {"suite", "meta", "rows"}

`gatherlens bench page` turns these files into docs/benchmarks.md (bench/page.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path

import click

from gatherlens.errors import GatherValueError
from gatherlens.outputs import writable_file


def check_json_path(path: Path, force: bool) -> Path:
    """Refuse, before any timing, a --json path that exists (without --force) or cannot be written."""
    if path.exists() and not force:
        raise click.UsageError(f"{path} exists; pass --force to overwrite it")
    if path.is_dir():
        raise click.UsageError(f"--json {path} is a folder; give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise click.UsageError(f"folder {folder} does not exist (for --json)")
    try:  # a probe file: os.access can say yes where writing fails (root on NFS, ACLs)
        writable_file(path, "--json")
    except GatherValueError as e:
        raise click.UsageError(str(e)) from None
    return path


def write_results(path: Path, suite: str, meta: dict, rows: list) -> None:
    """Write {"suite": suite, "meta": meta, "rows": [...]}; dataclass rows become dicts."""
    data = {"suite": suite, "meta": meta, "rows": [asdict(r) if is_dataclass(r) else r for r in rows]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)  # a reader never sees half a file
