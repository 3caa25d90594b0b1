"""`torchrun --nproc-per-node N -m gatherlens.dist demo [options]`: the sharded gathers, checked.

Every rank joins the process group torchrun describes (env://), runs the demo and rank 0 prints
what each rank holds and whether it equals one process. Exit status 0 only if every check passed.
`--device cuda` uses NCCL, one GPU per rank; the default is gloo on the CPU.
"""
from __future__ import annotations

import argparse
import os
import sys

from gatherlens.dist.demo_config import DemoConfig, demo_options


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The demo's options, read from DemoConfig's fields (gatherlens.dist.demo_config)."""
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m gatherlens.dist",
                                description="Gathers across processes: a vocabulary-parallel embedding "
                                            "and sparse decode over a sequence-sharded KV cache.")
    p.add_argument("command", choices=["demo"])
    for o in demo_options():
        shown = "" if o.default in (None, False) else f" (default {o.default})"
        if o.kind is bool:
            kw = dict(action="store_true")
        elif o.choices:
            kw = dict(choices=o.choices, default=o.default)
        else:
            kw = dict(type=_at_least(o.low) if o.low is not None else o.kind, default=o.default)
        p.add_argument(o.flag, dest=o.name, help=o.help + shown, **kw)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("start it with torchrun: torchrun --nproc-per-node 2 -m gatherlens.dist demo", file=sys.stderr)
        return 2
    cfg = DemoConfig.from_options(vars(args))
    if cfg.out is not None:  # every rank checks, before any process group starts
        from gatherlens.errors import GatherLensError
        from gatherlens.outputs import output_dir

        try:
            output_dir(cfg.out, "--out", force=cfg.force)
        except GatherLensError as err:
            print(f"Error: {err}", file=sys.stderr)
            return 2
    import torch
    import torch.distributed as dist

    from gatherlens.dist.demo import run_demo
    from gatherlens.dist.launch import leave_group
    from gatherlens.errors import GatherLensError

    if cfg.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    report = None
    try:
        report = run_demo(cfg)
    except GatherLensError as e:
        print(f"rank {dist.get_rank()}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        leave_group(done=report is not None)
    if int(os.environ["RANK"]) == 0:
        print("\n".join(report.lines))
        print("every rank equals one process" if report.ok else "MISMATCH against one process")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
