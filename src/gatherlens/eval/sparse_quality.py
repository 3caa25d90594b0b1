"""How much page-selected sparse decoding changes a real model, against dense decoding, on real text.

    >>> use_sparse_decoding(lm.model)                       # once; budgets are set per run below
    >>> report = evaluate_sparse_quality(lm.model, ids, budgets=(256, 512, 1024, 2048), decode_tokens=256)
    >>> [r.setting for r in report.rows]
    ['dense', 'budget=256', 'budget=512', 'budget=1024', 'budget=2048']
    >>> report.rows[1].ppl_ratio, report.rows[1].recall, report.rows[1].cosine
    >>> setups = [SparseSetup(512), SparseSetup(512, dense_layers=2, recent=128), SparseSetup(512, choose="oracle")]
    >>> setups += [SparseSetup(512, kv_dtype="float16"), SparseSetup(None, kv_dtype="int8")]   # 16- / 8-bit pages
    >>> evaluate_sparse_quality(lm.model, ids, setups=setups, decode_tokens=512)   # one row per setup

Protocol (sparse selection applies to decoding only, as in Quest, so it is measured by decoding):
the first len(ids) - N tokens are prefilled densely once into a paged cache; then, for dense and
for every budget (or `SparseSetup`: page size, dense first layers, group score, recent window,
per-head choice, oracle), a copy of that cache (re-paged to the setup's page size) is extended
one token at a time over the last N tokens,
teacher-forced (each step feeds the true token, as in perplexity), so every one of the N
predictions is made by decode steps that see the whole long context through their budget.
- perplexity over those N tokens, and its ratio to dense (`ppl_ratio`, 1.0 = unchanged), with a
  95% interval from the paired per-token log-likelihood differences (`ppl_ratio_ci`);
- attention-mass recall: at each layer and step, the share of the dense softmax weight (same q, all
  keys) that falls on the tokens of the pages read, averaged over query heads, steps and layers;
- output cosine: cosine between the sparse attention output and the dense one for the same q;
- agreement, not only perplexity: `top1_agree`, the share of the N teacher-forced steps whose top-1
  token equals dense's; and from the same prefix, `greedy` tokens decoded greedily (each run its own
  tokens): `greedy_prefix`, how many equal dense's before the first divergence, and `greedy_margin`,
  dense's logit gap there between its own token and the sparse run's (a near-tie is a small gap);
- `pages_mean`: pages a selection head of a choosing layer read per step (the auto budget's own count).
Recall and cosine are taken along the sparse run (its own hidden states), like `topk_quality.py` does;
recall=False skips them (and the observers they need), so the steps run the fast paths.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.stats import EvalReport, EvalRow, LayerStats, check_ids, perplexity, positive_settings
from gatherlens.models.attention.cache import PagedLayer, WindowLayer
from gatherlens.models.attention.sparse import meter_pages
from gatherlens.models.runtime.decoding import (
    SparseCall, SparseKVCache, observe_sparse, use_dense_decoding, use_sparse_decoding,
)
from gatherlens.ops.sparse.config import DEFAULT, QUEST, SparseConfig

__all__ = ["SparseSetup", "SparseQualityRow", "SparseQualityReport", "SparseStats", "evaluate_sparse_quality",
           "prefill", "repage", "decode_teacher_forced", "call_recall_cosine", "setups_for_budgets",
           "default_setup", "comparison_setups", "kv_dtype_setups", "KV_PAGE_ROWS", "greedy_run", "divergence",
           "PageCounter"]


@dataclass(frozen=True)
class SparseSetup:
    """One row of the sparse quality table: a budget and how decode steps choose pages.

        >>> SparseSetup(512, dense_layers=2, recent=128).name
        'budget=512 dense_layers=2 recent=128'
        >>> SparseSetup(None).name, SparseSetup(256, label="mine").name, SparseSetup(None, kv_dtype="int8").name
        ('dense', 'mine', 'dense kv_dtype=int8')

    The fields are SparseConfig's (budget None: dense), their defaults Quest's plain setting (the
    QUEST preset); `label` names the row (default: the budget and every field that differs from
    that plain setting). `config()` is the SparseConfig the row decodes with.
    """

    budget: int | str | None
    page_size: int = QUEST.page_size
    dense_layers: int = QUEST.dense_layers
    group_score: str = QUEST.group_score
    share_selection: bool = QUEST.share_selection
    recent: int | None = QUEST.recent
    choose: str = QUEST.choose
    kv_dtype: str | None = QUEST.kv_dtype
    mass: float = QUEST.mass
    min_pages: int = QUEST.min_pages
    max_pages: int = QUEST.max_pages
    label: str | None = None

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        if self.budget is None:
            return "dense" if self.kv_dtype is None else f"dense kv_dtype={self.kv_dtype}"
        plain = SparseSetup(self.budget)
        parts = [f"budget={self.budget}"]
        parts += [f"{k}={v}" for k, v in self.options().items() if getattr(plain, k) != v
                  and (self.budget == "auto" or k not in ("mass", "min_pages", "max_pages"))]
        return " ".join(parts).replace("share_selection=False", "per-head")

    def options(self) -> dict:
        """use_sparse_decoding's keyword arguments besides the budget."""
        return {k: v for k, v in asdict(self).items() if k not in ("budget", "label")}

    def config(self) -> SparseConfig:
        """The SparseConfig of this row (SparseConfig's own defaults for what a setup does not set)."""
        return SparseConfig(self.budget, **self.options())


def setups_for_budgets(budgets, **common) -> list[SparseSetup]:
    """One setup per budget, named "budget=B", with the same other settings."""
    return [SparseSetup(b, label=f"budget={b}", **common) for b in budgets]


def default_setup(budget: int | str, **change) -> SparseSetup:
    """use_sparse_decoding's default settings at this budget (with `change`), labelled "... (default)"."""
    config = DEFAULT.replace(budget=budget, **change)
    options = {k: getattr(config, k) for k in SparseSetup(budget).options()}
    options["recent"] = config.recent_window()  # the library's rule
    name = SparseSetup(budget, **options).name
    return SparseSetup(budget, label=name if change else f"{name} (default)", **options)


KV_PAGE_ROWS = ("float32", "float16", "bfloat16", "int8")  # the storage dtypes the comparison table measures


def _relabel(label: str, kv_dtype: str) -> str:
    """A row's label for the same setting with pages in `kv_dtype` (no "(default)", one kv_dtype)."""
    return re.sub(r" kv_dtype=\S+| \(default\)", "", label) + f" kv_dtype={kv_dtype}"


def kv_dtype_setups(setups, kv_dtypes=KV_PAGE_ROWS) -> list[SparseSetup]:
    """Each setup once per storage dtype that differs from its own (named by the dtype), then dense
    decoding over pages of each: what 16- and 8-bit pages cost, apart from the page choice. None (the
    keys' own dtype) counts as float32: the dense row every ratio is taken against.

        >>> [s.name for s in kv_dtype_setups([SparseSetup(512)], ("float16", "int8"))]
        ['budget=512 kv_dtype=float16', 'budget=512 kv_dtype=int8', 'dense kv_dtype=float16', 'dense kv_dtype=int8']
    """
    out = [replace(s, kv_dtype=k, label=None if s.label is None else _relabel(s.label, k))
           for s in setups for k in kv_dtypes if k != (s.kv_dtype or "float32")]
    return out + [SparseSetup(None, kv_dtype=k) for k in kv_dtypes if k != "float32"]


def comparison_setups(budget: int = 512, small: int = 256, kv_dtypes=KV_PAGE_ROWS) -> list[SparseSetup]:
    """The table `gatherlens eval-sparse` runs: what each choice does to quality at small budgets.

    First the default itself (the auto budget). At `budget`: Quest's plain setting (page 16, group max,
    no dense layers, no window), then one
    change at a time (dense first layers, group sum, page 8 and 32, a recent window of a quarter
    of the budget, per-head choice), then the default, the default with the other head choice and the
    default's oracle (pages by true attention mass: the headroom of the page choice), the default
    with pages stored in 16 and 8 bits (KV_PAGE_ROWS), and dense decoding over such pages; at
    `small`: the plain setting, the default, its other head choice and its oracle.
    """
    plain = SparseSetup(budget)
    rows = [default_setup(DEFAULT.budget), plain, replace(plain, dense_layers=2), replace(plain, group_score="sum"), replace(plain, page_size=8),
            replace(plain, page_size=32), replace(plain, recent=budget // 4), replace(plain, share_selection=False)]
    for b in (budget, small):
        rows += [SparseSetup(b)] if b == small else []
        rows += [default_setup(b), default_setup(b, share_selection=not DEFAULT.share_selection),
                 default_setup(b, choose="oracle")]
        rows += kv_dtype_setups([default_setup(b)], kv_dtypes) if b == budget else []
    seen, out = set(), []
    for r in rows:  # the default may be one of the single changes: measure it once
        key = (r.budget, tuple(sorted(r.options().items())))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


@dataclass(kw_only=True)
class SparseQualityRow(EvalRow):
    budget: int | str | None     # None for dense
    ppl_ratio: float = 1.0       # perplexity / dense perplexity
    ppl_ratio_ci: list | None = None  # 95% interval of ppl_ratio from paired per-token differences
    top1_agree: float | None = None   # share of the teacher-forced steps whose top-1 token is dense's
    greedy_prefix: int | None = None  # greedy tokens equal to dense's before the first divergence
    greedy_tokens: int | None = None  # greedy tokens compared
    greedy_margin: float | None = None  # dense's logit gap there: its token's logit - the sparse run's token's
    pages_mean: float | None = None   # pages a selection head of a choosing layer read per step
    setup: dict = field(default_factory=dict)


class SparseQualityReport(EvalReport):
    columns = ("setting", "budget", "perplexity", "ppl_ratio", "nll", "tokens", "top1_agree", "greedy_prefix",
               "greedy_margin", "pages_mean", "recall", "recall_min_layer", "cosine", "cosine_min_layer")


@torch.no_grad()
def prefill(model, ids: torch.Tensor, page_size: int = QUEST.page_size) -> tuple[SparseKVCache, torch.Tensor]:
    """Dense forward of ids (1, S) into a fresh SparseKVCache; returns it and the last logits (1, V)."""
    cache = SparseKVCache(config=model.config, page_size=page_size)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[:, -1].float()  # (1, V)


def repage(cache: SparseKVCache, page_size: int, kv_dtype: str | None = None) -> SparseKVCache:
    """A copy of `cache` (same keys and values as read) in pages of `page_size` tokens stored in `kv_dtype`;
    a local (sliding-window, chunked) layer's ring is copied as it is (it has no pages)."""
    out = SparseKVCache(config=None, page_size=page_size, kv_dtype=kv_dtype)
    for layer in cache.layers:
        if isinstance(layer, WindowLayer):
            out.layers.append(layer.copy())
            continue
        paged = PagedLayer(page_size, kv_dtype)
        if layer.paged is not None:
            paged.append(layer.paged.keys, layer.paged.values)
        out.layers.append(paged)
    return out


@torch.no_grad()
def decode_teacher_forced(model, cache, logits: torch.Tensor, targets: torch.Tensor,
                          progress: Callable[[int], None] | None = None, tops: list | None = None) -> torch.Tensor:
    """-log p(target_t) for each of targets (1, N), feeding the true token one decode step at a time.

    logits (1, V): the prediction for targets[:, 0] (from prefill). Extends `cache` by N - 1 tokens.
    tops: a list that gets each step's top-1 token id. returns (N,) float64 negative log-likelihoods.
    """
    N = targets.shape[1]
    nll = torch.empty(N, dtype=torch.float64)
    for t in range(N):
        nll[t] = -torch.log_softmax(logits[0].double(), dim=-1)[targets[0, t]]
        if tops is not None:
            tops.append(int(logits[0].argmax()))
        if t + 1 < N:
            logits = model(input_ids=targets[:, t:t + 1], cache=cache, use_cache=True).logits[:, -1]  # (1, V)
        if progress:
            progress(1)
    return nll


@torch.no_grad()
def greedy_run(model, cache, logits: torch.Tensor, n: int, keep: bool = False):
    """n greedy tokens after a prefilled `cache` whose last logits (1, V) are given: (token ids, the
    logits (V,) float32 each was chosen from when `keep`, else [])."""
    made, kept = [], []
    for _ in range(n):
        made.append(int(logits[0].argmax()))
        kept += [logits[0].float().clone()] if keep else []
        if len(made) < n:
            logits = model(input_ids=torch.tensor([[made[-1]]]), cache=cache, use_cache=True).logits[:, -1]  # (1, V)
    return made, kept


def divergence(made: list, dense_made: list, dense_logits: list) -> tuple[int, float | None]:
    """(tokens equal before the first divergence, dense's logit gap there between its token and `made`'s;
    None when they never diverge).

        >>> divergence([1, 2, 3], [1, 2, 4], [None, None, torch.tensor([0., 0., 0., 1.5, 2.0])])
        (2, 0.5)
    """
    for i, (a, b) in enumerate(zip(made, dense_made)):
        if a != b:
            return i, float(dense_logits[i][b] - dense_logits[i][a])
    return min(len(made), len(dense_made)), None


class PageCounter:
    """A `meter_pages` meter: the pages a selection head of a choosing layer read, summed over steps."""

    def __init__(self):
        self.total, self.count = 0.0, 0

    def __call__(self, layer: int, counts: torch.Tensor, chose: bool) -> None:
        if chose:
            self.total += float(counts.sum())
            self.count += counts.numel()

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


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


def _measure_setting(model, cache0, logits0, targets, setup: SparseSetup, dense, progress, recall: bool = True,
                     greedy: int = 0):
    """Decode the targets from a copy of the prefilled cache with the decoding the model has now, then
    (greedy > 0) `greedy` greedy tokens from another copy. dense: the dense run's (nll, tops, greedy
    tokens, greedy logits), None for the dense run itself.

    Returns the row and this run's (nll (N,), tops, greedy tokens, greedy logits)."""
    stats, counter, tops = SparseStats(), PageCounter(), []
    step = (lambda n: progress(n, setup.name)) if progress else None
    with observe_sparse(stats) if recall else contextlib.nullcontext(), meter_pages(counter):
        nll = decode_teacher_forced(model, repage(cache0, setup.page_size, setup.kv_dtype), logits0, targets, step,
                                    tops)
        made, kept = greedy_run(model, repage(cache0, setup.page_size, setup.kv_dtype), logits0, greedy,
                                keep=dense is None) if greedy else ([], [])
    mean = float(nll.mean())
    row = SparseQualityRow(setting=setup.name, budget=setup.budget, perplexity=perplexity(mean), nll=mean,
                           tokens=targets.shape[1], setup=setup.options(), pages_mean=counter.mean(),
                           greedy_tokens=greedy or None, **stats.summary())
    if dense is not None:
        diff = nll - dense[0]  # (N,) paired per-token differences
        se = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
        row.ppl_ratio = math.exp(float(diff.mean()))
        row.ppl_ratio_ci = [math.exp(float(diff.mean()) - 1.96 * se), math.exp(float(diff.mean()) + 1.96 * se)]
        row.top1_agree = sum(a == b for a, b in zip(tops, dense[1])) / len(tops)
        if greedy:
            row.greedy_prefix, row.greedy_margin = divergence(made, dense[2], dense[3])
    return row, (nll, tops, made, kept)


def _common(setups: list[SparseSetup], name: str):
    """The setting `name` the setups share (what the meta records), or "per row" where they differ.

        >>> _common([SparseSetup(512, share_selection=False), SparseSetup(256, share_selection=False)], "share_selection")
        False
    """
    values = {getattr(s, name) for s in setups}
    return values.pop() if len(values) == 1 else "per row"


@torch.no_grad()
def evaluate_sparse_quality(model, ids: torch.Tensor, budgets=(256, 512, 1024, 2048), *, page_size: int = QUEST.page_size,
                            decode_tokens: int = 256, share_selection: bool = QUEST.share_selection,
                            group_score: str = QUEST.group_score, dense_layers: int = QUEST.dense_layers,
                            setups: list[SparseSetup] | None = None,
                            progress: Callable[[int, str], None] | None = None, recall: bool = True,
                            greedy: int = 0) -> SparseQualityReport:
    """Perplexity, recall and cosine of sparse decoding for each setup against dense (see module doc).

    model: a causal LM (Llama family). ids: (1, S) token ids, S > decode_tokens; the last
    `decode_tokens` are scored. setups: the rows to measure; without them, one per budget with
    page_size, share_selection, group_score and dense_layers (leading layers decoded densely; their
    defaults the QUEST preset's, as SparseSetup's).
    progress(advance, description) is called after each decode step. recall: measure attention-mass
    recall and cosine (observers: the slower paths). greedy: greedy tokens compared with dense's after
    the prefix (0: none). The model is left dense.
    """
    check_ids(ids, "S")
    if setups is None:
        setups = setups_for_budgets(positive_settings(budgets, "budgets", " (tokens)"), page_size=page_size,
                                    share_selection=share_selection, group_score=group_score,
                                    dense_layers=dense_layers)
    S, N = ids.shape[1], int(decode_tokens)
    if not 1 <= N < S:
        raise GatherValueError(
            f"decode_tokens = {N} must be in [1, {S}) for a text of {S} tokens (the rest is the prefix)")
    prefix, targets = ids[:, :S - N], ids[:, S - N:]  # (1, S-N), (1, N)
    rows: list[SparseQualityRow] = []
    try:
        use_sparse_decoding(model, budget=None, page_size=page_size)  # dense prefill into a paged cache
        cache0, logits0 = prefill(model, prefix, page_size)
        dense = None
        for setup in [SparseSetup(None, page_size=page_size, label="dense"), *setups]:
            use_sparse_decoding(model, config=setup.config())
            row, run = _measure_setting(model, cache0, logits0, targets, setup, dense, progress, recall, greedy)
            rows.append(row)
            dense = run if dense is None else dense
    finally:
        use_dense_decoding(model)
    meta = {"context": S, "prefix_tokens": S - N, "decode_tokens": N, "page_size": page_size,
            **{name: _common(setups, name) for name in ("share_selection", "group_score", "dense_layers")},
            "model_type": model.config.model_type, "protocol": "dense prefill, teacher-forced sparse decode",
            "ppl_ratio_ci": "95% interval from the paired per-token log-likelihood differences", "greedy": greedy,
            "top1_agree": "share of the teacher-forced steps whose top-1 token is dense's",
            "greedy_margin": "dense's logit gap at the first greedy divergence (its token's minus the row's)"}
    return SparseQualityReport(rows=rows, meta=meta)
