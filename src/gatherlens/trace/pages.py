"""The record of a sparse decode step: which pages of the KV cache one head read.

    >>> out, sel = sparse_decode(q, cache, budget=64, return_selection=True)
    >>> rec = record_page_selection(sel, batch=0, head=0)
    >>> rec.to_svg()              # every page's score bound; the pages read are gathered

The record draws the page choice as the gather it is: `bounds.index_select(1, pages)` over the
(1, num_pages) row of page score bounds, so the picture shows all pages (scored from their
summaries), the ids of those read (always page 0 and the last page), and their bounds.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherIndexError, GatherTypeError, GatherValueError
from gatherlens.i18n import check_lang, text
from gatherlens.ops.sparse.geometry import page_count, page_range
from gatherlens.trace.record import GatherRecord

__all__ = ["record_page_selection"]


def _page_labels(labels, L: int, P: int) -> list[str]:
    ranges = [page_range(p, P, L) for p in range(page_count(L, P))]  # [start, stop) of every page
    if labels is None:
        return [f"{a}–{b - 1}" if b - 1 > a else str(a) for a, b in ranges]
    tokens = [str(t) for t in labels]
    if len(tokens) != L:
        raise GatherValueError(f"labels has {len(tokens)} entries; expected one per cached token, {L}")
    out = []
    for a, b in ranges:
        text = "".join(tokens[a:b])
        out.append(text if len(text) <= 24 else text[:23] + "…")
    return out


def record_page_selection(selection, batch: int = 0, head: int = 0, labels=None,
                          lang: str = "en") -> GatherRecord:
    """One (batch, selection head) of a PageSelection as a gather record.

    Source: (1, num_pages) page score bounds; index: (n,) the page ids read, ascending;
    output: (1, n) their bounds. `head` is a KV group when the selection was shared, else a
    query head. `labels`: one string per cached token (pages are labelled by their text);
    without them pages are labelled by token range.
    """
    for name in ("pages", "bounds"):
        if not isinstance(getattr(selection, name, None), torch.Tensor):
            raise GatherTypeError(f"selection.{name} must be a tensor; got {type(selection).__name__}")
    pages_all, bounds_all = selection.pages, selection.bounds  # (B, Hsel, n), (B, Hsel, N)
    if pages_all.ndim != 3 or bounds_all.ndim != 3:
        raise GatherValueError(f"selection.pages {tuple(pages_all.shape)} and bounds "
                               f"{tuple(bounds_all.shape)} must be (B, Hsel, n) and (B, Hsel, N)")
    B, Hsel, n = pages_all.shape
    for nm, v, size in (("batch", batch, B), ("head", head, Hsel)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < size:
            raise GatherIndexError(f"{nm}={v!r} is outside [0, {size})")
    check_lang(lang)
    L, P, N = int(selection.length), int(selection.page_size), bounds_all.shape[-1]
    pages = pages_all[batch, head].detach().cpu().long()  # (n,)
    if bool(((pages < 0) | (pages >= N)).any()):
        raise GatherIndexError(f"selection.pages holds a page id outside [0, {N})")
    source = bounds_all[batch, head].detach().cpu().float().unsqueeze(0)  # (1, N)
    output = source.index_select(1, pages)  # (1, n)
    coords = torch.stack([torch.zeros_like(pages), pages], dim=-1).unsqueeze(0)  # (1, n, 2)
    what = "KV group" if selection.share_selection else "query head"
    caption = text("caption_page_selection", lang, n=n, N=N, tokens=selection.tokens_read, L=L,
                   budget=selection.budget)
    return GatherRecord(
        op="index_select", source=source, index=pages, output=output, source_coords=coords,
        index_coords=torch.arange(n).view(1, n, 1).expand(1, n, 1).clone(), dim=1,
        call=f"bounds.index_select(1, pages)  # batch {batch}, {what} {head}",
        source_name="bounds", index_name="pages", output_name="read",
        source_axes=("1", "page"), index_axes=("n",), output_axes=("1", "n"),
        source_col_labels=_page_labels(labels, L, P), caption=caption, lang=lang,
        meta={"batch": batch, "head": head, "page_size": P, "length": L, "budget": selection.budget,
              "tokens_read": selection.tokens_read, "share_selection": selection.share_selection,
              "group_score": selection.group_score, "kind": "page_selection"},
    )
