"""`generate` one token at a time to a callback, with sparse decoding and a record of the pages read.

    >>> ids, dropped = fit_prompt(lm, lm.encode(text), max_new_tokens=64)   # keep the end if too long
    >>> result = stream_generate(lm, ids, budget=512, max_new_tokens=64, on_token=print, pages=True)
    >>> result.text, result.tokens_per_s, result.stopped       # stopped: Ctrl-C ended it early
    >>> result.trace                                           # a PageTrace (pages x steps per layer)

Runs the model's own `generate` (greedy) with a transformers streamer: each new token reaches
`on_token(text, result)` as soon as it exists. budget=None decodes densely (transformers'
default path). Ctrl-C (KeyboardInterrupt) stops generation cleanly: the result holds what was
generated, with `stopped=True`. With pages=True every sparse decode step is observed and the
result carries a `PageTrace` of which pages every layer read at every step.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.sparse import DEFAULTS, observe_sparse, use_dense_decoding, use_sparse_decoding
from gatherlens.trace.page_trace import PageTrace, PageTraceRecorder

__all__ = ["GenerationResult", "fit_prompt", "stream_generate"]


@dataclass
class GenerationResult:
    """What one streamed generation produced, and how fast."""

    prompt_tokens: int
    budget: int | None
    new_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefill_seconds: float = 0.0   # the prompt's forward pass (and the first token)
    decode_seconds: float = 0.0    # every later step
    stopped: bool = False          # Ctrl-C ended it early
    trace: PageTrace | None = None

    @property
    def context(self) -> int:
        """Tokens in the cache after the last step."""
        return self.prompt_tokens + len(self.new_ids)

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: tokens after the first over the time they took (None before two tokens)."""
        n = len(self.new_ids) - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else None


def fit_prompt(lm, ids: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, int]:
    """The prompt's last tokens that leave room for max_new_tokens in the model's positions.

    Returns (ids (1, S'), how many tokens were dropped from the start). A clear error when
    max_new_tokens alone does not fit.
    """
    limit = getattr(lm.config, "max_position_embeddings", None)
    if limit is None or ids.shape[1] + max_new_tokens <= limit:
        return ids, 0
    room = limit - max_new_tokens
    if room < 1:
        raise GatherValueError(f"max_new_tokens = {max_new_tokens} leaves no room for a prompt in the model's "
                               f"{limit} positions; ask for fewer than {limit} new tokens")
    return ids[:, -room:], ids.shape[1] - room


class _Streamer:
    """A transformers streamer: the prompt first (ignored), then every new token."""

    def __init__(self, lm, result: GenerationResult, on_token, recorder: PageTraceRecorder | None):
        self.lm, self.result, self.on_token, self.recorder = lm, result, on_token, recorder
        self.prompt_seen = False
        self.start = self.last = time.perf_counter()

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        now = time.perf_counter()
        r = self.result
        if r.new_ids:
            r.decode_seconds += now - self.last
        else:
            r.prefill_seconds = now - self.start
        self.last = now
        r.new_ids.append(int(value.reshape(-1)[0]))
        new_text = self.lm.tokenizer.decode(r.new_ids, skip_special_tokens=True)
        piece, r.text = new_text[len(r.text):], new_text
        if self.recorder is not None and len(r.new_ids) > 1:  # token 1 came from the (dense) prefill
            self.recorder.end_step(r.context - 1, piece)
        if self.on_token is not None:
            self.on_token(piece, r)

    def end(self) -> None:
        return None


@torch.no_grad()
def stream_generate(lm, ids: torch.Tensor, budget: int | None, max_new_tokens: int,
                    on_token: Callable[[str, GenerationResult], None] | None = None, pages: bool = False,
                    **sparse) -> GenerationResult:
    """Greedy `generate` of up to max_new_tokens after ids (1, S), streamed to on_token (see module doc).

    budget: tokens each decode step reads (None: dense). sparse: more use_sparse_decoding settings.
    The model is left with dense decoding.
    """
    model = lm.model
    result = GenerationResult(prompt_tokens=ids.shape[1], budget=budget)
    recorder = None
    if pages:
        recorder = PageTraceRecorder(model.config.num_hidden_layers, sparse.get("page_size", DEFAULTS["page_size"]), budget,
                                     meta={"model": getattr(lm, "name", "")})
    if budget is None:
        use_dense_decoding(model)
    else:
        use_sparse_decoding(model, budget, **sparse)
    streamer = _Streamer(lm, result, on_token, recorder)
    try:
        with observe_sparse(recorder) if recorder is not None else contextlib.nullcontext():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                           do_sample=False, streamer=streamer, pad_token_id=lm.tokenizer.eos_token_id)
    except KeyboardInterrupt:
        result.stopped = True
    finally:
        use_dense_decoding(model)
    if recorder is not None and recorder.steps:
        result.trace = recorder.record()
    return result
