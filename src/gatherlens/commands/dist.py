"""`gatherlens dist demo --nproc N`: start N processes with torchrun and run the sharded-gather demo.

    gatherlens dist demo --nproc 3                  # == torchrun --nproc-per-node 3 -m gatherlens.dist demo
    gatherlens dist demo --nproc 2 --out pics/      # also the pictures of this run (SVG)

Prints what each rank holds (its rows of a 50257-row table, its part of a KV cache), what it
looked up and sent, and whether every result equals one process. Exit status 1 on a mismatch.
The demo's options are DemoConfig's fields (gatherlens.dist.demo_config), read here and by the
torchrun entry point (gatherlens.dist.__main__) alike.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click

from gatherlens.commands.params import Int
from gatherlens.dist.demo_config import DemoConfig, demo_options


def _click_kind(o) -> dict:
    """click's type of one demo option (gatherlens.dist.demo_config)."""
    if o.kind is bool:
        return {"is_flag": True}
    if o.choices:
        return {"type": click.Choice(o.choices), "show_default": True}
    if o.kind is Path:
        return {"type": click.Path(file_okay=False, path_type=Path)}
    return {"type": Int(o.low), "show_default": True}


def demo_option_flags(command):
    """The demo's options (DemoConfig's fields), as click options of `command`."""
    for o in reversed(demo_options()):
        command = click.option(o.flag, o.name, default=o.default, help=o.help, **_click_kind(o))(command)
    return command


@click.group("dist")
def dist():
    """Gathers across processes (torch.distributed): a sharded vocabulary and KV cache."""


@dist.command("demo")
@click.option("--nproc", default=2, show_default=True, type=Int(1, 64), help="processes (ranks)")
@demo_option_flags
def demo(nproc, **options):
    """Run the demo on NPROC local processes (torchrun) and check every rank against one process."""
    cfg = DemoConfig.from_options(options)
    if cfg.out is not None:  # before torchrun starts any rank
        from gatherlens.errors import GatherLensError
        from gatherlens.outputs import output_dir

        try:
            output_dir(cfg.out, "--out", force=cfg.force)
        except GatherLensError as err:
            raise click.BadParameter(str(err).removeprefix("--out "), param_hint="--out") from None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "gatherlens.dist", "demo", *cfg.argv()]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    code = subprocess.run(cmd, env=env).returncode
    if code:
        raise click.ClickException(f"the demo failed on at least one rank (torchrun exit status {code})")
