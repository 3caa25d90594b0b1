"""What the commands share: the int type of every option (`Int`, gatherlens.params' one rule),
lists of ints, --threads, output files never overwritten without --force, the --model/--corpus/--text options,
--quantized and its check, --sparse-prefill, --kv-dtype (each shared option declared once, here), a progress bar
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
from gatherlens.params import Int, budget_list, cpu_count, int_list, positive_ints  # noqa: F401 - the int rules


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


def threads_option(command):
    """--threads N: torch threads, in [1, the CPUs this process may use]; more is refused by name."""
    return click.option("--threads", default=None, type=Int(1, cpu_count()),
                        help=f"torch threads, 1 to {cpu_count()} (default: all of them, fewer while other "
                             f"programs keep cores busy).")(command)


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


def quantized_option(shows: str = ""):
    """--quantized, declared once: run a GGUF model from its blocks (`load(name, quantized=True)`); float32
    stays the default. shows: what the command then shows differently (one sentence of its help).

        >>> @quantized_option()                      # on a command; its value arrives as `quantized`
    """
    return click.option("--quantized", is_flag=True,
                        help="Run a GGUF model (smollm2 or a .gguf file) from its quantized blocks instead of "
                             "the float32 copy (default: float32)." + (f" {shows}" if shows else ""))


def sparse_prefill_option(shows: str = ""):
    """--sparse-prefill, declared once: prefill block-sparsely (models/attention/prefill.py, the default rule
    of gatherlens.ops.prefill). shows: what the command then shows (one sentence of its help)."""
    return click.option("--sparse-prefill", "sparse_prefill", is_flag=True,
                        help="Prefill block-sparsely: each block of the prompt attends to the key blocks it needs "
                             "(gatherlens.ops.prefill's default rule); the cache still keeps every key."
                             + (f" {shows}" if shows else ""))


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


def check_model(model: str) -> None:
    """A one-line error, before anything slow, for a --model that is not there: an unknown name, a folder
    without config.json, a .gguf that is not a GGUF (`registry.resolve`)."""
    from gatherlens.models.files.registry import resolve

    try:
        resolve(model)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None


def require_causal(model: str, what: str) -> None:
    """A one-line error, before anything loads, when `model` is not a causal LM (an encoder such as
    minilm) and `what` (a command) needs one to generate or decode (`registry.check_causal`)."""
    from gatherlens.models.files.registry import check_causal, resolve

    try:
        check_causal(resolve(model), what)
    except GatherValueError as e:
        raise click.ClickException(str(e)) from None


STOP_SIGNALS = ("SIGTERM", "SIGHUP")   # stop a command like Ctrl-C does (what `kill` and a closed terminal send)
RECEIVED: list[str] = []  # the stop signals (SIGINT too, cli.py) that reached this process, in order


HELD: list[str] = []  # a stop signal held while an import ran, until it is delivered again (`stop_received`)
REDELIVER_S = 0.05  # how soon a held stop is delivered again


def stop_received(signum, frame=None):
    """A stop signal's handler: recorded in RECEIVED, then KeyboardInterrupt (Ctrl-C's own effect), so
    a failure it causes inside a library (an import it cut short, then retried) still reads as the stop.
    Inside an import it is held instead and delivered again REDELIVER_S later (`_thread.interrupt_main`,
    again until the import is done): an import runs a C extension's initialization, which may call back
    into Python, and a KeyboardInterrupt raised there crosses C++ code that cannot pass it on (one CI run:
    SIGTERM 0.3 s into `generate`, "terminate called after throwing an instance of
    'pybind11::error_already_set'", the process aborted)."""
    import signal

    if HELD:
        HELD.clear()  # the held stop, delivered again: recorded already
    else:
        RECEIVED.append(signal.Signals(signum).name)
    if _importing(frame):
        HELD.append(signal.Signals(signum).name)
        _deliver_again(REDELIVER_S)
        return
    raise KeyboardInterrupt


def _deliver_again(seconds: float) -> None:
    """Ctrl-C again from a thread `seconds` later (`_thread.interrupt_main`): the SIGINT handler then runs anew in
    the main thread, outside whatever could not take the stop where it landed."""
    import _thread
    import signal
    import threading

    later = threading.Timer(seconds, _thread.interrupt_main, args=(signal.SIGINT,))
    later.daemon = True
    later.start()


def _importing(frame) -> bool:
    """True when `frame` (where a signal handler interrupted the main thread) runs inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def redeliver_swallowed_stop(unraisable) -> None:
    """`sys.unraisablehook` while a command runs: a stop signal's KeyboardInterrupt raised inside a finalizer (a
    library's `__del__` run by the garbage collector) cannot stop the command there, and Python would print it
    as "Exception ignored in ..." with a traceback and go on (one CI run of eval: the stop lost, the command
    finished). The stop is delivered again instead, from a thread a moment later (`_thread.interrupt_main`: the
    SIGINT handler runs anew in the main thread, by then outside the finalizer and this hook, where a signal
    handled at once would be swallowed again); anything else goes to Python's own hook."""
    import sys

    if isinstance(unraisable.exc_value, KeyboardInterrupt) and RECEIVED:
        _deliver_again(0.01)
        return
    sys.__unraisablehook__(unraisable)


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
        stop_received(signum, frame)

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


# -- sampling (ops/sampling.SamplingConfig): the options of generate and chat, declared once -------------
# option -> (SamplingConfig field, click type, help)
SAMPLING_OPTIONS = {
    "--temperature": ("temperature", float, "0 picks the most likely token (greedy); higher spreads the draw"),
    "--top-k": ("top_k", Int(0), "keep the k most likely tokens (0: off)"),
    "--top-p": ("top_p", float, "keep the most likely tokens whose probabilities add up to p (1: off)"),
    "--min-p": ("min_p", float, "keep tokens at least this share as likely as the best one (0: off)"),
    "--repeat-penalty": ("repeat_penalty", float, "divide a repeated token's logit by this (1: off)"),
    "--frequency-penalty": ("frequency_penalty", float, "minus this per earlier use of a token (0: off)"),
    "--presence-penalty": ("presence_penalty", float, "minus this once for a token used before (0: off)"),
    "--seed": ("seed", Int(), "the draw's seed: the same seed, the same text (default: a random one)"),
}


def sampling_options(base):
    """Decorator: the SAMPLING_OPTIONS on a command, handed to it as one `sampling=` SamplingConfig: `base`
    (a preset, such as ops.sampling.GREEDY) with the options given. Each option's range comes from the
    config's own checks, as one `Error: --top-p = 1.5 is outside the valid range (0, 1] ...`."""
    import functools

    def apply(command):
        @functools.wraps(command)
        def run(*args, **kw):
            given = {field: kw.pop(field) for field, _, _ in SAMPLING_OPTIONS.values()}
            kw["sampling"] = sampling_config(base, given)
            return command(*args, **kw)

        for option, (field, kind, words) in reversed(SAMPLING_OPTIONS.items()):
            run = click.option(option, field, type=kind, default=None,
                               help=f"{words} (default: {getattr(base, field)}).")(run)
        return run

    return apply


def sampling_config(base, given: dict):
    """`base` with the options that were given (not None); a click error naming the option otherwise."""
    changes = {field: value for field, value in given.items() if value is not None}
    try:
        return base.replace(**changes)
    except GatherValueError as e:
        field = str(e).split(" ", 1)[0]
        option = next((o for o, (f, _, _) in SAMPLING_OPTIONS.items() if f == field), field)
        raise click.UsageError(f"{option}{str(e)[len(field):]}") from None
