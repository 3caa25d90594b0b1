"""Writing quality results: one CSV/JSON writer for every report.

    >>> write_report(report, "quality.csv")      # or .json (rows + meta, per-layer values)
    >>> write_table("sparse.json", rows, TABLE_COLUMNS, meta, passkey=[p.as_dict() for p in trials])
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from gatherlens.errors import GatherValueError
from gatherlens.eval.stats import EvalReport

__all__ = ["write_report", "write_table", "REPORT_FORMATS"]

REPORT_FORMATS = (".csv", ".json")


def write_table(path: str | Path, rows: list[dict], columns, meta: dict, **extra) -> Path:
    """CSV (`columns` of each row) or JSON ({"meta", "rows", **extra}, all fields) by the file's extension."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in REPORT_FORMATS:
        raise GatherValueError(f"output file {str(path)!r} must end in .csv or .json, got {suffix or 'no extension'!r}")
    if suffix == ".json":
        path.write_text(json.dumps({"meta": meta, "rows": rows, **extra}, indent=2) + "\n")
        return path
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in rows:
            w.writerow({k: row[k] for k in columns})
    return path


def write_report(report: EvalReport, path: str | Path) -> Path:
    """Write rows (and, for JSON, meta and per-layer values) to `path` (.csv or .json)."""
    return write_table(path, report.as_dicts(), report.columns, report.meta)
