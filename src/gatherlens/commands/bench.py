"""`gatherlens bench embedding|attention|decode|generate|page`: each suite lives in gatherlens.bench.<name>."""
from __future__ import annotations

import importlib

import click

SUITES = {
    "embedding": "gatherlens.bench.embedding:command",
    "quantized-embedding": "gatherlens.bench.quantized_embedding:command",
    "attention": "gatherlens.bench.attention:command",
    "decode": "gatherlens.bench.decode:command",
    "generate": "gatherlens.bench.generate:command",
    "prefill": "gatherlens.bench.prefill:command",
    "dist": "gatherlens.bench.dist:command",
    "page": "gatherlens.bench.page:command",
    "presets": "gatherlens.bench.presets:command",
    "qlinear": "gatherlens.bench.quantized_linear:command",
    "serve": "gatherlens.bench.serve:command",
    "models": "gatherlens.bench.models:command",
}


class _Suites(click.Group):
    def list_commands(self, ctx):
        return sorted(SUITES)

    def get_command(self, ctx, name):
        if name not in SUITES:
            return None
        module, attr = SUITES[name].split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=_Suites)
def bench():
    """Benchmarks that print ratios against a baseline measured in the same run."""
