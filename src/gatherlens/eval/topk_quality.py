"""How much top-k attention changes a real model, against dense attention, on real text.

    >>> report = evaluate_quality(lm.model, ids, ks=(8, 32, 128, 512), window=512, stride=256)
    >>> [r.setting for r in report.rows]
    ['dense', 'k=8', 'k=32', 'k=128', 'k=512']
    >>> report.rows[1].perplexity, report.rows[1].recall, report.rows[1].cosine

Three numbers per k:
- perplexity over a sliding window (the Hugging Face recipe): windows of `window` tokens every
  `stride` tokens; each window scores only the tokens the previous one did not, so every token
  past the first window is predicted with at least window - stride tokens of context. The top-k
  model runs end to end, so its errors compound through the layers as they would in use.
- attention-mass recall: at every layer and scored query, the share of the dense softmax weight
  (computed from the same q and k) that falls on the k keys top-k attention gathered. 1.0 means
  the dropped keys carried no weight.
- output cosine: cosine similarity between the top-k attention output and the dense output of
  that layer, for the same inputs (per query and head, then averaged).
Recall and cosine are measured at each layer of the top-k run and averaged over layers, heads and
scored queries; `per_layer` keeps the layer means.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.stats import EvalReport, EvalRow, LayerStats, check_ids, perplexity, positive_settings
from gatherlens.models.attention.topk import (
    AttentionCall, attention_restored, observe_attention, use_dense_attention, use_topk_attention,
)
from gatherlens.models.hf_adapter import is_causal_lm

__all__ = ["QualityRow", "QualityReport", "TopkStats", "evaluate_quality", "sliding_windows", "dense_probs",
           "topk_recall_cosine"]


@dataclass(kw_only=True)
class QualityRow(EvalRow):
    top_k: int | None                 # None for dense


class QualityReport(EvalReport):
    columns = ("setting", "top_k", "perplexity", "nll", "tokens", "recall", "cosine", "recall_min_layer")


def sliding_windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, scored) per window: tokens [begin, end) are fed, the last `scored` scored.

        >>> sliding_windows(10, 4, 2)
        [(0, 4, 4), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
    """
    if window < 2 or not 0 < stride <= window:
        raise GatherValueError(f"window {window} / stride {stride}: need window >= 2 and 0 < stride <= window")
    out, prev_end, begin = [], 0, 0
    while True:
        end = min(begin + window, n)
        out.append((begin, end, end - prev_end))
        prev_end = end
        if end == n:
            return out
        begin += stride


def dense_probs(call: AttentionCall) -> torch.Tensor:
    """The dense softmax weights (B, Hq, Q, L) for the q, k and mask of one attention call."""
    q, k = call.query.float(), call.key.float()                         # (B, Hq, Q, D), (B, Hkv, L, D)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)           # (B, Hq, L, D)
    scale = call.scale if call.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q * scale, k.transpose(-1, -2))                    # (B, Hq, Q, L)
    if call.mask is not None:
        m = call.mask
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m.float()
    if call.is_causal:
        Q, L = s.shape[-2:]
        keep = torch.ones(Q, L, dtype=torch.bool, device=s.device).tril()  # (Q, L) top-left
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0)                     # (B, Hq, Q, L)


def topk_recall_cosine(call: AttentionCall, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention-mass recall and output cosine of one top-k call for query `rows`: (B, Hq, n) each."""
    p = dense_probs(call)[:, :, rows]                                    # (B, Hq, n, L)
    idx = call.selection.indices[:, :, rows]                             # (B, Hq, n, k)
    kept = p.gather(-1, idx.clamp(min=0)) * (idx >= 0)                   # (B, Hq, n, k)
    recall = kept.sum(-1)                                                # (B, Hq, n)
    v = call.value.float().repeat_interleave(call.query.shape[1] // call.value.shape[1], dim=1)  # (B, Hq, L, Dv)
    dense_out = torch.matmul(p, v)                                       # (B, Hq, n, Dv)
    cos = torch.nn.functional.cosine_similarity(
        call.output[:, :, rows].float(), dense_out, dim=-1)              # (B, Hq, n)
    return recall, cos


class TopkStats(LayerStats):
    """Recall and cosine per layer over the scored query rows (`rows`, set for each window)."""

    def __init__(self):
        super().__init__()
        self.rows = slice(None)

    def measure(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor]:
        return topk_recall_cosine(call, self.rows)


def _scored_nll(logits: torch.Tensor, ids: torch.Tensor, scored: int) -> tuple[float, int]:
    """Sum of -log p(token) over the last `scored` tokens of the window that have a predecessor."""
    n = ids.shape[1]
    first = max(n - scored, 1)                                           # position of the first scored token
    logp = torch.log_softmax(logits[0, first - 1:n - 1].double(), dim=-1)  # (m, V)
    target = ids[0, first:n]                                             # (m,)
    nll = -logp.gather(-1, target[:, None]).sum()
    return float(nll), int(target.numel())


def _measure_setting(model, ids: torch.Tensor, windows, k: int | None, lm_head: bool, progress) -> QualityRow:
    """Run every window with the attention the model has now; one row for setting k (None: dense)."""
    label = "dense" if k is None else f"k={k}"
    stats, nll_sum, tokens = TopkStats(), 0.0, 0
    with observe_attention(stats):
        for begin, end, scored in windows:
            chunk = ids[:, begin:end]                                    # (1, W)
            stats.rows = slice(chunk.shape[1] - scored, chunk.shape[1])
            out = model(input_ids=chunk)
            if lm_head:
                s, t = _scored_nll(out.logits, chunk, scored)
                nll_sum, tokens = nll_sum + s, tokens + t
            else:
                tokens += scored
            if progress:
                progress(1, label)
    nll = nll_sum / tokens if lm_head and tokens else None
    return QualityRow(setting=label, top_k=k, perplexity=perplexity(nll), nll=nll, tokens=tokens, **stats.summary())


@torch.no_grad()
def evaluate_quality(model, ids: torch.Tensor, ks=(8, 32, 128, 512), *, window: int = 512,
                     stride: int = 256, progress: Callable[[int, str], None] | None = None) -> QualityReport:
    """Perplexity, attention-mass recall and output cosine for dense and each k (see module doc).

    model: a transformers model (causal LM for perplexity; an encoder gets recall and cosine only).
    ids: (1, N) token ids. progress(advance, description) is called after each window.
    The model is left with the attention it had before.
    """
    check_ids(ids, "N")
    ks = positive_settings(ks, "ks")
    n = ids.shape[1]
    if n < 2:
        raise GatherValueError(f"the text has {n} token(s); need at least 2 to measure anything")
    windows = sliding_windows(n, window, stride)
    lm_head = is_causal_lm(model)
    rows = []
    with attention_restored(model):
        for k in [None, *ks]:
            if k is None:
                use_dense_attention(model, "sdpa")
            else:
                use_topk_attention(model, top_k=k)
            rows.append(_measure_setting(model, ids, windows, k, lm_head, progress))
    meta = {"tokens_total": n, "window": window, "stride": stride, "windows": len(windows),
            "model_type": model.config.model_type, "perplexity": lm_head}
    return QualityReport(rows=rows, meta=meta)
