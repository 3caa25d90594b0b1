"""How much page-selected sparse decoding changes a real model, against dense decoding, on real text.

    >>> use_sparse_decoding(lm.model)                       # once; budgets are set per run below
    >>> report = evaluate_sparse_quality(lm.model, ids, budgets=(256, 512, 1024, 2048), decode_tokens=256)
    >>> [r.setting for r in report.rows]
    ['dense', 'budget=256', 'budget=512', 'budget=1024', 'budget=2048']
    >>> report.rows[1].ppl_ratio, report.rows[1].recall, report.rows[1].cosine

Protocol (sparse selection applies to decoding only, as in Quest, so it is measured by decoding):
the first len(ids) - N tokens are prefilled densely once into a paged cache; then, for dense and
for every budget, a copy of that cache is extended one token at a time over the last N tokens,
teacher-forced (each step feeds the true token, as in perplexity), so every one of the N
predictions is made by decode steps that see the whole long context through their budget.
- perplexity over those N tokens, and its ratio to dense (`ppl_ratio`, 1.0 = unchanged);
- attention-mass recall: at each layer and step, the share of the dense softmax weight (same q, all
  keys) that falls on the tokens of the pages read, averaged over query heads, steps and layers;
- output cosine: cosine between the sparse attention output and the dense one for the same q.
Recall and cosine are taken along the sparse run (its own hidden states), like `topk_quality.py` does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.stats import EvalReport, EvalRow, LayerStats, check_ids, perplexity, positive_settings
from gatherlens.models.sparse import (
    SparseCall, SparseKVCache, observe_sparse, use_dense_decoding, use_sparse_decoding,
)

__all__ = ["SparseQualityRow", "SparseQualityReport", "SparseStats", "evaluate_sparse_quality", "prefill",
           "decode_teacher_forced", "call_recall_cosine"]


@dataclass(kw_only=True)
class SparseQualityRow(EvalRow):
    budget: int | None           # None for dense
    ppl_ratio: float = 1.0       # perplexity / dense perplexity


class SparseQualityReport(EvalReport):
    columns = ("setting", "budget", "perplexity", "ppl_ratio", "nll", "tokens", "recall", "recall_min_layer",
               "cosine", "cosine_min_layer")


@torch.no_grad()
def prefill(model, ids: torch.Tensor, page_size: int = 16) -> tuple[SparseKVCache, torch.Tensor]:
    """Dense forward of ids (1, S) into a fresh SparseKVCache; returns it and the last logits (1, V)."""
    cache = SparseKVCache(config=model.config, page_size=page_size)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[:, -1].float()  # (1, V)


@torch.no_grad()
def decode_teacher_forced(model, cache, logits: torch.Tensor, targets: torch.Tensor,
                          progress: Callable[[int], None] | None = None) -> torch.Tensor:
    """-log p(target_t) for each of targets (1, N), feeding the true token one decode step at a time.

    logits (1, V): the prediction for targets[:, 0] (from prefill). Extends `cache` by N - 1 tokens.
    returns (N,) float64 negative log-likelihoods.
    """
    N = targets.shape[1]
    nll = torch.empty(N, dtype=torch.float64)
    for t in range(N):
        nll[t] = -torch.log_softmax(logits[0].double(), dim=-1)[targets[0, t]]
        if t + 1 < N:
            logits = model(input_ids=targets[:, t:t + 1], cache=cache, use_cache=True).logits[:, -1]  # (1, V)
        if progress:
            progress(1)
    return nll


def call_recall_cosine(call: SparseCall) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention-mass recall and output cosine of one decode step, per query head: (B, Hq) each."""
    q, cache, sel = call.query.float(), call.cache, call.selection  # q (B, Hq, 1, D)
    B, Hq, _, D = q.shape
    Hkv, L, P = cache.kv_heads, cache.length, cache.page_size
    G = Hq // Hkv
    qg = q.view(B, Hkv, G, D)  # (B, Hkv, G, D)
    logits = torch.matmul(qg, cache.keys.float().transpose(-1, -2)) * call.scale  # (B, Hkv, G, L)
    if call.mask is not None:
        logits = logits.masked_fill(~call.mask[:, :, 0].unsqueeze(2), float("-inf"))  # (B, Hkv, G, L)
    p = torch.softmax(logits, dim=-1)  # (B, Hkv, G, L)
    read = sel.mask().repeat_interleave(P, dim=-1)[..., :L]  # (B, Hsel, L) tokens of pages read
    read = read.view(B, Hkv, -1, L)  # (B, Hkv, 1 | G, L)
    recall = (p * read).sum(-1)  # (B, Hkv, G)
    dense = torch.matmul(p, cache.values.float())  # (B, Hkv, G, D)
    cos = torch.nn.functional.cosine_similarity(call.output.float().view(B, Hkv, G, D), dense, dim=-1)  # (B, Hkv, G)
    return recall.reshape(B, Hq), cos.reshape(B, Hq)


class SparseStats(LayerStats):
    """Recall and cosine per layer over every sparse decode step."""

    def measure(self, call: SparseCall) -> tuple[torch.Tensor, torch.Tensor]:
        return call_recall_cosine(call)


def _measure_setting(model, cache0, logits0, targets, budget: int | None, progress) -> SparseQualityRow:
    """Decode the targets from a copy of the prefilled cache with the decoding the model has now."""
    label = "dense" if budget is None else f"budget={budget}"
    stats = SparseStats()
    step = (lambda n: progress(n, label)) if progress else None
    with observe_sparse(stats):
        nll = decode_teacher_forced(model, copy.deepcopy(cache0), logits0, targets, step)
    mean = float(nll.mean())
    return SparseQualityRow(setting=label, budget=budget, perplexity=perplexity(mean), nll=mean,
                            tokens=targets.shape[1], **stats.summary())


@torch.no_grad()
def evaluate_sparse_quality(model, ids: torch.Tensor, budgets=(256, 512, 1024, 2048), *, page_size: int = 16,
                            decode_tokens: int = 256, share_selection: bool = True, group_score: str = "max",
                            dense_layers: int = 0,
                            progress: Callable[[int, str], None] | None = None) -> SparseQualityReport:
    """Perplexity, recall and cosine of sparse decoding for each budget against dense (see module doc).

    model: a causal LM (Llama family). ids: (1, S) token ids, S > decode_tokens; the last
    `decode_tokens` are scored. dense_layers: leading layers decoded densely (Quest: 2).
    progress(advance, description) is called after each decode step.
    The model is left with dense decoding (SDPA).
    """
    check_ids(ids, "S")
    budgets = positive_settings(budgets, "budgets", " (tokens)")
    S, N = ids.shape[1], int(decode_tokens)
    if not 1 <= N < S:
        raise GatherValueError(
            f"decode_tokens = {N} must be in [1, {S}) for a text of {S} tokens (the rest is the prefix)")
    prefix, targets = ids[:, :S - N], ids[:, S - N:]  # (1, S-N), (1, N)
    use_sparse_decoding(model, None, page_size)  # dense prefill into a paged cache
    rows: list[SparseQualityRow] = []
    try:
        cache0, logits0 = prefill(model, prefix, page_size)
        for budget in [None, *budgets]:
            use_sparse_decoding(model, budget, page_size, share_selection, group_score=group_score,
                                dense_layers=dense_layers)
            rows.append(_measure_setting(model, cache0, logits0, targets, budget, progress))
    finally:
        use_dense_decoding(model)
    for r in rows:
        r.ppl_ratio = r.perplexity / rows[0].perplexity
    meta = {"context": S, "prefix_tokens": S - N, "decode_tokens": N, "page_size": page_size,
            "share_selection": share_selection, "group_score": group_score, "dense_layers": dense_layers,
            "model_type": model.config.model_type, "protocol": "dense prefill, teacher-forced sparse decode"}
    return SparseQualityReport(rows=rows, meta=meta)
