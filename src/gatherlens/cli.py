"""The command line: a thin layer over the library.

    gatherlens explain "The cat sat on the mat."   # the main job (a report of every gather)
    gatherlens gather --shape 4,5 --dim 0 --index 2,0,3    # draw one toy gather
    gatherlens bench embedding|attention|decode
    gatherlens eval | eval-sparse

Each command lives in its own module under `gatherlens.commands` and is imported only when it
runs, so `gatherlens --help` answers without importing torch or transformers.
"""
from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command; imported on first use.
COMMANDS = {
    "explain": "gatherlens.commands.explain:explain",
    "gather": "gatherlens.commands.gather:gather",
    "bench": "gatherlens.commands.bench:bench",
    "eval": "gatherlens.commands.evaluate:evaluate",
    "eval-sparse": "gatherlens.commands.evaluate_sparse:evaluate_sparse",
    "lookup": "gatherlens.commands.lookup:lookup",
}


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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gatherlens")
def main():
    """gatherlens: every gather in a Transformer, done right and drawn."""


if __name__ == "__main__":
    main()
