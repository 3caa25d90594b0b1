"""`gatherlens cache list|clear`: the converted models kept on this machine, and their size.

    gatherlens cache list            # every converted model: size, state (re-hashed), source
    gatherlens cache clear           # remove all of it (what a live process is writing is kept)

The cache is $GATHERLENS_CACHE, else $XDG_CACHE_HOME/gatherlens, else ~/.cache/gatherlens.
"""
from __future__ import annotations

import click


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


@click.group("cache")
def cache():
    """The converted-model cache: list it or clear it."""


@cache.command("list")
@click.option("--no-verify", is_flag=True, help="Skip re-hashing each model folder.")
def list_(no_verify):
    """Every converted model in the cache, its size and whether it is sound."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from gatherlens.models.cache import cache_root
    from gatherlens.models.inventory import inventory

    items = inventory(verify=not no_verify)
    console = Console()
    console.print(f"cache: {cache_root()}  (move it with GATHERLENS_CACHE=/some/folder)")
    if not items:
        console.print("empty")
        return
    table = Table(box=box.SIMPLE_HEAD, show_footer=True)
    table.add_column("entry", footer="total")
    table.add_column("size", justify="right", footer=_size(sum(i.size for i in items)))
    table.add_column("state", overflow="fold")
    table.add_column("converted from", overflow="fold")
    for i in items:
        table.add_row(i.name, _size(i.size), i.state, i.source)
    console.print(table)


@cache.command("clear")
def clear_():
    """Remove every converted model and leftover (a model is converted again on its next load)."""
    from gatherlens.models.cache import cache_root
    from gatherlens.models.inventory import clear

    done = clear()
    click.echo(f"removed {len(done.removed)} entries from {cache_root()}, freed {_size(done.freed)}")
    for path, why in done.kept:
        click.echo(f"kept {path.name}: {why}", err=True)
