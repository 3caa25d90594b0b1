"""Dense, top-k and page-selected sparse attention for one query, computed from a run.

    >>> rec = keep_comparison(story.tensors, story.shown_tokens, layer=15, head=3, query=40, k=4,
    ...                       config=TOY)               # a gatherlens.trace.KeepComparison
    >>> round(rec.topk_error, 3), rec.pages              # relative L2 of the top-k output; pages read

Dense: softmax over every allowed key, out = w @ V. Top-k: the keys the model's own top-k kept
(at another k, the top-k of the same scores), softmax over them. Sparse: the real
`gatherlens.ops.sparse.sparse_decode` on a paged cache of the keys this query may see, with the
explorer's SparseConfig (what `gatherlens serve` generates with): the pages it chose and its
output. A local layer (sliding or chunked) chooses no pages: sparse decoding keeps its window as a
ring and reads all of it (models/attention/window.py), so its "sparse" is the window, read densely,
and equals dense. Both errors are ||o - o_dense|| / ||o_dense|| over the head's Dv values.
"""
from __future__ import annotations

import torch

from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.config import SparseConfig
from gatherlens.ops.sparse.decode import sparse_decode
from gatherlens.report.run_tensors import RunTensors
from gatherlens.report.window import kept_keys
from gatherlens.trace.keep_records import KeepComparison

__all__ = ["keep_comparison", "sparse_step"]


def _relative(o: torch.Tensor, ref: torch.Tensor) -> float:
    """||o - ref|| / ||ref|| (0 when both are 0)."""
    den = float(ref.norm())
    return float((o - ref).norm()) / den if den > 0 else float((o - ref).norm())


def sparse_step(run: RunTensors, layer: int, query: int, config: SparseConfig):
    """(out (Hq, Dv), PageSelection): one sparse decode step of query row `query` of `layer` over
    the keys it may see, as sparse_decode runs it."""
    N, Hq, Q, L = run.shape
    allowed = run.allowed(layer)[query]                                       # (L,) that layer's own mask
    n = int(allowed.nonzero().max()) + 1 if bool(allowed.any()) else 1       # keys up to the last allowed
    Hkv, D = run.key.shape[1], run.key.shape[-1]
    cache = PagedKVCache(batch=1, kv_heads=Hkv, head_dim=D, page_size=config.page_size, capacity=n)
    cache.append(run.key[layer, :, :n].unsqueeze(0), run.value[layer, :, :n].unsqueeze(0))  # (1, Hkv, n, D)
    q = run.query[layer, :, query].reshape(1, Hq, 1, D)                      # (1, Hq, 1, D)
    mask = None if bool(allowed[:n].all()) else allowed[:n].unsqueeze(0)      # (1, n)
    out, _, sel = sparse_decode(q, cache, config.budget_for(n, layer), return_lse=True, return_selection=True,
                                scale=run.scales[layer], key_mask=mask, config=config)  # (1, Hq, 1, Dv)
    return out[0, :, 0], sel


def keep_comparison(run: RunTensors, tokens: list[str], layer: int, head: int, query: int, k: int,
                    config: SparseConfig) -> KeepComparison:
    """The KeepComparison of one query of (layer, head); tokens: the shown tokens of the text."""
    run.check(layer, head, query)
    N, Hq, Q, L = run.shape
    row = run.scores(layer, head, [query])[0]                                 # (L,)
    dense = torch.softmax(row, dim=-1).nan_to_num(0.0)                        # (L,)
    V = run.value[layer, run.kv_head(head)]                                   # (L, Dv)
    kept = kept_keys(run, layer, head, query, k, row)
    o_dense = dense @ V                                                       # (Dv,)
    o_topk = torch.softmax(row[kept], dim=-1) @ V[kept]                       # (Dv,)
    if run.kinds[layer].local:
        return _ring(run, tokens, layer, head, query, dense, tuple(kept), _relative(o_topk, o_dense))
    out, sel = sparse_step(run, layer, query, config)                         # (Hq, Dv)
    sel_head = run.kv_head(head) if sel.share_selection else head
    labels = tuple(tokens[-L:]) if len(tokens) >= L else ()
    return KeepComparison(layer=layer, head=head, query=query + len(tokens) - Q if len(tokens) >= Q else query,
                          query_token=tokens[query + len(tokens) - Q] if len(tokens) >= Q else "",
                          dense=dense, topk=tuple(kept), pages=tuple(sel.pages[0, sel_head].tolist()),
                          page_size=sel.page_size, budget=sel.budget, topk_error=_relative(o_topk, o_dense),
                          sparse_error=_relative(out[head], o_dense), labels=labels, seen=sel.length)


def _ring(run: RunTensors, tokens: list[str], layer: int, head: int, query: int, dense: torch.Tensor,
          kept: tuple[int, ...], topk_error: float) -> KeepComparison:
    """The comparison on a local layer: sparse decoding reads its whole window (the ring), as dense does."""
    N, Hq, Q, L = run.shape
    keys = run.allowed(layer)[query].nonzero()[:, 0]                          # (n,) the window's keys
    ring = (int(keys.min()), int(keys.max()) + 1) if keys.numel() else (0, 0)
    shift = len(tokens) - Q if len(tokens) >= Q else 0
    return KeepComparison(layer=layer, head=head, query=query + shift,
                          query_token=tokens[query + shift] if len(tokens) >= Q else "", dense=dense, topk=kept,
                          pages=(), page_size=1, budget=ring[1] - ring[0], topk_error=topk_error,
                          sparse_error=0.0, labels=tuple(tokens[-L:]) if len(tokens) >= L else (),
                          seen=ring[1], ring=ring, kind=run.kinds[layer].kind, window=run.kinds[layer].window)
