"""`gatherlens lookup`: one embedding lookup, drawn in the terminal.

    gatherlens lookup --ids 3,1,4 --vocab 10 --dim 6

Looks the ids up in a random (V, d) table and prints the record of that gather as render/ draws it
for the terminal (the same picture as `record_embedding(ids, W).print_terminal()`): the table with
the picked rows coloured by position, the ids, and the (N, d) output whose row i is row ids[i].
"""
from __future__ import annotations

import click

from gatherlens.commands.params import Int, int_list


def _ids(text: str) -> list[int]:
    return int_list(text.replace(" ", ""), "--ids")   # gatherlens.params' one int rule


@click.command("lookup")
@click.option("--ids", "ids_text", default="3,1,4", show_default=True, help="comma-separated token ids")
@click.option("--vocab", default=10, show_default=True, type=Int(1, 1000), help="rows V of the table")
@click.option("--dim", default=6, show_default=True, type=Int(1, 32), help="columns d of the table")
@click.option("--seed", default=0, show_default=True, type=Int(), help="seed of the random table")
def lookup(ids_text, vocab, dim, seed):
    """Draw one embedding lookup: token ids pick rows of the table."""
    import torch

    from gatherlens.errors import GatherLensError
    from gatherlens.ops.embedding import embedding_lookup
    from gatherlens.trace import record_embedding

    ids_list = _ids(ids_text)
    if not ids_list:
        raise click.BadParameter("give at least one id", param_hint="--ids")
    table = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(seed))  # (V, d)
    ids = torch.tensor(ids_list)  # (N,)
    try:
        embedding_lookup(ids, table)  # (N, d): the checked lookup, for its error on a bad id
    except GatherLensError as err:
        raise click.BadParameter(str(err), param_hint="--ids") from None
    record_embedding(ids, table).print_terminal()
