"""How much block-sparse prefill changes a real model, against a dense prefill, on real text.

    >>> report = evaluate_prefill_quality(lm.model, lm.tokenizer, ids, configs={"antidiagonal": DEFAULT})
    >>> [r.setting for r in report.rows], report.rows[1].ppl_ratio, report.rows[1].ppl_ratio_ci
    (['dense', 'antidiagonal'], 1.004, [0.998, 1.01])
    >>> report.rows[1].passkey_ok, report.rows[1].agree_tokens, report.rows[1].kept_share

Protocol (sparse prefill changes the prompt's own attention, so it is measured by prefilling):
- perplexity of the last `scored` tokens of the context (default 512 of an 8K Austen text), all
  predicted by the one prefill forward of the whole context; its ratio to dense (`ppl_ratio`) with
  a 95% interval from the paired per-token log-likelihood differences (`ppl_ratio_ci`);
- teacher-forced top-1 agreement (`top1_agree`): the share of the scored positions whose top-1 token
  equals the dense prefill's;
- agreement of the first `greedy` (32) greedy tokens after the context: how many of them equal the
  dense run's (`agree_tokens`), how many lead before the first difference (`agree_prefix`) and dense's
  logit gap there between its token and this run's (`agree_margin`: a near-tie is a small gap);
  decoding is dense in both runs, from the prefill's complete cache;
- passkey retrieval (eval/passkey.py's prompt) at `passkey_context` (8K) tokens, `trials` needle
  depths: `passkey_ok` of `passkey_trials` answers hold the key;
- `kept_share`: key blocks gathered / blocks causality allows, over every layer and head.
The model is left prefilling densely (`use_dense_prefill`); its decoding switch is not touched.
"""
from __future__ import annotations

import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.eval.passkey import passkey_prompt
from gatherlens.eval.stats import check_ids, perplexity
from gatherlens.models.hf_adapter import is_causal_lm
from gatherlens.models.attention.prefill import last_prefill_selections, use_dense_prefill, use_sparse_prefill
from gatherlens.ops.prefill.config import PrefillConfig
from gatherlens.ops.prefill.selection import kept_share

__all__ = ["PrefillQualityRow", "PrefillQualityReport", "evaluate_prefill_quality", "COLUMNS"]

COLUMNS = ("setting", "perplexity", "ppl_ratio", "ppl_ratio_ci", "top1_agree", "agree_tokens", "agree_prefix",
           "agree_margin", "passkey_ok", "passkey_trials", "kept_share", "prefill_s")


@dataclass
class PrefillQualityRow:
    """One prefill (dense, or one PrefillConfig) against the dense one."""

    setting: str
    perplexity: float
    nll: float
    tokens: int                          # tokens scored
    ppl_ratio: float | None = None       # perplexity / dense perplexity (None for dense)
    ppl_ratio_ci: list | None = None     # its 95% interval (paired per-token differences)
    top1_agree: float | None = None      # share of the scored positions whose top-1 token is dense's
    agree_tokens: int | None = None      # of the `greedy` tokens, how many equal dense's
    agree_prefix: int | None = None      # how many lead before the first difference
    agree_margin: float | None = None    # dense's logit gap there (its token's minus this run's)
    passkey_ok: int | None = None
    passkey_trials: int | None = None
    kept_share: float | None = None      # blocks gathered / blocks allowed (1.0 for dense)
    prefill_s: float | None = None       # seconds of the scored context's prefill (this machine, rough)
    greedy: list = field(default_factory=list)
    config: dict = field(default_factory=dict)


@dataclass
class PrefillQualityReport:
    rows: list
    meta: dict

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.rows]


def _switch(model, config: PrefillConfig | None) -> None:
    use_dense_prefill(model)
    if config is not None:
        use_sparse_prefill(model, config.replace(keep_selection=True))


@torch.no_grad()
def _score_and_continue(model, ids: torch.Tensor, scored: int, greedy: int, keep: bool = False):
    """One prefill of ids (1, S) -> per-token NLL of its last `scored` tokens (scored,), their top-1 tokens,
    the next `greedy` greedy tokens (dense decoding from the complete cache) and, when `keep`, the logits
    (V,) each was chosen from, the prefill's seconds."""
    from transformers import DynamicCache

    from gatherlens.eval.sparse_quality import greedy_run

    cache = DynamicCache(config=model.config)
    t0 = time.perf_counter()
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=scored + 1).logits  # (1, scored+1, V)
    seconds = time.perf_counter() - t0
    logp = torch.log_softmax(logits[0, :-1].float(), -1)                       # (scored, V)
    nll = -logp.gather(-1, ids[0, -scored:, None]).squeeze(-1)                 # (scored,)
    made, kept = greedy_run(model, cache, logits[:, -1], greedy, keep=keep)
    return nll.double(), logits[0, :-1].argmax(-1).tolist(), made, kept, seconds


@torch.no_grad()
def _passkeys(model, tokenizer, context: int, trials: int, seed: int = 0) -> int:
    """How many of `trials` passkey prompts (needle depths spread over (0, 1)) the model answers."""
    rng, ok = random.Random(seed), 0
    for t in range(trials):
        key = str(rng.randint(10000, 99999))
        ids = passkey_prompt(tokenizer, context, (t + 0.5) / trials, key)     # (1, S)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        found = re.findall(r"\d{5}", tokenizer.decode(out[0, ids.shape[1]:]))
        ok += bool(found) and found[0] == key
    return ok


def _row(name, run, dense, config) -> PrefillQualityRow:
    """One row from a run's (nll, tops, greedy tokens, kept logits, seconds) and dense's (None: this is dense)."""
    from gatherlens.eval.sparse_quality import divergence

    nll, tops, made, _, seconds = run
    mean = float(nll.mean())
    row = PrefillQualityRow(setting=name, perplexity=perplexity(mean), nll=mean, tokens=len(nll), prefill_s=seconds,
                            greedy=made, config={} if config is None else asdict(config))
    if dense is not None:
        diff = nll - dense[0]                                                  # (scored,) paired differences
        se = float(diff.std()) / math.sqrt(len(diff)) if len(diff) > 1 else 0.0
        row.ppl_ratio = math.exp(float(diff.mean()))
        row.ppl_ratio_ci = [math.exp(float(diff.mean()) - 1.96 * se), math.exp(float(diff.mean()) + 1.96 * se)]
        row.top1_agree = sum(a == b for a, b in zip(tops, dense[1])) / len(tops)
        row.agree_tokens = sum(a == b for a, b in zip(made, dense[2]))
        row.agree_prefix, row.agree_margin = divergence(made, dense[2], dense[3])
    return row


def evaluate_prefill_quality(model, tokenizer, ids: torch.Tensor, configs: dict[str, PrefillConfig], *,
                             scored: int = 512, greedy: int = 32, passkey_context: int | None = 8192,
                             trials: int = 5, passkey_dense: bool = True,
                             progress: Callable[[str], None] | None = None) -> PrefillQualityReport:
    """Dense prefill, then each named PrefillConfig, measured as the module doc says. ids: (1, S), S > scored.

    passkey_context None skips the passkey test; passkey_dense False skips it for the dense row only.
    progress(message) is called before each step.
    """
    check_ids(ids, "S")
    if not is_causal_lm(model) and not getattr(model.config, "is_decoder", False):
        raise GatherValueError(f"{type(model).__name__} ({model.config.model_type}) is not a causal LM: a "
                               f"prefill's perplexity needs next-token logits; give a ...ForCausalLM model")
    if not 1 <= scored < ids.shape[1]:
        raise GatherValueError(f"scored = {scored} must be in [1, {ids.shape[1]}) for a text of {ids.shape[1]} tokens")
    say = progress or (lambda message: None)
    rows, dense = [], None
    try:
        for name, config in [("dense", None), *configs.items()]:
            say(f"{name}: prefill of {ids.shape[1]} tokens, {greedy} greedy tokens")
            _switch(model, config)
            run = _score_and_continue(model, ids, scored, greedy, keep=dense is None)
            row = _row(name, run, dense, config)
            row.kept_share = 1.0 if config is None else kept_share(last_prefill_selections(model).values())
            if passkey_context and (config is not None or passkey_dense):
                say(f"{name}: {trials} passkey prompts of {passkey_context} tokens")
                row.passkey_ok, row.passkey_trials = _passkeys(model, tokenizer, passkey_context, trials), trials
            rows.append(row)
            dense = run if dense is None else dense
    finally:
        use_dense_prefill(model)
    meta = {"context": ids.shape[1], "scored": scored, "greedy": greedy, "passkey_context": passkey_context,
            "model_type": model.config.model_type, "protocol": "one prefill forward scores the last tokens; "
            "dense decoding after it", "ppl_ratio_ci": "95% interval from the paired per-token differences",
            "top1_agree": "share of the scored positions whose top-1 token is the dense prefill's",
            "agree_margin": "dense's logit gap at the first greedy divergence (its token's minus the row's)"}
    return PrefillQualityReport(rows=rows, meta=meta)
