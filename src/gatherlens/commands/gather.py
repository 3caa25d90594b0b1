"""`gatherlens gather`: draw one toy gather from the command line.

    gatherlens gather --shape 4,5 --dim 0 --index "[[0,2,1,3,0]]"          # torch.gather, terminal
    gatherlens gather --shape 4,5 --op index_select --dim 1 --index 3,0 -o pick.svg
    gatherlens gather --values "[[10,30,20]]" --op take_along_dim --dim 1 --index "[[0,2,1]]"
    gatherlens gather --op embedding --ids 3,1,4 --vocab 10 --dim 6 --labels The,cat,sat -o emb.html
    gatherlens gather --mistakes --lang zh -o mistakes.png                # the article's mistakes

The output format follows the file's extension (.svg, .html, .png); without -o the picture is
printed to the terminal. An existing file is never overwritten without --force.
"""
from __future__ import annotations

import ast
import math
from pathlib import Path

import click

from gatherlens.commands.params import Int, int_list, output_file
from gatherlens.drawable import picture_suffixes
from gatherlens.i18n import LANGS


def _parse_nested(value: str, what: str):
    """'[[0,2],[1,0]]' or '2,0,3' or '4' -> nested lists of numbers."""
    text = value.strip()
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise click.BadParameter(
            f"could not read {text!r}; write numbers like 2,0,3 or nested lists like "
            f"[[0,2],[1,0]]", param_hint=what) from None
    if isinstance(parsed, tuple):
        parsed = list(parsed)

    def check(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                check(y)
        elif isinstance(x, bool) or not isinstance(x, (int, float)):
            raise click.BadParameter(f"{x!r} in {text!r} is not a number", param_hint=what)

    check(parsed)
    return parsed


def _tensor(value: str, what: str, integer: bool):
    import torch

    data = _parse_nested(value, what)
    try:
        t = torch.tensor(data)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(f"{value!r} is not a rectangular array ({e})",
                                 param_hint=what) from None
    if integer and t.is_floating_point():
        raise click.BadParameter(f"{value!r} must hold integers", param_hint=what)
    return t


TOY_LIMIT = 10**6  # elements of a toy source: a picture, not a workload


def _shape(value: str):
    dims = int_list(value.replace("x", ","), "--shape")
    if not dims or any(d <= 0 for d in dims) or len(dims) > 5:
        raise click.BadParameter(f"{value!r}: give 1 to 5 positive sizes, like 4,5",
                                 param_hint="--shape")
    if math.prod(dims) > TOY_LIMIT:
        raise click.BadParameter(f"{value!r} has {math.prod(dims):,} elements; a toy picture takes at "
                                 f"most {TOY_LIMIT:,}", param_hint="--shape")
    return dims


def _toy_table(vocab: int, d: int):
    """(V, d) table whose values say where they are: W[r, c] = r + c/10 (or r*d + c)."""
    import torch

    rows = torch.arange(vocab).unsqueeze(1)  # (V, 1)
    cols = torch.arange(d).unsqueeze(0)  # (1, d)
    return (rows + cols / 10) if d <= 10 else (rows * d + cols).float()  # (V, d)


def _build(op, shape, values, dim, index, ids, vocab, labels, lang):
    import torch

    from gatherlens.trace import (record_embedding, record_gather, record_index_select,
                                  record_take_along_dim)

    if op == "embedding":
        if ids is None:
            raise click.UsageError("--op embedding needs --ids (e.g. --ids 3,1,4)")
        if values is not None:
            table = _tensor(values, "--values", integer=False).float()
        else:
            d = 6 if dim is None else dim
            if vocab is None or vocab <= 0 or d <= 0:
                raise click.UsageError("--op embedding needs --vocab V > 0 (and --dim d > 0, "
                                       "the embedding width) or a --values table")
            if vocab * d > TOY_LIMIT:
                raise click.UsageError(f"--vocab {vocab} x --dim {d} = {vocab * d:,} elements; a toy "
                                       f"table takes at most {TOY_LIMIT:,}")
            table = _toy_table(vocab, d)
        id_t = _tensor(ids, "--ids", integer=True)
        toks = [t for t in labels.split(",")] if labels is not None else None
        if toks is not None and len(toks) != id_t.numel():
            raise click.UsageError(f"--labels has {len(toks)} names for {id_t.numel()} ids; give one per id "
                                   f"(e.g. The,cat,sat for --ids 3,1,4)")
        return record_embedding(id_t, table, labels=toks, lang=lang)
    for name, given in (("--ids", ids), ("--vocab", vocab), ("--labels", labels)):
        if given is not None:   # not silently ignored: it would draw something else than the user asked for
            raise click.UsageError(f"{name} applies to --op embedding only; --op {op} takes --shape or --values "
                                   f"and --index")
    if (shape is None) == (values is None):
        raise click.UsageError("give the source as exactly one of --shape 4,5 or --values "
                               "\"[[1,2],[3,4]]\"")
    if values is not None:
        src = _tensor(values, "--values", integer=False)
    else:
        dims = _shape(shape)
        n = 1
        for s in dims:
            n *= s
        src = torch.arange(n, dtype=torch.float32).view(*dims)
    if index is None:
        raise click.UsageError(f"--op {op} needs --index (e.g. --index \"[[0,2],[1,0]]\")")
    idx = _tensor(index, "--index", integer=True)
    if op == "gather":
        return record_gather(src, 0 if dim is None else dim, idx, lang=lang)
    if op == "index_select":
        return record_index_select(src, 0 if dim is None else dim, idx, lang=lang)
    return record_take_along_dim(src, idx, dim, lang=lang)


@click.command("gather")
@click.option("--op", type=click.Choice(["gather", "index_select", "take_along_dim", "embedding"]),
              default="gather", show_default=True, help="Which gather to draw.")
@click.option("--shape", help="Source shape, e.g. 4,5 (values 0, 1, 2, ... in order).")
@click.option("--values", help="Source values as nested lists, e.g. \"[[1,2],[3,4]]\".")
@click.option("--dim", type=Int(), default=None,
              help="Gathered dimension (default 0); for --op embedding the table width d.")
@click.option("--index", help="Index as nested lists, e.g. \"[[0,2],[1,0]]\", or 2,0,3.")
@click.option("--ids", help="Token ids for --op embedding, e.g. 3,1,4 or \"[[3,1],[4,1]]\".")
@click.option("--vocab", type=Int(), default=None, help="Vocabulary size V for --op embedding.")
@click.option("--labels", help="Token strings for the ids, comma separated: The,cat,sat.")
@click.option("--mistakes", is_flag=True, help="Draw the article's two mistakes beside the fix.")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Caption language.")
@click.option("-o", "--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to FILE (.svg, .html or .png); default: draw in the terminal.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.option("--max-rows", type=Int(2, 200), default=10, show_default=True,
              help="Rows shown before eliding with '...'.")
@click.option("--max-cols", type=Int(2, 200), default=10, show_default=True,
              help="Columns shown before eliding with '...'.")
def gather(op, shape, values, dim, index, ids, vocab, labels, mistakes, lang, out, force,
           max_rows, max_cols):
    """Draw a toy gather: source grid, index grid, output grid, coloured by where each
    output element came from."""
    from gatherlens.errors import GatherLensError
    from gatherlens.outputs import write_output
    from gatherlens.render import picture_file
    from gatherlens.render.layout import Limits

    out = output_file(out, force, picture_suffixes(), "-o/--out")  # the output rule, before drawing
    limits = Limits(rows=max_rows, cols=max_cols)
    try:
        if mistakes:
            _print_or_write_mistakes(out, lang, force)
            return
        rec = _build(op, shape, values, dim, index, ids, vocab, labels, lang)
        if out is None:
            rec.print_terminal(lang=lang, limits=limits)
            return
        picture = picture_file(out.suffix, lambda: rec.to_svg(lang=lang, limits=limits),
                               lambda: rec.to_html(lang=lang, limits=limits))
        write_output(out, picture, "-o/--out", force=force)  # a file made meanwhile is refused without --force
    except GatherLensError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out}", err=True)


def _print_or_write_mistakes(out: Path | None, lang: str, force: bool) -> None:
    from gatherlens.outputs import write_output
    from gatherlens.render import mistakes, picture_file

    if out is None:
        mistakes.print_mistakes(lang)
        return
    picture = picture_file(out.suffix, lambda: mistakes.mistakes_svg(lang), lambda: mistakes.mistakes_html(lang))
    write_output(out, picture, "-o/--out", force=force)
    click.echo(f"wrote {out}", err=True)
