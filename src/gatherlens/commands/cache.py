"""`gatherlens cache list|clear`: the converted models kept on this machine, and their size.

    gatherlens cache list            # every converted model: size, state (re-hashed), source
    gatherlens cache clear           # remove what gatherlens made there (kept: what a live process
                                     # is writing, and anything not gatherlens' own)

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
    from gatherlens.models.files.cache import cache_root
    from gatherlens.models.files.inventory import inventory

    items = inventory(verify=not no_verify)
    click.echo(f"cache: {cache_root()}  (move it with GATHERLENS_CACHE=/some/folder)")
    for i in items:
        source = f"  (from {i.source})" if i.source else ""
        click.echo(f"{_size(i.size):>11}  {i.name}: {i.state}{source}")
    click.echo(f"{_size(sum(i.size for i in items)):>11}  in all" if items else "empty")


@cache.command("clear")
def clear_():
    """Remove the converted models and leftovers gatherlens made (anything else is left, and named)."""
    from gatherlens.models.files.cache import cache_root
    from gatherlens.models.files.inventory import clear

    done = clear()
    click.echo(f"removed {len(done.removed)} entries from {cache_root()}, freed {_size(done.freed)}")
    for path, why in done.kept:
        click.echo(f"kept {path.name}: {why}", err=True)
