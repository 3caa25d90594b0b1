"""The demo `torchrun --nproc-per-node N -m gatherlens.dist demo` runs: both sharded gathers, checked.

    >>> report = run_demo(DemoConfig(vocab=50257, context=4133, budget=512))   # on every rank
    >>> report.ok                                                            # every check passed

Each rank builds the same seeded table and KV cache, keeps only its shard (rows of the table,
a part of the sequence), runs the sharded gather and compares it with the one-process result it
computes itself from the full tensors. Rank 0 prints one line per rank: what it holds, what it
looked up or read, what it sent, and whether the result equals one process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from gatherlens.ops.sparse import PagedKVCache, sparse_decode
from gatherlens.outputs import write_output
from gatherlens.trace.sharded import record_vocab_shard, record_vocab_sum

from .comm import count_traffic
from .decode import sparse_decode_sharded
from .demo_config import DemoConfig
from .embedding import parallelize_embedding
from .layout import split_sequence
from .simulate import gather_selection, shard_cache

__all__ = ["DemoConfig", "DemoReport", "run_demo"]

IDS = [[15496, 11, 995, 50256, 0, 25130, 12565, 37694]]  # ids at both ends and at shard edges


@dataclass
class DemoReport:
    lines: list[str] = field(default_factory=list)
    ok: bool = True


def _embedding_part(cfg: DemoConfig, mesh, rank: int) -> tuple[str, bool, object]:
    torch.manual_seed(0)
    full = nn.Embedding(cfg.vocab, cfg.dim, device=cfg.device)
    want = full.weight.detach().clone()  # (V, d) the one-process table
    emb = parallelize_embedding(full, mesh)
    lo, hi = emb.gatherlens_rows
    ids = torch.tensor(IDS, device=cfg.device).remainder(cfg.vocab)  # (1, S)
    same = torch.equal(emb(ids), nn.functional.embedding(ids, want))
    owned = [i for i in ids.reshape(-1).tolist() if lo <= i < hi]
    line = (f"rank {rank}: embedding rows [{lo}, {hi}) of {cfg.vocab} ({hi - lo} rows); looks up "
            f"{owned or 'none'} of the ids; all_reduce(sum) == one process: {same}")
    rec = record_vocab_shard(ids, emb.weight.to_local(), lo, cfg.vocab, rank=rank, world=mesh.size())
    return line, same, rec


def _decode_part(cfg: DemoConfig, rank: int, world: int) -> tuple[str, bool, object]:
    g = torch.Generator().manual_seed(1)
    shape = (1, cfg.kv_heads, cfg.context, cfg.head_dim)
    k, v = torch.randn(shape, generator=g).to(cfg.device), torch.randn(shape, generator=g).to(cfg.device)
    q = torch.randn(1, cfg.heads, 1, cfg.head_dim, generator=g).to(cfg.device)  # (B, Hq, 1, D)
    lengths = split_sequence(cfg.context, world, cfg.page_size)
    local = shard_cache(k, v, lengths, cfg.page_size)[rank]
    with count_traffic() as traffic:
        out, lse, sel = sparse_decode_sharded(q, local, cfg.budget, return_lse=True, return_selection=True)
    whole = PagedKVCache(1, cfg.kv_heads, cfg.head_dim, cfg.page_size, device=cfg.device)
    whole.append(k, v)
    out1, lse1, sel1 = sparse_decode(q, whole, cfg.budget, return_lse=True, return_selection=True)
    same_pages = torch.equal(sel.pages, sel1.pages)
    err = max(float((out - out1).abs().max()), float((lse - lse1).abs().max()))
    ok = same_pages and err <= 1e-5
    start = sum(lengths[:rank])
    mine = float((sel.owners() == rank).sum()) / sel.pages.shape[1]  # chosen pages here, per KV head
    line = (f"rank {rank}: KV tokens [{start}, {start + local.length}) = {local.num_pages} pages, "
            f"{2 * local.keys.numel() * local.keys.element_size() / 2**20:.1f} MiB; reads {mine:.1f} of the "
            f"{sel.pages.shape[-1]} chosen pages per KV head; sent {traffic.payload_bytes} bytes; "
            f"same pages as one process: {same_pages}, max |diff| of out and lse: {err:.1e}")
    return line, ok, sel


def run_demo(cfg: DemoConfig) -> DemoReport:
    """Run both parts on this rank; every rank returns the same report (lines of all ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(cfg.device, (world,))
    emb_line, emb_ok, shard_rec = _embedding_part(cfg, mesh, rank)
    dec_line, dec_ok, sel = _decode_part(cfg, rank, world)
    sel = gather_selection(sel)  # every rank's bounds, for the picture (off the decode path)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (emb_line, dec_line, emb_ok and dec_ok, shard_rec))
    report = DemoReport()
    report.lines = [f"gatherlens.dist demo on {world} ranks ({dist.get_backend()})"]
    report.lines += [g[0] for g in gathered] + [g[1] for g in gathered]
    report.ok = all(g[2] for g in gathered)
    if cfg.out is not None and rank == 0:
        _write_pictures(cfg, [g[3] for g in gathered], sel, report)
    return report


def _write_pictures(cfg: DemoConfig, shard_records, sel, report: DemoReport) -> None:
    cfg.out.mkdir(parents=True, exist_ok=True)
    ids = torch.tensor(IDS).remainder(cfg.vocab)
    torch.manual_seed(0)
    table = nn.Embedding(cfg.vocab, cfg.dim).weight.detach()  # the same seeded table, whole
    files = {f"vocab_shard_rank{r}.svg": rec for r, rec in enumerate(shard_records)}
    files["vocab_sum.svg"] = record_vocab_sum(ids, table, len(shard_records))
    files["sharded_pages.svg"] = sel
    for name, obj in files.items():  # a file that appeared since the check at the start is kept, without --force
        write_output(cfg.out / name, obj.to_svg(), "--out", force=cfg.force)
    report.lines.append(f"wrote {len(files)} pictures to {cfg.out}")
