"""Sparse decode: score page summaries, gather only the chosen pages, attend over them exactly.

    >>> cache = PagedKVCache(batch=1, kv_heads=8, head_dim=128)
    >>> cache.append(k, v)                                  # (B, Hkv, L, D)
    >>> out = sparse_decode(q, cache, budget=2048)          # q (B, Hq, 1, D) -> (B, Hq, 1, D)
    >>> out, lse, sel = sparse_decode(q, cache, budget=2048, return_lse=True, return_selection=True)
    >>> out = sparse_decode(q, cache, budget=2048, softcap=50.0, sinks=s_aux)   # Gemma 2, GPT-OSS

Reads the page summaries (2D per page) plus `budget` tokens of K and V, instead of all of K and V.
With budget >= cache.length every page is read and the result is dense attention.
Pieces: checks.py (arguments), page_choice.py (which pages), torch_decode.py (gather + attend)
and triton_decode.py (the GPU kernels, imported only when that backend runs).
"""
from __future__ import annotations

import os
from functools import partial

import torch

from gatherlens.errors import GatherTypeError, GatherValueError

from gatherlens.ops.attention.variants import join_sinks

from .cache import PagedKVCache
from .checks import check_decode_args
from .fused_decode import fused_dense, fused_fits, fused_select_attend
from .fused_decode import kernel_loaded as fused_loaded
from .config import OP, SparseConfig
from .page_choice import pages_to_read, select_pages
from .selection import PageSelection
from .torch_decode import attend_all, attend_pages

__all__ = ["sparse_decode", "sparse_decode_triton", "sparse_decode_native", "reads_every_page"]


def sparse_decode(query: torch.Tensor, cache: PagedKVCache, budget: int = OP.budget,
                  page_size: int | None = None, share_selection: bool = OP.share_selection,
                  return_lse: bool = False, return_selection: bool = False, *, scale: float | None = None,
                  group_score: str = OP.group_score, backend: str = "auto", key_mask: torch.Tensor | None = None,
                  recent: int = OP.recent, choose: str = OP.choose, config: SparseConfig | None = None,
                  softcap: float | None = None, sinks: torch.Tensor | None = None):
    r"""Decode attention over the ``budget`` cached tokens whose pages score highest.

    Pages are scored by an upper bound of q.k from their keys' min and max (Quest); page 0, the
    last page and the best others within ``budget`` are attended over exactly.

    Args:
        query (Tensor): one decode query per head, in any float dtype (cast to ``cache.dtype``).
        cache (PagedKVCache): the keys and values, holding ``L >= 1`` tokens.
        budget (int): tokens to read per selection head (>= 1); pages are whole, at least two
            are read. ``budget >= L`` is dense attention. Default: 2048.
        page_size (int, optional): checked against ``cache.page_size`` if given.
        share_selection (bool): ``True`` (default): the ``G = Hq // Hkv`` query heads of a KV group
            read the same pages (``budget`` rows per KV head); ``False``: each head chooses its own.
        return_lse, return_selection (bool): also return each head's log-sum-exp / the PageSelection.
        scale (float, optional): logit scale. Default: ``1 / sqrt(D)``.
        group_score (str): ``"max"`` or ``"sum"`` of a group's page bounds (shared selection).
        backend (str): ``"torch"``, ``"native"`` (one C++ operator on the CPU: scoring, choice and
            attention without the gather copy; float32 caches, no ``key_mask``, ``choose="bound"``),
            ``"triton"`` (CUDA, or ``TRITON_INTERPRET=1`` on CPU) or ``"auto"`` (triton for CUDA
            tensors when it imports and no ``key_mask``; native on the CPU where it fits and builds;
            else torch).
        key_mask (Tensor, optional): bool, ``True`` = attend; keys of padded sequences to ignore.
            Pages are chosen as without it; masked keys in them get no weight (torch backend).
        recent (int): the ``recent`` newest tokens' pages are always read, within the budget.
        choose (str): ``"bound"`` (Quest) or ``"oracle"`` (pages by true attention mass; reads
            every key: an evaluation tool, torch backend).
        config (SparseConfig, optional): its choice rule (share_selection, group_score,
            recent_window(), choose) instead of those keywords; ``budget`` stays the argument.
        softcap (float, optional): Gemma 2's ``softcap * tanh(logit / softcap)`` of the scaled
            logits inside attention (> 0; pages are ranked by the same bounds: the cap is monotonic).
        sinks (Tensor, optional): GPT-OSS's sink logits, ``(H_q,)``: each joins its head's softmax
            as a column with no value (any backend); ``lse`` then includes the sink's term.

    Shape:
        - query: :math:`(B, H_q, 1, D)`, :math:`H_q` a multiple of ``cache.kv_heads``; key_mask: :math:`(B, L)`
        - output: :math:`(B, H_q, 1, D_v)`, ``D_v = cache.value_dim``; lse: :math:`(B, H_q, 1)`

    Returns:
        ``out`` in ``query.dtype``; then ``lse`` (float32) if ``return_lse``; then a
        :class:`PageSelection` if ``return_selection``. Gradients flow to ``query`` (and ``sinks``)
        only. The torch path gathers into the cache's workspace: one decode per cache at a time.

    Example::

        >>> cache = PagedKVCache(batch=1, kv_heads=2, head_dim=64, page_size=16)
        >>> cache.append(torch.randn(1, 2, 1000, 64), torch.randn(1, 2, 1000, 64))
        >>> out, sel = sparse_decode(torch.randn(1, 8, 1, 64), cache, budget=128, return_selection=True)
        >>> out.shape, sel.pages.shape
        (torch.Size([1, 8, 1, 64]), torch.Size([1, 2, 8]))
    """
    how = _choice_of(config, share_selection, group_score, recent, choose)  # the choice rule, one dict
    return _run(query, cache, budget, page_size, how, backend, scale, key_mask, return_lse, return_selection,
                softcap, sinks)


def _run(query, cache, budget, page_size, how: dict, backend, scale, key_mask, return_lse, return_selection,
         softcap, sinks):
    """sparse_decode once its choice rule is one dict: checks, backend, decode, sinks, results."""
    scale = check_decode_args(query, cache, budget, page_size, how["group_score"], backend, scale, key_mask,
                              how["recent"], how["choose"], softcap=softcap, sinks=sinks)
    q = query.to(cache.dtype)  # (B, Hq, 1, D)
    backend = _fit_variants(backend, _pick_backend(q, cache, backend, key_mask, how["choose"]), cache, softcap)
    att = dict(softcap=softcap, exact_lse=sinks is not None)  # a sink rescales by the keys' lse: keep it exact
    pages, bounds, out, lse = _decode(backend, q, cache, budget, how, scale, key_mask, return_selection, att)
    out, lse = join_sinks(out, lse, sinks)  # (B, Hq, 1, Dv), (B, Hq, 1): the sink joins every softmax
    lse = lse.float()  # (B, Hq, 1) float32, as documented
    result = [out.to(query.dtype)] + ([lse] if return_lse else [])
    if return_selection:
        result.append(PageSelection(pages, bounds, lse, cache.page_size, cache.length, budget, query.shape[1],
                                    cache.kv_heads, **how))
    return result[0] if len(result) == 1 else tuple(result)


def _fit_variants(asked: str, picked: str, cache: PagedKVCache, softcap) -> str:
    """The native operator does not soft-cap: "auto" falls back to torch for a softcap, an explicit
    backend="native" is an error. (Sinks join after any backend; every backend takes value_dim.)"""
    if picked != "native" or softcap is None:
        return picked
    if asked == "native":
        raise GatherValueError(
            f"backend = 'native' does not support softcap (got softcap = {softcap!r}); use backend='torch' "
            f"or 'auto'")
    return "torch"


def _choice_of(config: SparseConfig | None, share_selection, group_score, recent, choose) -> dict:
    """{share_selection, group_score, recent, choose}: the keywords' without a config, else `config`'s
    (an error if a keyword also set one)."""
    if config is None:
        return dict(share_selection=share_selection, group_score=group_score, recent=recent, choose=choose)
    if not isinstance(config, SparseConfig):
        raise GatherTypeError(f"config must be a SparseConfig, got {type(config).__name__}")
    given = {"share_selection": share_selection, "group_score": group_score, "recent": recent, "choose": choose}
    for name, value in given.items():
        if value != getattr(OP, name):
            raise GatherValueError(f"{name} = {value!r} was given with config=; set it in the SparseConfig instead "
                                   f"(config.{name} = {getattr(config, name)!r})")
    return dict(share_selection=config.share_selection, group_score=config.group_score,
                recent=config.recent_window(), choose=config.choose)


def _decode(backend, q, cache, budget, how: dict, scale, key_mask, want_selection: bool, att: dict | None = None):
    """pages (B, Hsel, n) ascending (when wanted), bounds (B, Hsel, N), out (B, Hq, 1, Dv), lse (B, Hq, 1).

    A budget that buys every page is dense attention in place (no scoring unless the selection
    is wanted, no gather). att: the attention keywords of torch_decode (softcap, exact_lse).
    """
    att = att or {}
    if backend in ("torch", "native") and reads_every_page(cache, budget, how["recent"]):
        dense = fused_dense if backend == "native" else partial(attend_all, key_mask=key_mask, **att)
        out, lse = dense(q, cache, scale)  # (B, Hq, 1, Dv), (B, Hq, 1)
        pages, bounds = select_pages(q, cache, budget, scale=scale, **how) if want_selection else (None, None)
        return pages, bounds, out, lse
    if backend == "native":  # scoring, choice and attention in one C++ call, pages read in place
        return fused_select_attend(q, cache, budget, how, scale, want_selection)
    if backend == "triton":  # scoring in one kernel too: fewer launches per step on a GPU
        from .triton_decode import triton_attend_pages, triton_select_pages

        pages, bounds = triton_select_pages(q, cache, budget, how["share_selection"], how["group_score"],
                                            recent=how["recent"])  # pages unsorted
        out, lse = triton_attend_pages(q, cache, pages, scale, softcap=att.get("softcap"))  # (B, Hq, 1, Dv)
        return (pages.sort(dim=-1).values if want_selection else pages), bounds, out, lse
    pages, bounds = select_pages(q, cache, budget, scale=scale, **how)  # ascending
    return (pages, bounds, *attend_pages(q, cache, pages, scale, key_mask, **att))


def reads_every_page(cache: PagedKVCache, budget: int, recent: int = 0) -> bool:
    """True when `budget` (and the `recent` window) buys every page: decode is dense attention."""
    return pages_to_read(cache.length, cache.page_size, budget, recent)[0] >= cache.num_pages  # the one rule


def _pick_backend(q: torch.Tensor, cache, backend: str, key_mask, choose: str) -> str:
    """"torch" or "triton" for this call; a clear error when triton was asked for and cannot run."""
    if backend == "auto":
        supported = q.dtype in (torch.float32, torch.bfloat16, torch.float16)
        fits = q.is_cuda and supported and key_mask is None and choose == "bound"
        if fits and triton_available():
            return "triton"
        return "native" if fused_fits(q, cache, key_mask, choose) and fused_loaded() else "torch"
    if backend == "native" and not fused_fits(q, cache, key_mask, choose):
        raise GatherValueError(f"backend = 'native' runs float32 caches on the CPU without key_mask and with "
                               f"choose='bound' (got a {cache.dtype} cache on {q.device}, key_mask "
                               f"{'set' if key_mask is not None else 'None'}, choose={choose!r}); use 'torch' or 'auto'")
    if backend == "native" and not fused_loaded():
        raise GatherValueError("backend = 'native' but its C++ operator did not build (see the warning); "
                               "use backend='torch' or 'auto'")
    if backend == "triton" and key_mask is not None:
        raise GatherValueError("key_mask is supported by backend='torch' only; use backend='torch' or 'auto'")
    if backend == "triton" and choose != "bound":
        raise GatherValueError(f"choose = {choose!r} is supported by backend='torch' only; use 'torch' or 'auto'")
    if backend == "triton" and not triton_available():
        raise GatherValueError("backend = 'triton' but triton does not import; use backend='torch'")
    if backend == "triton" and not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise GatherValueError(f"backend = 'triton' needs CUDA tensors, got {q.device} (or run with "
                               f"TRITON_INTERPRET=1 for Triton's CPU interpreter)")
    return backend


def triton_available() -> bool:
    """True when triton imports (the GPU backend can run)."""
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def sparse_decode_triton(query, cache, budget: int = OP.budget, page_size=None, share_selection=OP.share_selection,
                         return_lse=False, return_selection=False, **kw):
    """`sparse_decode` with the Triton kernel (same signature and results)."""
    return sparse_decode(query, cache, budget, page_size, share_selection, return_lse,
                         return_selection, backend="triton", **kw)


def sparse_decode_native(query, cache, budget: int = OP.budget, page_size=None, share_selection=OP.share_selection,
                         return_lse=False, return_selection=False, **kw):
    """`sparse_decode` with the C++ operator (same signature and results, up to float rounding)."""
    return sparse_decode(query, cache, budget, page_size, share_selection, return_lse,
                         return_selection, backend="native", **kw)
