"""Records of the gathers gatherlens.dist splits across ranks: a vocabulary or a KV cache in shards.

    >>> rows = shard_rows(8, 3)                                   # [(0, 3), (3, 6), (6, 8)]
    >>> parts = [record_vocab_shard(ids, W[lo:hi], lo, 8, rank=r, world=3)
    ...          for r, (lo, hi) in enumerate(rows)]             # each rank's masked partial lookup
    >>> record_vocab_sum(ids, W, 3)                               # the all_reduce(SUM) of the parts
    >>> sel.to_svg()                                              # a ShardedPageSelection, fully gathered

Like every record these hold real outputs and, for every output element, its source element;
the renderers draw them as they draw any gather. Rows are split as DTensor's Shard(0) splits
them (torch.chunk: ceil(V / W) rows per rank, the last ranks take the rest, possibly none).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gatherlens.drawable import Drawable
from gatherlens.errors import GatherIndexError, GatherValueError
from gatherlens.i18n import check_lang, text
from gatherlens.ops.sparse.geometry import ceil_div, page_offsets, pages_per_rank
from gatherlens.trace.builders import record_embedding
from gatherlens.trace.convert import as_record
from gatherlens.trace.record import GatherRecord

__all__ = ["shard_rows", "record_vocab_shard", "record_vocab_sum", "ShardedPageSelection",
           "record_sharded_pages"]


def shard_rows(vocab: int, world: int) -> list[tuple[int, int]]:
    """[lo, hi) rows of each rank when a (vocab, d) table is split like torch.chunk / Shard(0).

    >>> shard_rows(50257, 4)
    [(0, 12565), (12565, 25130), (25130, 37695), (37695, 50257)]
    """
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 0 or \
            isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise GatherValueError(f"vocab = {vocab!r} must be an int >= 0 and world = {world!r} an int >= 1")
    size = ceil_div(vocab, world)  # rows per rank, exact on ints
    return [(min(r * size, vocab), min((r + 1) * size, vocab)) for r in range(world)]


def _masked_lookup(ids: torch.Tensor, shard: torch.Tensor, lo: int):
    """What a rank computes (DTensor's MaskPartial): (partial (*S, d), local ids (*S) with -1 = masked)."""
    owned = (ids >= lo) & (ids < lo + shard.shape[0])  # (*S)
    local = torch.where(owned, ids - lo, 0)  # (*S) masked ids look up row 0 ...
    partial = torch.nn.functional.embedding(local, shard) if shard.shape[0] else \
        shard.new_zeros(*ids.shape, shard.shape[1])  # (*S, d)
    partial = partial.masked_fill(~owned.unsqueeze(-1), 0)  # ... and are zeroed
    return partial, torch.where(owned, ids - lo, -1)


def _index_cells(shape) -> torch.Tensor:
    """(*shape, len(shape)): the id cell (index drawn as a column) that chose each output element."""
    grid = torch.meshgrid(*[torch.arange(n) for n in shape], indexing="ij")
    return torch.stack([*grid[:-1], torch.zeros_like(grid[-1])], dim=-1)


def record_vocab_shard(ids, shard: torch.Tensor, offset: int, vocab: int, *, rank: int = 0,
                       world: int = 1, labels=None, lang: str = "en") -> GatherRecord:
    """One rank's masked partial lookup in a vocabulary-parallel embedding.

        >>> rec = record_vocab_shard(torch.tensor([[5, 2, 7]]), W[3:6], offset=3, vocab=8, rank=1, world=3)
        >>> rec.index                     # tensor([[ 2, -1, -1]]): only id 5 is this rank's (local row 2)

    ids: global token ids (any shape, in [0, vocab)); shard: this rank's rows (V_r, d) of the
    table, global rows offset .. offset + V_r - 1. The record's source is the shard (rows named
    by their global id), the index the local ids (-1 where masked), the output the partial.
    """
    check_lang(lang)
    ids = torch.as_tensor(ids).detach().cpu().long()
    shard = shard.detach().cpu()
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        raise GatherIndexError(f"token id {int(ids[bad][0])} is outside the vocabulary [0, {vocab})")
    partial, local = _masked_lookup(ids, shard, offset)  # (*S, d), (*S)
    d = shard.shape[1]
    cols = torch.arange(d).expand(*ids.shape, d)  # (*S, d)
    rows = local.unsqueeze(-1).expand(*ids.shape, d)  # (*S, d)
    coords = torch.stack([rows, torch.where(rows >= 0, cols, -1)], dim=-1)  # (*S, d, 2), -1 = no source
    lead = ("B", "S")[-ids.ndim:] if ids.ndim <= 2 else tuple(f"n{i}" for i in range(ids.ndim))
    hi = offset + shard.shape[0]
    toks = None if labels is None else [str(t) for t in labels]
    return GatherRecord(
        op="embedding", source=shard, index=local, output=partial, source_coords=coords,
        index_coords=_index_cells(partial.shape),
        dim=0, call=f"W_{rank}[ids - {offset}] masked  # rank {rank}: rows {offset}..{hi - 1}",
        source_name=f"W_{rank}", index_name=f"ids - {offset}", output_name=f"partial_{rank}",
        source_axes=("V_r", "d"), index_axes=lead, output_axes=(*lead, "d"), index_as_column=True,
        source_row_labels=None if toks is None else {int(i) - offset: t for i, t in
                                                     zip(ids.reshape(-1).tolist(), toks) if offset <= i < hi},
        caption=text("caption_vocab_shard", lang, rank=rank, world=world, V=vocab, lo=offset,
                     rows=f"{offset}–{hi - 1}" if hi > offset else "—"),
        lang=lang, meta={"row_names": [str(offset + r) for r in range(shard.shape[0])], "rank": rank,
                         "world": world, "rows": (offset, hi), "kind": "vocab_shard"})


def record_vocab_sum(ids, table: torch.Tensor, world: int, *, labels=None, lang: str = "en") -> GatherRecord:
    """The all_reduce(SUM) of every rank's partial lookup: the whole table's lookup, row owners named.

        >>> record_vocab_sum(torch.tensor([[5, 2, 7]]), W, world=3).output.equal(W[[[5, 2, 7]]])
        True
    """
    check_lang(lang)
    table = table.detach().cpu()
    rows = shard_rows(table.shape[0], world)
    ids = torch.as_tensor(ids).detach().cpu().long()
    rec = record_embedding(ids, table, labels=labels, lang=lang)
    partials = [_masked_lookup(ids, table[lo:hi], lo)[0] for lo, hi in rows]
    rec.output = torch.stack(partials).sum(dim=0)  # (*S, d): what all_reduce(SUM) returns
    owner = {i: r for r, (lo, hi) in enumerate(rows) for i in range(lo, hi)}
    named = rec.source_row_labels or {}
    rec.source_row_labels = {i: f"r{owner[i]} {named.get(i, '')}".strip() for i in range(table.shape[0])}
    rec.call = f"all_reduce(partial_0 + ... + partial_{world - 1}, SUM)  # == W[ids]"
    rec.output_name = "sum"
    rec.caption = text("caption_vocab_sum", lang, world=world)
    rec.meta.update({"world": world, "rows": rows, "kind": "vocab_sum"})
    return rec


@dataclass
class ShardedPageSelection(Drawable):
    """The pages one sharded decode step read, and the page bounds they were chosen by.

    pages:   (B, Hsel, n) int64 global page ids, ascending: the same on every rank.
    bounds:  one entry per rank: its (B, Hsel, N_r) float32 page bounds, or None where this rank
             does not know them (a decode returns only its own; `gatherlens.dist.gather_selection`
             collects all, which the picture needs).
    lse:     (B, Hq, 1) float32 log-sum-exp over every token read, merged over the ranks.
    lengths: tokens each rank holds, in rank order (sequence order).
    rank:    the rank this object was made on.
    page_size, budget, query_heads, kv_heads, share_selection, group_score: as PageSelection.
    """

    pages: torch.Tensor
    bounds: list
    lse: torch.Tensor
    lengths: tuple
    rank: int
    page_size: int
    budget: int
    query_heads: int
    kv_heads: int
    share_selection: bool = True
    group_score: str = "max"
    meta: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return sum(self.lengths)

    @property
    def pages_per_rank(self) -> list[int]:
        return pages_per_rank(self.lengths, self.page_size)

    @property
    def page_offsets(self) -> list[int]:
        return page_offsets(self.lengths, self.page_size)

    @property
    def num_pages(self) -> int:
        return sum(self.pages_per_rank)

    def owners(self) -> torch.Tensor:
        """(B, Hsel, n) int64: the rank holding each chosen page."""
        ends = torch.tensor([o + n for o, n in zip(self.page_offsets, self.pages_per_rank)])  # (W,)
        return torch.bucketize(self.pages.cpu().contiguous(), ends, right=True)  # (B, Hsel, n) (strided input warns)

    def __repr__(self) -> str:
        B, Hsel, n = self.pages.shape
        return (f"ShardedPageSelection(pages={n} of {self.num_pages} per head, ranks={len(self.lengths)}, "
                f"lengths={list(self.lengths)}, page_size={self.page_size}, budget={self.budget}, "
                f"rank={self.rank})")


def record_sharded_pages(selection: ShardedPageSelection, batch: int = 0, head: int = 0,
                         lang: str = "en") -> GatherRecord:
    """One (batch, selection head) of a sharded page choice as a gather record.

        >>> rec = record_sharded_pages(sel, head=0)     # sel with every rank's bounds
        >>> rec.source_coords                          # (n, 2): (rank, local page) of each page read

    Source: (W, max N_r) every rank's page bounds, one row per rank (blank past its pages);
    output: (n,) the bounds of the chosen pages, gathered as bounds[owner, local page], so each
    chosen page is coloured by the rank holding it.
    """
    check_lang(lang)
    missing = [r for r, b in enumerate(selection.bounds) if b is None]
    if missing:
        raise GatherValueError(f"the bounds of ranks {missing} are not in this selection; collect them "
                               f"with gatherlens.dist.gather_selection(selection) before drawing")
    B, Hsel, n = selection.pages.shape
    for nm, v, size in (("batch", batch, B), ("head", head, Hsel)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < size:
            raise GatherIndexError(f"{nm}={v!r} is outside [0, {size})")
    W, widest = len(selection.lengths), max(selection.pages_per_rank)
    source = torch.full((W, widest), float("nan"))  # (W, max N_r)
    for r, b in enumerate(selection.bounds):
        source[r, :b.shape[-1]] = b[batch, head].detach().cpu().float()
    pages = selection.pages[batch, head].detach().cpu().long()  # (n,)
    owner = selection.owners()[batch, head]  # (n,)
    local = pages - torch.tensor(selection.page_offsets)[owner]  # (n,)
    coords = torch.stack([owner, local], dim=-1)  # (n, 2)
    offsets, sizes = selection.page_offsets, selection.pages_per_rank
    what = "KV group" if selection.share_selection else "query head"
    return GatherRecord(
        op="indexing", source=source, index=None, output=source[owner, local], source_coords=coords,
        dim=0, call=f"bounds[owner, local_page]  # batch {batch}, {what} {head}, {n} of "
                    f"{selection.num_pages} pages",
        source_name="bounds", output_name="read", source_axes=("rank", "page"), output_axes=("n",),
        caption=text("caption_sharded_pages", lang, world=W, L=selection.length, N=selection.num_pages,
                     n=n, budget=selection.budget),
        lang=lang, meta={"row_names": [f"rank {r} · p{o}–{o + k - 1}" if k else f"rank {r} · —"
                                       for r, (o, k) in enumerate(zip(offsets, sizes))],
                         "kind": "sharded_pages", "batch": batch, "head": head})


@as_record.register
def _(obj: ShardedPageSelection, **kw) -> GatherRecord:
    return record_sharded_pages(obj, **kw)
