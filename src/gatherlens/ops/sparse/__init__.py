"""Page-selected sparse decoding: read only the pages whose summaries say they matter.

    >>> cache = PagedKVCache(batch=1, kv_heads=8, head_dim=128, page_size=16)
    >>> cache.append(k, v)                                   # (B, Hkv, T, D), as often as needed
    >>> out = sparse_decode(q, cache, budget=2048)           # q (B, Hq, 1, D) -> (B, Hq, 1, D)
    >>> out, lse, sel = sparse_decode(q, cache, budget=2048, return_lse=True, return_selection=True)
    >>> sel.to_svg()                                          # which pages were read
    >>> out = sparse_decode(q, cache, budget=512, config=SparseConfig())   # the choice rule of a config

`config.py` holds the one sparse configuration (`SparseConfig`, its checks and named presets);
`geometry.py` every page-count rule (page counts and ranges, tokens read, the split over ranks);
`naive.py` the references (dense attention restricted to the chosen pages; the page bound
computed literally). `cache.py` the paged cache; `page_choice.py` which pages a step reads;
`decode.py` the public call, over `torch_decode.py` (gather + exact attention) or
`triton_decode.py` (the GPU kernels, imported only when that backend runs); `checks.py` the
argument checks; `selection.py` the PageSelection record. Names load on first use (PEP 562), so
`config` and `geometry` import without torch.
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

_EXPORTS = {
    "PagedKVCache": "cache", "sparse_decode": "decode", "PageSelection": "selection",
    "select_pages": "page_choice", "page_bounds": "page_choice", "pages_for_budget": "page_choice",
    "SparseConfig": "config",
}

__all__ = ["PagedKVCache", "sparse_decode", "PageSelection", "select_pages", "page_bounds",
           "pages_for_budget", "SparseConfig"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
