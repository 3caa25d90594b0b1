"""What the evaluation commands share: lists of positive ints, output files never overwritten
without --force, the --model/--corpus/--text options, --quantized and its check, a progress bar
and the results table.

    >>> positive_ints("8,32,8", "-k/--top-k", "k")
    [8, 32]
    >>> number(None), number(1.23456, 2)
    ('-', '1.23')
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import click

from gatherlens import outputs
from gatherlens.errors import GatherValueError


def positive_ints(value: str, hint: str, what: str) -> list[int]:
    """"8,32,128" -> [8, 32, 128] (sorted, unique); a clear error for anything else."""
    try:
        values = sorted({int(s) for s in value.split(",") if s.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of ints like 8,32,128", param_hint=hint) from None
    if not values or values[0] < 1:
        raise click.BadParameter(f"{value!r}: each {what} must be a positive int", param_hint=hint)
    return values


def output_file(path: str | None, force: bool, suffixes: tuple[str, ...], hint: str) -> Path | None:
    """A file to write (`gatherlens.outputs.output_file`'s rule), as a click error naming `hint`."""
    if path is None:
        return None
    try:
        return outputs.output_file(path, hint, force=force, suffixes=suffixes)
    except GatherValueError as e:
        raise click.BadParameter(str(e).removeprefix(f"{hint} "), param_hint=hint) from None


def text_source_options(model_help: str):
    """--model, --corpus and --text: the model and the real prose an evaluation reads."""

    def apply(command):
        for option in reversed([
            click.option("--model", "model_name", default="smollm2", show_default=True, help=model_help),
            click.option("--corpus", default="default", show_default=True,
                         help='"default" (Jane Austen if installed, else pydoc), "austen", "austen:emma", "pydoc".'),
            click.option("--text", "text_file", type=click.Path(dir_okay=False), default=None,
                         help="A UTF-8 text file to use instead of a corpus."),
        ]):
            command = option(command)
        return command

    return apply


def quantized_option(command):
    """--quantized: run a GGUF model from its blocks (`load(name, quantized=True)`); float32 stays the default."""
    return click.option("--quantized", is_flag=True,
                        help="Run a GGUF model (smollm2 or a .gguf file) from its quantized blocks instead of "
                             "the float32 copy (default: float32).")(command)


def load_kwargs(model: str, quantized: bool) -> dict:
    """What `gatherlens.models.load` gets for --quantized: {} without it; with it {"quantized": True}
    for a GGUF source, and a one-line error naming the option and the model for any other."""
    if not quantized:
        return {}
    from gatherlens.models.registry import check_quantizable, resolve

    try:
        source = resolve(model)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None
    try:
        check_quantizable(source, "--quantized")
    except GatherValueError as e:
        raise click.BadParameter(str(e), param_hint="--quantized") from None
    return {"quantized": True}


@contextlib.contextmanager
def progress_bar(console, total: int, width: int = 8):
    """A rich progress bar of `total` steps on `console`; yields advance(n, description)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[bold]{{task.description:>{width}}}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("dense", total=total)
        yield lambda n, description: bar.update(task, advance=n, description=description)


def number(x: float | None, places: int = 4) -> str:
    """A table cell: "-" for None, else `places` decimals."""
    return "-" if x is None else f"{x:.{places}f}"


def print_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """Print a results table (right-aligned columns) to stdout; the first column (a setting's name)
    left-aligned and never cut: redirected to a file, the table is as wide as it needs (up to 200)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
