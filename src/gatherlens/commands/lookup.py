"""`gatherlens lookup`: one embedding lookup, drawn in the terminal.

    gatherlens lookup --ids 3,1,4 --vocab 10 --dim 6

Prints the (V, d) table with the picked rows coloured (one colour per position), the ids, and the
(N, d) output whose row i is the table's row ids[i]. A small, self-contained illustration.
"""
from __future__ import annotations

import click

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers like 3,1,4, got {text!r}") from None


@click.command("lookup")
@click.option("--ids", "ids_text", default="3,1,4", show_default=True, help="comma-separated token ids")
@click.option("--vocab", default=10, show_default=True, type=click.IntRange(1, 1000), help="rows V of the table")
@click.option("--dim", default=6, show_default=True, type=click.IntRange(1, 32), help="columns d of the table")
@click.option("--seed", default=0, show_default=True, help="seed of the random table")
def lookup(ids_text, vocab, dim, seed):
    """Draw one embedding lookup: token ids pick rows of the table."""
    import torch
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape
    from rich.text import Text

    from gatherlens.errors import GatherLensError
    from gatherlens.ops.embedding import embedding_lookup

    ids_list = _ids(ids_text)
    if not ids_list:
        raise click.BadParameter("give at least one id", param_hint="--ids")
    table = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(seed))  # (V, d)
    ids = torch.tensor(ids_list)  # (N,)
    try:
        out = embedding_lookup(ids, table)  # (N, d)
    except GatherLensError as err:
        raise click.BadParameter(str(err), param_hint="--ids") from None

    colour_of_row: dict[int, list[str]] = {}
    for pos, token in enumerate(ids_list):
        colour_of_row.setdefault(token, []).append(PALETTE[pos % len(PALETTE)])

    console = Console()
    grid = Table(title=f"table W: ({vocab}, {dim})", title_justify="left")
    grid.add_column("row", justify="right")
    for j in range(dim):
        grid.add_column(str(j), justify="right")
    grid.add_column("picked by")
    for row in range(vocab):
        colours = colour_of_row.get(row)
        style = f"bold {colours[0]}" if colours else "dim"
        positions = [str(p) for p, t in enumerate(ids_list) if t == row]
        grid.add_row(str(row), *(f"{v:+.2f}" for v in table[row].tolist()),
                     escape("ids[" + "], ids[".join(positions) + "]") if positions else "", style=style)
    console.print(grid)

    line = Text("ids = [")
    for pos, token in enumerate(ids_list):
        line.append(str(token), style=f"bold {PALETTE[pos % len(PALETTE)]}")
        line.append(", " if pos < len(ids_list) - 1 else "]")
    console.print(line)

    result = Table(title=escape(f"out = W[ids]: ({len(ids_list)}, {dim})"), title_justify="left")
    result.add_column("i", justify="right")
    result.add_column("= W row", justify="right")
    for j in range(dim):
        result.add_column(str(j), justify="right")
    for pos, token in enumerate(ids_list):
        result.add_row(str(pos), str(token), *(f"{v:+.2f}" for v in out[pos].tolist()),
                       style=f"bold {PALETTE[pos % len(PALETTE)]}")
    console.print(result)
