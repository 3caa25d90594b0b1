"""`torchrun --nproc-per-node N -m gatherlens.dist demo [options]`: the sharded gathers, checked.

Every rank joins the process group torchrun describes (env://), runs the demo and rank 0 prints
what each rank holds and whether it equals one process. Exit status 0 only if every check passed.
`--device cuda` uses NCCL, one GPU per rank; the default is gloo on the CPU.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m gatherlens.dist",
                                description="Gathers across processes: a vocabulary-parallel embedding "
                                            "and sparse decode over a sequence-sharded KV cache.")
    p.add_argument("command", choices=["demo"])
    p.add_argument("--vocab", type=int, default=50257, help="embedding rows (default 50257)")
    p.add_argument("--context", type=int, default=4133, help="tokens in the KV cache (default 4133)")
    p.add_argument("--budget", type=int, default=512, help="tokens each decode step reads (default 512)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: gloo; cuda: nccl")
    p.add_argument("--out", type=Path, help="write this run's pictures (SVG) into this folder (rank 0)")
    p.add_argument("--force", action="store_true", help="replace pictures already in --out")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("start it with torchrun: torchrun --nproc-per-node 2 -m gatherlens.dist demo", file=sys.stderr)
        return 2
    if args.out is not None:  # every rank checks, before any process group starts
        from gatherlens.errors import GatherLensError
        from gatherlens.outputs import pictures_dir

        try:
            pictures_dir(args.out, "--out", args.force)
        except GatherLensError as err:
            print(f"Error: {err}", file=sys.stderr)
            return 2
    import torch
    import torch.distributed as dist

    from gatherlens.dist.demo import DemoConfig, run_demo
    from gatherlens.errors import GatherLensError

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        cfg = DemoConfig(vocab=args.vocab, context=args.context, budget=args.budget,
                         page_size=args.page_size, out=args.out, device=args.device)
        report = run_demo(cfg)
    except GatherLensError as e:
        print(f"rank {dist.get_rank()}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print("\n".join(report.lines))
        print("every rank equals one process" if report.ok else "MISMATCH against one process")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
