"""What the commands share: the int type of every option (`Int`, gatherlens.params' one rule),
lists of ints, --threads, output files never overwritten without --force, the --model/--corpus/--text options, --quantized and its check, a progress bar
and the results table.

    >>> positive_ints("8,32,8", "-k/--top-k", "k")
    [8, 32]
    >>> number(None), number(1.23456, 2)
    ('-', '1.23')
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click

from gatherlens import outputs
from gatherlens.errors import GatherValueError, shorten
from gatherlens.params import check_int, parse_int


class Int(click.ParamType):
    """click's type of every int option and argument: `gatherlens.params.parse_int`'s rule (ASCII
    digits, an optional "-") and its one wording, `Error: --threads = 999 is outside the valid
    range [1, 16]`. `Int(1)` is [1, inf); `Int(1, 64)` is [1, 64]; `Int()` any int."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        name = max(param.opts, key=len) if param is not None and param.opts else "value"
        try:
            if isinstance(value, int) and not isinstance(value, bool):   # a default, or a caller's int
                return check_int(value, name, self.lo, self.hi)
            return parse_int(value, name, self.lo, self.hi)
        except GatherValueError as e:
            raise click.UsageError(str(e), ctx) from None


class Budget(Int):
    """--budget: "auto" (pages by estimated attention mass, SparseConfig's default) or an int of tokens >= 1."""

    name = "budget"

    def __init__(self):
        super().__init__(1)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return super().convert(value, param, ctx)
        except click.UsageError as e:
            raise click.UsageError(f'{e.message} (or "auto": pages by estimated attention mass)', ctx) from None


def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the system tells it): --threads' ceiling."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_option(command):
    """--threads N: torch threads, in [1, the CPUs this process may use]; more is refused by name."""
    return click.option("--threads", default=None, type=Int(1, cpu_count()),
                        help=f"torch threads, 1 to {cpu_count()} (default: all of them, fewer while other "
                             f"programs keep cores busy).")(command)


def int_list(value: str, hint: str, lo: int | None = None, hi: int | None = None) -> list[int]:
    """"3,1,4" -> [3, 1, 4]: each item by `parse_int`'s rule (spaces and empty items ignored); one
    click error naming `hint` and the bad item otherwise."""
    try:
        return [parse_int(s, hint, lo, hi) for s in value.split(",") if s.strip(" \t")]
    except GatherValueError as e:
        kind = "positive integers" if lo == 1 and hi is None else "integers"
        raise click.UsageError(f"{hint} = {shorten(value)} must be comma-separated {kind}: "
                               f"{str(e).removeprefix(f'{hint} = ')}") from None


def positive_ints(value: str, hint: str, what: str) -> list[int]:
    """"8,32,128" -> [8, 32, 128] (sorted, unique); a clear error for anything else."""
    values = sorted(set(int_list(value, hint, lo=1)))
    if not values:
        raise click.BadParameter(f"{value!r}: give at least one {what}, like 8,32,128", param_hint=hint)
    return values


def budget_list(value: str, hint: str) -> list:
    """"auto,512,256" -> ["auto", 256, 512] ("auto" first, then the ints sorted, unique); a clear error else."""
    words = [w.strip() for w in value.split(",")]
    auto = ["auto"] if "auto" in (w.lower() for w in words) else []
    rest = ",".join(w for w in words if w.lower() != "auto")
    return auto + (positive_ints(rest, hint, 'budget (or "auto")') if rest or not auto else [])


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


def kv_dtype_option(command):
    """--kv-dtype: how sparse decoding's paged cache stores keys and values (SparseConfig.kv_dtype)."""
    from gatherlens.ops.sparse.config import DEFAULT, KV_DTYPES

    default = DEFAULT.kv_dtype or "the model's own dtype"
    return click.option("--kv-dtype", "kv_dtype", type=click.Choice(KV_DTYPES), default=None,
                        help=f"Store the sparse cache's keys and values in 16 bits (float16, bfloat16: half the "
                             f"memory) or int8 (a quarter, one scale per page); default: {default}.")(command)


def load_kwargs(model: str, quantized: bool) -> dict:
    """What `gatherlens.models.load` gets for --quantized: {} without it; with it {"quantized": True}
    for a GGUF source, and a one-line error naming the option and the model for any other."""
    if not quantized:
        return {}
    from gatherlens.models.files.registry import check_quantizable, resolve

    try:
        source = resolve(model)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None
    try:
        check_quantizable(source, "--quantized")
    except GatherValueError as e:
        raise click.BadParameter(str(e), param_hint="--quantized") from None
    return {"quantized": True}


STOP_SIGNALS = ("SIGTERM", "SIGHUP")   # stop a command like Ctrl-C does (what `kill` and a closed terminal send)


@contextlib.contextmanager
def signals_as_ctrl_c():
    """`with signals_as_ctrl_c() as stop:` SIGTERM and SIGHUP raise KeyboardInterrupt inside the
    block, so they stop a command the way Ctrl-C does (its summary and files are still written);
    `stop["signal"]` then names the signal. A second one ends the process (the default action).
    Outside the main thread nothing changes."""
    import signal

    stop: dict = {"signal": None}

    def interrupt(signum, frame):
        signal.signal(signum, signal.SIG_DFL)
        stop["signal"] = signal.Signals(signum).name
        raise KeyboardInterrupt

    before = {}
    for name in STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is not None:
            try:
                before[signum] = signal.signal(signum, interrupt)
            except ValueError:   # not the main thread
                break
    try:
        yield stop
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


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
