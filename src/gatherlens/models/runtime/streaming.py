"""`generate` one token at a time to a callback, with sparse decoding and a record of the pages read.

    >>> ids, dropped = fit_prompt(lm, lm.encode(text), max_new_tokens=64)   # keep the end if too long
    >>> result = stream_generate(lm, ids, budget=512, max_new_tokens=64, on_token=print, pages=True)
    >>> result.text, result.tokens_per_s, result.stopped       # stopped: Ctrl-C ended it early
    >>> result.trace                                           # a PageTrace (pages x steps per layer)

A consumer of the one generation loop (generation.generation_steps): each new token
reaches `on_token(text, result)` as soon as it exists. budget=None decodes densely (SDPA over
a DynamicCache). Ctrl-C (KeyboardInterrupt) stops generation cleanly: the result holds what
was generated, with `stopped=True`. With pages=True every sparse decode step is observed and
the result carries a `PageTrace` of which pages every layer read at every step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.runtime.generation import GenerationStart, GenerationStep, generation_steps
from gatherlens.ops.sparse.geometry import page_count
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
    page_size: int = 0             # tokens per page of the paged cache (GenerationStart's)
    page_counts: list = field(default_factory=list)  # per decode step: (layers, Hsel) int64 of the choosing layers

    def pages_per_step(self) -> dict | None:
        """Pages a selection head of a choosing layer read per decode step: {"mean", "min", "max", "steps",
        "layers", "heads"} over every step, layer and head; None when no layer chose (dense, short context)."""
        rows = [c for c in self.page_counts if c.numel()]
        if not rows:
            return None
        every = torch.cat([c.reshape(-1) for c in rows]).float()
        return {"mean": float(every.mean()), "min": int(every.min()), "max": int(every.max()), "steps": len(rows),
                "layers": rows[-1].shape[0], "heads": rows[-1].shape[1],
                "of": page_count(self.context, self.page_size) if self.page_size else None}

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
    if limit is not None and limit < 2:   # a prompt token and a new one need two positions
        raise GatherValueError(f"model {getattr(lm, 'name', '?')!r} says it has {limit} positions "
                               f"(max_position_embeddings, a GGUF's context_length): it cannot hold a prompt "
                               f"and a new token; its config is damaged or incomplete (it needs at least 2)")
    if limit is None or ids.shape[1] + max_new_tokens <= limit:
        return ids, 0
    room = limit - max_new_tokens
    if room < 1:
        raise GatherValueError(f"max_new_tokens = {max_new_tokens} leaves no room for a prompt in the model's "
                               f"{limit} positions; ask for fewer than {limit} new tokens")
    return ids[:, -room:], ids.shape[1] - room


def _take(result: GenerationResult, recorder: PageTraceRecorder | None, event: GenerationStep) -> None:
    """Add one step's token, text, time and pages to the result (and the recorder)."""
    result.new_ids.append(event.token_id)
    result.text = event.text
    if event.index == 0:
        result.prefill_seconds = event.seconds
    else:
        result.decode_seconds += event.seconds
    if event.page_counts is not None:  # the choosing layers' rows
        result.page_counts.append(event.page_counts[torch.tensor(event.chose, dtype=torch.bool)])
    if recorder is not None and event.index > 0:  # token 0 came from the (dense) prefill
        for read in event.pages:
            recorder(read)
        recorder.end_step(event.length, event.token)


@torch.no_grad()
def stream_generate(lm, ids: torch.Tensor, budget: int | None, max_new_tokens: int,
                    on_token: Callable[[str, GenerationResult], None] | None = None, pages: bool = False,
                    sampling=None, stop=None, **sparse) -> GenerationResult:
    """Generation of up to max_new_tokens after ids (1, S), streamed to on_token (see module doc).

    budget: tokens each decode step reads (None: dense). sampling: a SamplingConfig (None: greedy);
    stop: the ids that end it (None: the model's EOS). sparse: more use_sparse_decoding settings.
    The model is left with dense decoding.
    """
    result = GenerationResult(prompt_tokens=ids.shape[1], budget=budget)
    recorder = None
    steps = generation_steps(lm, ids, budget, max_new_tokens, pages=pages, sampling=sampling, stop=stop, **sparse)
    try:
        for event in steps:
            if isinstance(event, GenerationStart):
                result.page_size = event.page_size
            if isinstance(event, GenerationStart) and pages:
                recorder = PageTraceRecorder(event.layers, event.page_size, budget,
                                             meta={"model": getattr(lm, "name", "")})
            elif isinstance(event, GenerationStep):
                _take(result, recorder, event)
                if on_token is not None:
                    on_token(event.token, result)
    except KeyboardInterrupt:
        result.stopped = True
    finally:
        steps.close()  # back to dense decoding
    if recorder is not None and recorder.steps:
        result.trace = recorder.record()
    return result
