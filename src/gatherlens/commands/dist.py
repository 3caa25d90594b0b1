"""`gatherlens dist demo --nproc N`: start N processes with torchrun and run the sharded-gather demo.

    gatherlens dist demo --nproc 3                  # == torchrun --nproc-per-node 3 -m gatherlens.dist demo
    gatherlens dist demo --nproc 2 --out pics/      # also the pictures of this run (SVG)

Prints what each rank holds (its rows of a 50257-row table, its part of a KV cache), what it
looked up and sent, and whether every result equals one process. Exit status 1 on a mismatch.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click


@click.group("dist")
def dist():
    """Gathers across processes (torch.distributed): a sharded vocabulary and KV cache."""


@dist.command("demo")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(1, 64), help="processes (ranks)")
@click.option("--vocab", default=50257, show_default=True, type=click.IntRange(1), help="embedding rows")
@click.option("--context", default=4133, show_default=True, type=click.IntRange(1), help="tokens in the KV cache")
@click.option("--budget", default=512, show_default=True, type=click.IntRange(1), help="tokens a decode step reads")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cpu: gloo; cuda: nccl, one GPU per rank")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="write the pictures (SVG) here")
@click.option("--force", is_flag=True, help="replace pictures already in --out")
def demo(nproc, vocab, context, budget, device, out, force):
    """Run the demo on NPROC local processes (torchrun) and check every rank against one process."""
    if out is not None:  # before torchrun starts any rank
        from gatherlens.errors import GatherLensError
        from gatherlens.outputs import pictures_dir

        try:
            pictures_dir(out, "--out", force)
        except GatherLensError as err:
            raise click.BadParameter(str(err), param_hint="--out") from None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "gatherlens.dist", "demo", "--vocab", str(vocab), "--context", str(context),
           "--budget", str(budget), "--device", device]
    if out is not None:
        cmd += ["--out", str(out)] + (["--force"] if force else [])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    code = subprocess.run(cmd, env=env).returncode
    if code:
        raise click.ClickException(f"the demo failed on at least one rank (torchrun exit status {code})")
