"""Where every benchmark's results go: one JSON layout, checked before any timing starts.

    >>> path = check_json_path(Path("decode.json"), force=False)     # before the slow work
    >>> write_results(path, "decode", meta, rows, force=False)       # {"suite", "meta", "rows"}

`gatherlens bench page` turns these files into docs/benchmarks.md (bench/page.py).
"""
from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

import click

from gatherlens.errors import GatherValueError
from gatherlens.outputs import output_file, write_output


def json_option(default: str):
    """`@json_option("bench-decode.json")`: every suite's --json FILE option (the `json_path` argument)."""
    return click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
                        default=default, show_default=True, help="where to write the results")


def check_json_path(path: Path, force: bool) -> Path:
    """Refuse, before any timing, a --json path that exists (without --force) or cannot be written."""
    return check_output(path, force, "--json")


def check_output(path: Path | None, force: bool, what: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """`gatherlens.outputs.output_file`'s rule for a benchmark's output, as a click usage error."""
    if path is None:
        return None
    try:
        return output_file(path, what, force=force, suffixes=suffixes)
    except GatherValueError as e:
        raise click.UsageError(str(e)) from None


def write_results(path: Path, suite: str, meta: dict, rows: list, force: bool = True) -> None:
    """Write {"suite": suite, "meta": meta, "rows": [...]}; dataclass rows become dicts.

    The write is `gatherlens.outputs.write_output`'s: a reader never sees half a file, and with
    force=False a file that appeared since the check at the start is refused, not overwritten.
    """
    data = {"suite": suite, "meta": meta, "rows": [asdict(r) if is_dataclass(r) else r for r in rows]}
    try:
        write_output(path, json.dumps(data, indent=1), "--json", force=force)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None


def human_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: `human_seconds(0.0123)` -> '12.3 ms'."""
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def check_causal_model(model: str, what: str) -> None:
    """One `Error:` line, before any case runs, for a --model that is not there or is not a causal LM
    (an encoder such as minilm): `models.files.registry.check_causal`, from its config alone."""
    from gatherlens.models.files.registry import check_causal, resolve

    try:
        check_causal(resolve(model), what)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None
