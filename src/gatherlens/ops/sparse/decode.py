"""Sparse decode: score page summaries, gather only the chosen pages, attend over them exactly.

    >>> cache = PagedKVCache(batch=1, kv_heads=8, head_dim=128)
    >>> cache.append(k, v)                                  # (B, Hkv, L, D)
    >>> out = sparse_decode(q, cache, budget=2048)          # q (B, Hq, 1, D) -> (B, Hq, 1, D)
    >>> out, lse, sel = sparse_decode(q, cache, budget=2048, return_lse=True, return_selection=True)
    >>> out = sparse_decode(q, cache, budget=2048, softcap=50.0, sinks=s_aux)   # Gemma 2, GPT-OSS
    >>> pages, bounds, out, lse = decode_pages(q, cache, 2048, config.choice, 0.125)   # unchecked: the model's step
    >>> SPARSE_DECODE.why(q, cache, 2048, config.choice, 0.125, PLAIN, None, False)    # which rows run, why not

Reads the page summaries (2D per page) plus `budget` tokens of K and V, instead of all of K and V.
With budget >= cache.length every page is read and the result is dense attention. Pages stored in
16 bits or int8 (`PagedKVCache(kv_dtype=)`) are read by every row as the cache's `read_pages` reads them.
Pieces: checks.py (arguments), page_choice.py (which pages), torch_decode.py (gather + attend),
fused_decode.py (the C++ operator) and triton_decode.py (the GPU kernels, imported only when that
backend runs). Where a call runs is decided by ONE backend table, `SPARSE_DECODE` (ops/backends.py):
rows triton, native, torch, each declaring the variant fields and query dtypes it runs (anything else
is refused before its `fits` rule: fail closed); `decode_pages` is the one function that
selects and runs, called by `sparse_decode` after its argument checks and by the model adapter
(models/sparse_attention.decode_attention) directly: the checks cost more than the operator at one
token a step (~90 us against ~20 us a layer), and the adapter made its query and cache itself.
"""
from __future__ import annotations

import os

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant, join_sinks, variant_of
from gatherlens.ops.backends import AUTO, Impl, Operator

from .cache import PagedKVCache
from .checks import check_decode_args
from .config import OP, PageChoice, SparseConfig
from .fused_decode import NATIVE_DTYPES, fused_dense, fused_select_attend, native_fits, native_ready
from .page_choice import pages_to_read, select_pages, sorted_pages
from .selection import PageSelection
from .torch_decode import attend_all, attend_pages

__all__ = ["sparse_decode", "sparse_decode_triton", "sparse_decode_native", "reads_every_page", "decode_pages",
           "SPARSE_DECODE"]


def sparse_decode(query: torch.Tensor, cache: PagedKVCache, budget: int = OP.budget,
                  page_size: int | None = None, share_selection: bool = OP.share_selection,
                  return_lse: bool = False, return_selection: bool = False, *, scale: float | None = None,
                  group_score: str = OP.group_score, backend: str = "auto", key_mask: torch.Tensor | None = None,
                  recent: int = OP.recent, choose: str = OP.choose, config: SparseConfig | None = None,
                  softcap: float | None = None, sinks: torch.Tensor | None = None, variant=None, mass=None, min_pages=1):
    r"""Decode attention over the ``budget`` cached tokens whose pages score highest.

    Pages are scored by an upper bound of q.k from their keys' min and max (Quest); page 0, the
    last page and the best others within ``budget`` are attended over exactly.

    Args:
        query (Tensor): one decode query per head, in any float dtype (cast to ``cache.dtype``).
        cache (PagedKVCache): the keys and values, holding ``L >= 1`` tokens.
        budget (int): tokens to read per selection head (>= 1; pages whole, at least two). Default: 2048.
        page_size (int, optional): checked against ``cache.page_size`` if given.
        share_selection (bool): ``True`` (default): the ``G = Hq // Hkv`` query heads of a KV group
            read the same pages (``budget`` rows per KV head); ``False``: each head chooses its own.
        return_lse, return_selection (bool): also return each head's log-sum-exp / the PageSelection.
        scale (float, optional): logit scale. Default: ``1 / sqrt(D)``.
        group_score (str): ``"max"`` or ``"sum"`` of a group's page bounds (shared selection).
        backend (str): ``"torch"``, ``"native"`` (one C++ operator on the CPU: scoring, choice and
            attention without the gather copy; caches read in float32, pages stored in float32,
            float16, bfloat16 or int8; no ``key_mask``, ``choose="bound"``, no ``softcap``), ``"triton"`` (CUDA, or ``TRITON_INTERPRET=1`` on CPU) or ``"auto"``
            (triton for CUDA tensors when it imports and no ``key_mask``; native on the CPU where it
            fits and builds; else torch): the rows of ``SPARSE_DECODE`` (an error says why not).
        key_mask (Tensor, optional): bool, ``True`` = attend; keys of padded sequences to ignore.
            Pages are chosen as without it; masked keys in them get no weight (torch backend).
        recent (int): the ``recent`` newest tokens' pages are always read, within the budget.
        choose (str): ``"bound"`` (Quest) or ``"oracle"`` (pages by true attention mass; reads
            every key: an evaluation tool, torch backend).
        config (SparseConfig, optional): its choice rule (share_selection, group_score, recent_window(),
            choose; mass, min_pages) instead of those keywords; ``budget`` stays the argument.
        mass, min_pages: the auto budget: each selection head reads pages until their estimated mass
            reaches ``mass`` (page_choice.mass_counts), >= ``min_pages``, <= ``budget``'s; pages -1 padded.
        softcap (float, optional): Gemma 2's ``softcap * tanh(logit / softcap)`` of the scaled
            logits inside attention (> 0; pages are ranked by the same bounds: the cap is monotonic).
        sinks (Tensor, optional): GPT-OSS's sink logits, ``(H_q,)``: each joins its head's softmax
            as a column with no value (any backend); ``lse`` then includes the sink's term.
        variant (AttentionVariant, optional): softcap and sinks as one object, not with the keywords.

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
        (torch.Size([1, 8, 1, 64]), torch.Size([1, 2, 8]))"""
    choice = _choice_of(config, share_selection, group_score, recent, choose, mass, min_pages)  # the rule, one record
    variant = variant_of(softcap, sinks, variant)  # one object from here down
    return _run(query, cache, budget, page_size, choice, backend, scale, key_mask, return_lse, return_selection, variant)


def _run(query, cache, budget, page_size, choice: PageChoice, backend, scale, key_mask, return_lse,
         return_selection, variant: AttentionVariant):
    """sparse_decode once its choice rule is one record and its variant one object: checks, decode, results."""
    scale = check_decode_args(query, cache, budget, page_size, choice.group_score, scale, key_mask,
                              choice.recent, choice.choose, variant=variant)
    q = query.to(cache.dtype)  # (B, Hq, 1, D)
    pages, bounds, out, lse = decode_pages(q, cache, budget, choice, scale, variant, key_mask, return_selection,
                                           backend)  # (B, Hq, 1, Dv), (B, Hq, 1): sinks joined
    lse = lse.float()  # (B, Hq, 1) float32, as documented
    result = [out.to(query.dtype)] + ([lse] if return_lse else [])
    if return_selection:
        result.append(PageSelection(pages, bounds, lse, cache.page_size, cache.length, budget, query.shape[1],
                                    cache.kv_heads, **choice.kwargs()))
    return result[0] if len(result) == 1 else tuple(result)


_KEYWORDS = dict(share_selection=OP.share_selection, group_score=OP.group_score, recent=OP.recent, choose=OP.choose,
                 mass=None, min_pages=1)  # sparse_decode's keyword defaults of the choice rule


def _choice_of(config: SparseConfig | None, share_selection, group_score, recent, choose, mass=None,
               min_pages=1) -> PageChoice:
    """The PageChoice of the keywords without a config, else `config.choice` (an error if a keyword also
    set one)."""
    given = dict(share_selection=share_selection, group_score=group_score, recent=recent, choose=choose, mass=mass,
                 min_pages=min_pages)
    if config is None:
        return PageChoice(**given)
    if not isinstance(config, SparseConfig):
        raise GatherTypeError(f"config must be a SparseConfig, got {type(config).__name__}")
    for name, value in given.items():
        if value != _KEYWORDS[name]:
            raise GatherValueError(f"{name} = {value!r} was given with config=; set it in the SparseConfig instead "
                                   f"(config.{name} = {getattr(config, name)!r})")
    return config.choice


def decode_pages(q: torch.Tensor, cache: PagedKVCache, budget: int, choice: PageChoice, scale: float,
                 variant: AttentionVariant = PLAIN, key_mask: torch.Tensor | None = None,
                 want_selection: bool = False, backend: str = AUTO):
    """pages (B, Hsel, n) ascending (None unless wanted or on the sparse rows), bounds (B, Hsel, N)
    (None unless wanted), out (B, Hq, 1, Dv) in the compute dtype, lse (B, Hq, 1) with the sinks joined.

    The one function that picks where sparse decode runs (SPARSE_DECODE's rows) and runs it, for q
    (B, Hq, 1, D) already in the cache's dtype; no argument checks (sparse_decode makes them). `choice`:
    the page-choice rule (a PageChoice: a model's `SparseConfig.choice`; mass not None: the auto budget,
    `budget` its ceiling, pages padded with -1). A budget that buys every page is dense attention in
    place (no scoring unless the selection is wanted, no gather).
    """
    pages, bounds, out, lse = SPARSE_DECODE(q, cache, budget, choice, scale, variant, key_mask, want_selection,
                                            backend=backend)
    if variant.sinks is None:
        return pages, bounds, out, lse
    return (pages, bounds, *join_sinks(out, lse, variant.sinks))  # the sink joins every softmax


def reads_every_page(cache: PagedKVCache, budget: int, recent: int = 0) -> bool:
    """True when `budget` (and the `recent` window) buys every page: decode is dense attention."""
    return pages_to_read(cache.length, cache.page_size, budget, recent)[0] >= cache.num_pages  # the one rule


# -- the rows of SPARSE_DECODE: fits(q, cache, budget, choice, scale, variant, key_mask, want) -> None or why not --

_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _facts(q, cache, budget, choice, scale, variant, key_mask, want) -> tuple:
    """What the rows' declarations are checked against: the variant's fields in use, the query's dtype."""
    return variant, q.dtype


def _triton_fits(q, cache, budget, choice, scale, variant, key_mask, want) -> str | None:
    """"auto" takes Triton for CUDA tensors (the CPU interpreter only when asked)."""
    if not q.is_cuda:
        return "the query is not on a CUDA device"
    return _triton_asked(q, cache, budget, choice, scale, variant, key_mask, want)


def _triton_asked(q, cache, budget, choice, scale, variant, key_mask, want) -> str | None:
    if key_mask is not None:
        return "key_mask is supported by backend='torch' only"
    if choice.choose != "bound":
        return f"choose = {choice.choose!r} is supported by backend='torch' only"
    why = triton_ready()
    if why is None and not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return f"it needs CUDA tensors, got {q.device} (or run with TRITON_INTERPRET=1 for Triton's CPU interpreter)"
    return why


def _triton_run(q, cache, budget, choice, scale, variant, key_mask, want):
    """Scoring in one kernel too: fewer launches per step on a GPU."""
    from .triton_decode import triton_attend_pages, triton_select_pages

    pages, bounds = triton_select_pages(q, cache, budget, choice.share_selection, choice.group_score,
                                        recent=choice.recent, mass=choice.mass, min_pages=choice.min_pages,
                                        scale=scale)  # pages unsorted (-1: none)
    out, lse = triton_attend_pages(q, cache, pages, scale, softcap=variant.softcap)  # (B, Hq, 1, Dv)
    return (sorted_pages(pages) if want else pages), bounds, out, lse


def _native_run(q, cache, budget, choice, scale, variant, key_mask, want):
    """Scoring, choice and attention in one C++ call, pages read in place; every page: dense in place."""
    n, first = pages_to_read(cache.length, cache.page_size, budget, choice.recent)
    if n < cache.num_pages:
        return fused_select_attend(q, cache, n, first, choice, scale, want)
    out, lse = fused_dense(q, cache, scale)  # (B, Hq, 1, Dv), (B, Hq, 1)
    pages, bounds = select_pages(q, cache, budget, scale=scale, **choice.kwargs()) if want else (None, None)
    return pages, bounds, out, lse


def _torch_run(q, cache, budget, choice, scale, variant, key_mask, want):
    """select_pages, then the gather and exact attention; every page: dense in place (no gather)."""
    if reads_every_page(cache, budget, choice.recent):
        out, lse = attend_all(q, cache, scale, key_mask, variant=variant)  # (B, Hq, 1, Dv), (B, Hq, 1)
        pages, bounds = select_pages(q, cache, budget, scale=scale, **choice.kwargs()) if want else (None, None)
        return pages, bounds, out, lse
    pages, bounds = select_pages(q, cache, budget, scale=scale, **choice.kwargs())  # ascending
    return (pages, bounds, *attend_pages(q, cache, pages, scale, key_mask, variant=variant))


def triton_available() -> bool:
    """True when triton imports (the GPU backend can run)."""
    return triton_ready() is None


def triton_ready() -> str | None:
    """None when triton imports, else why the triton row cannot run here (asked once)."""
    global _TRITON_READY
    if _TRITON_READY is False:
        try:
            import triton  # noqa: F401
            _TRITON_READY = None
        except Exception as e:  # not installed, or a broken install
            _TRITON_READY = f"triton does not import ({type(e).__name__})"
    return _TRITON_READY


_TRITON_READY: str | None | bool = False  # False: not asked yet

# every row declares the variant fields it applies: sinks join after every row (decode_pages), soft-capping
# inside the kernels that have it; a window never reaches a paged decode (a local layer reads its ring)
SPARSE_DECODE = Operator("sparse_decode", [
    Impl("triton", _triton_fits, _triton_run, ready=triton_ready, asked=_triton_asked,
         variant=frozenset({"softcap", "sinks"}), dtypes=_TRITON_DTYPES),
    Impl("native", native_fits, _native_run, ready=native_ready, variant=frozenset({"sinks"}), dtypes=NATIVE_DTYPES),
    Impl("torch", lambda *args: None, _torch_run, variant=frozenset({"softcap", "sinks"})),  # the rest: any call
], facts=_facts)


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
