"""Argument checks of `sparse_decode`.

    >>> scale = check_decode_args(q, cache, budget=64, page_size=None, group_score="max",
    ...                           scale=None, key_mask=None)                     # 1 / sqrt(D)
    >>> check_decode_args(..., variant=AttentionVariant(30.0, torch.zeros(Hq)))  # the same rules as topk_attention

Every message names the argument, the bad value and the valid range (gatherlens.errors). The
backend is checked by the one table that runs it (decode.SPARSE_DECODE).
"""
from __future__ import annotations

import math

import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.attention.checks import check_variant
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant

from .cache import PagedKVCache
from .config import check_budget, check_choice

__all__ = ["check_decode_args", "check_key_mask", "check_choice"]


def check_decode_args(query, cache, budget, page_size, group_score, scale, key_mask, recent=0,
                      choose="bound", *, variant: AttentionVariant = PLAIN) -> float:
    """Validate the arguments of `sparse_decode`; return the logit scale (default 1 / sqrt(D)).

    The variant's softcap and sinks follow topk_attention's checks (ops/attention/checks.py): their one home."""
    _check_query_and_cache(query, cache, budget, page_size)
    check_variant(variant, heads=query.shape[1], like=query)
    check_choice(recent, choose, group_score)
    if query.device != cache.device:
        raise GatherValueError(f"query is on {query.device} but the cache is on {cache.device}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale <= 0):
        raise GatherValueError(f"scale must be a finite number > 0 (default 1/sqrt(D)), got {scale!r}")
    if key_mask is not None:
        check_key_mask(key_mask, cache)
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


def _check_query_and_cache(query, cache, budget, page_size) -> None:
    if not isinstance(cache, PagedKVCache):
        raise GatherTypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    if not isinstance(query, torch.Tensor):
        raise GatherTypeError(f"query must be a torch.Tensor, got {type(query).__name__}")
    if not query.dtype.is_floating_point:
        raise GatherTypeError(f"query must be a floating tensor, got {query.dtype}")
    check_budget(budget)
    if page_size is not None and page_size != cache.page_size:
        raise GatherValueError(
            f"page_size = {page_size!r} does not match the cache's page_size = {cache.page_size}")
    if query.ndim != 4 or query.shape[2] != 1:
        raise GatherValueError(
            f"query has shape {tuple(query.shape)}; expected (B, Hq, 1, D): one decode query per head")
    B, Hq, _, D = query.shape
    if B != cache.batch or D != cache.head_dim:
        dv = "" if cache.value_dim == cache.head_dim else \
            f" (the keys' width; values are value_dim = {cache.value_dim})"
        raise GatherValueError(
            f"query (B, Hq, 1, D) = {tuple(query.shape)} does not match the cache's "
            f"batch = {cache.batch}, head_dim = {cache.head_dim}{dv}")
    if Hq == 0 or Hq % cache.kv_heads:
        raise GatherValueError(
            f"query heads Hq = {Hq} must be a multiple of the cache's kv_heads = {cache.kv_heads}")
    if cache.length == 0:
        raise GatherValueError("cache is empty (length 0): append keys and values before decoding")


def check_key_mask(key_mask, cache: PagedKVCache) -> None:
    """key_mask must be a (B, L) bool tensor on the cache's device, L = cache.length."""
    if not isinstance(key_mask, torch.Tensor):
        raise GatherTypeError(f"key_mask must be a torch.Tensor or None, got {type(key_mask).__name__}")
    if key_mask.dtype != torch.bool:
        raise GatherTypeError(f"key_mask has dtype {key_mask.dtype}; expected torch.bool (True = attend)")
    want = (cache.batch, cache.length)
    if tuple(key_mask.shape) != want:
        raise GatherValueError(
            f"key_mask has shape {tuple(key_mask.shape)}; expected (B, L) = {want}: one flag per cached key")
    if key_mask.device != cache.device:
        raise GatherValueError(f"key_mask is on {key_mask.device} but the cache is on {cache.device}")
