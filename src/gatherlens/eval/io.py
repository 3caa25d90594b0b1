"""Writing quality results: one CSV/JSON writer for every report.

    >>> write_report(report, "quality.csv")      # or .json (rows + meta, per-layer values)
    >>> write_table("sparse.json", rows, TABLE_COLUMNS, meta, force=False, what="--json",
    ...             passkey=[p.as_dict() for p in trials])

The file is written by `gatherlens.outputs.write_output`: with force=False (a command without
--force) it is created exclusively, so a file that appeared since the command checked the path
at its start is refused, never overwritten; with force=True (the default of these library
calls) a temporary file beside it is renamed over it.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from gatherlens.errors import GatherValueError
from gatherlens.eval.stats import EvalReport
from gatherlens.outputs import write_output

__all__ = ["write_report", "write_table", "REPORT_FORMATS"]

REPORT_FORMATS = (".csv", ".json")


def write_table(path: str | Path, rows: list[dict], columns, meta: dict, *, force: bool = True,
                what: str = "output file", **extra) -> Path:
    """CSV (`columns` of each row) or JSON ({"meta", "rows", **extra}, all fields) by the file's extension.

    force: replace a file that exists (False: refuse it). what: the option named in errors ("--json").
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in REPORT_FORMATS:
        raise GatherValueError(f"{what} {str(path)!r} must end in .csv or .json, got {suffix or 'no extension'!r}")
    if suffix == ".json":
        return write_output(path, json.dumps({"meta": meta, "rows": rows, **extra}, indent=2) + "\n", what, force=force)
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=columns)
    w.writeheader()
    for row in rows:
        w.writerow({k: row[k] for k in columns})
    return write_output(path, text.getvalue().encode("utf-8"), what, force=force)  # bytes: the csv module's \r\n kept


def write_report(report: EvalReport, path: str | Path, *, force: bool = True, what: str = "output file") -> Path:
    """Write rows (and, for JSON, meta and per-layer values) to `path` (.csv or .json); `force` as write_table."""
    return write_table(path, report.as_dicts(), report.columns, report.meta, force=force, what=what)
