"""The command line: a thin layer over the library.

    gatherlens explain "The cat sat on the mat."   # the main job (a report of every gather)
    gatherlens gather --shape 4,5 --dim 0 --index 2,0,3    # draw one toy gather
    gatherlens bench embedding|attention|decode
    gatherlens eval | eval-sparse | eval-prefill | eval-long
    gatherlens cache list|clear                    # the converted models on this machine

Each command lives in its own module under `gatherlens.commands`, imported when it is asked for.
`--help` imports every one for its one-line help, so none imports torch at its top: `gatherlens
--help` and `gatherlens cache list` answer without torch or transformers (tests/test_architecture.py
runs both in a fresh process).

No traceback reaches the user: a bad input or an environment fault (a read-only disk, a folder
removed meanwhile) is one `Error:` line; an unexpected internal error is one line that says where
its full traceback was written. gatherlens' warnings are one `warning:` line each.
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings

import click

# name -> "module:attribute" of a click command; imported on first use.
COMMANDS = {
    "explain": "gatherlens.commands.explain:explain",
    "gather": "gatherlens.commands.gather:gather",
    "bench": "gatherlens.commands.bench:bench",
    "eval": "gatherlens.commands.evaluate:evaluate",
    "eval-sparse": "gatherlens.commands.evaluate_sparse:evaluate_sparse",
    "eval-prefill": "gatherlens.commands.evaluate_prefill:evaluate_prefill",
    "eval-long": "gatherlens.commands.evaluate_long:evaluate_long",
    "generate": "gatherlens.commands.generate:generate",
    "lookup": "gatherlens.commands.lookup:lookup",
    "dist": "gatherlens.commands.dist:dist",
    "cache": "gatherlens.commands.cache:cache",
    "serve": "gatherlens.commands.serve:serve",
    "chat": "gatherlens.commands.chat:chat",
}

HINTS = {
    errno.ENOENT: " (was it, or its folder, removed meanwhile?)",
    errno.ENOSPC: " (the disk is full: free some space, or write elsewhere)",
    errno.EDQUOT: " (over the disk quota: free some space, or write elsewhere)",
    errno.EROFS: " (a read-only disk: write elsewhere)",
    errno.EACCES: " (no permission: write elsewhere)",
}
LONG = re.compile(r"\S{201,}")  # a pasted blob in a message: shown as its first 40 characters


class LazyGroup(click.Group):
    """A click group whose subcommands are imported when they are asked for."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def main(self, args=None, *rest, **kw):
        """The command line's entry; run from a shell (no `args`), a stop signal once the command has
        returned is ignored: it would only interrupt the interpreter's own shutdown, which then prints
        "Exception ignored in ... KeyboardInterrupt" with a traceback."""
        if args is None:  # Ctrl-C recorded as it stops (commands/params.py's stop_received), never lost in a finalizer
            from gatherlens.commands.params import redeliver_swallowed_stop, stop_received

            with contextlib.suppress(ValueError, OSError, AttributeError):
                signal.signal(signal.SIGINT, stop_received)
                sys.unraisablehook = redeliver_swallowed_stop
        try:
            return super().main(args, *rest, **kw)
        finally:
            if args is None:
                for name in ("SIGINT", "SIGTERM", "SIGHUP"):
                    with contextlib.suppress(ValueError, OSError, AttributeError):
                        signal.signal(getattr(signal, name), signal.SIG_IGN)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            e.message = shorten_long(e.message)
            raise
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError:  # the reader of our output went away (| head): stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(1) from None
        except Exception as e:  # noqa: BLE001 - the one place every failure becomes one line
            from gatherlens.commands.params import RECEIVED

            if RECEIVED:  # a stop signal cut a library's work short and it failed afterwards: the stop, not a fault
                raise click.exceptions.Abort() from None
            raise click.ClickException(shorten_long(one_line(e))) from None


def one_line(e: BaseException) -> str:
    """A user's error, an environment fault or an internal error as one line of text."""
    from gatherlens.errors import GatherLensError

    if isinstance(e, GatherLensError):
        return str(e)
    if isinstance(e, OSError):  # an environment fault: say which path and what to do
        path = getattr(e, "filename2", None) or e.filename  # a rename's target is the user's path
        where = f": {str(path)!r}" if path else ""
        return f"{e.strerror or e}{where}{HINTS.get(e.errno, '')}"
    if isinstance(e, MemoryError):
        return "out of memory; try a shorter input or a smaller setting"
    path = save_traceback(e)
    return (f"internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            f"the full traceback is in {path}. Please report it")


def save_traceback(e: BaseException) -> str:
    """Write `e`'s traceback to a temporary file; its path (or where it could not go)."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        fd, path = tempfile.mkstemp(prefix=f"gatherlens-error-{time.strftime('%Y%m%d-%H%M%S')}-",
                                    suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(f"gatherlens {' '.join(sys.argv[1:])}\n\n{text}")
        return path
    except OSError as err:
        return f"(nowhere: {err.strerror}; set TMPDIR to a writable folder)"


def shorten_long(message: str) -> str:
    """Cut any run of over 200 non-space characters (a pasted number or list) to 40 + '…'.

    >>> shorten_long("could not read '" + "9" * 5000 + "';")
    "could not read '999999999999999999999999999999999999999…' (5,003 characters);"
    """
    def cut(m: re.Match) -> str:
        tail = re.search(r"\W{0,4}$", m[0])[0]          # closing quotes and brackets
        sep = tail[-1] if tail and tail[-1] in ";:,." else ""
        return f"{m[0][:40]}…{tail[:len(tail) - len(sep)]} ({len(m[0]):,} characters){sep}"

    return LONG.sub(cut, message)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if category.__name__ == "GatherLensWarning":
        click.echo(f"warning: {message}", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gatherlens")
def main():
    """gatherlens: every gather in a Transformer, done right and drawn."""
    warnings.showwarning = _show_warning


if __name__ == "__main__":
    main()
