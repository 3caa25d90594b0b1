"""`gatherlens bench page`: docs/benchmarks.md from the benchmarks' JSON files.

    gatherlens bench page docs/bench/*.json --notes docs/bench/notes.md -o docs/benchmarks.md --force

Each file (written by `gatherlens bench <suite> --json`, layout in bench/output.py) becomes one
section: how it was run (its meta) and its rows as a table. The numbers live in the JSON; this page is
only their view, so it can always be regenerated.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from gatherlens.bench.output import check_output
from gatherlens.errors import GatherValueError
from gatherlens.outputs import write_output

HEADER = """# Benchmarks

Measured by `gatherlens bench <suite> --json docs/bench/<suite>.json`; this page is regenerated from
those files by
`gatherlens bench page docs/bench/*.json --notes docs/bench/notes.md -o docs/benchmarks.md --force`. Every speed is a
ratio against a baseline timed side by side in the same run (the strongest dense form where one exists:
SDPA with each KV group's query heads folded into one matmul for decode). The figures are from the
machine named in each section's meta; rerun them on yours.
"""


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(",", ":"))
        return text if len(text) <= 160 else f"({len(value)} entries: see the JSON)"
    return str(value).replace("|", "\\|")


def section(data: dict, name: str) -> str:
    """One suite's markdown: a heading, its meta as a list, its rows as a table."""
    rows = data.get("rows", [])
    suite = data.get("suite", name)
    meta = dict(data.get("meta", {}))
    profiles = meta.pop("profiles", None)
    lines = [f"## {suite}" + (f" ({name}.json)" if name != suite else ""), ""]
    lines += [f"- {k}: {_cell(v)}" for k, v in meta.items()]
    if rows:
        lines += [""] + markdown_table(rows)
    for context, by_method in (profiles or {}).items():  # bench generate --profile: {L: {method: ops}}
        for method, ops in by_method.items():
            lines += ["", f"One decode step at {context} tokens, {method}: top ops by self CPU time "
                          "(torch.profiler)", ""] + markdown_table(ops)
    return "\n".join(lines) + "\n"


def markdown_table(rows: list[dict]) -> list[str]:
    """Dict rows as markdown table lines, the first row's keys as the columns (None shows as -)."""
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return out + ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]


def page(files: list[Path], notes: Path | None = None) -> str:
    """The whole page: the header, one section per results file, then the notes file verbatim."""
    parts = [HEADER]
    for f in files:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise click.UsageError(f"cannot read benchmark results {f}: {e}") from None
        if not isinstance(data, dict) or "rows" not in data:
            raise click.UsageError(f"{f} is not a benchmark result (no 'rows'); write it with --json")
        parts.append(section(data, f.stem))
    if notes is not None:
        from gatherlens.eval.corpus import load_text

        parts.append(load_text(path=notes))   # the one rule for a user's text file: regular, UTF-8, not empty
    return "\n".join(parts)


@click.command("page")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the markdown here (default: print it)")
@click.option("--notes", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="a markdown file appended as it is (what the tables cannot say)")
@click.option("--force", is_flag=True, help="overwrite an existing --out file")
def command(files, out, notes, force):
    """Write the benchmarks page (markdown) from the JSON that `gatherlens bench ... --json` wrote."""
    check_output(out, force, "-o/--out")  # before reading the results
    text = page(list(files), notes)
    if out is None:
        click.echo(text)
        return
    try:
        write_output(out, text, "-o/--out", force=force)  # a file made meanwhile is refused without --force
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out}")
