"""Several generations on one model at once: slots that prefill in chunks and decode together.

    >>> runner = SlotRunner(lm, PrefixCache(512 << 20, grid=128))    # prefill chunks of 128 (the grid)
    >>> runner.install()                                   # the model switched to sparse decoding (DEFAULT)
    >>> a, b = runner.admit(Ask(ids_a, 64, sampling_a)), runner.admit(Ask(ids_b, 64, sampling_b))
    >>> while not (a.done and b.done):
    ...     for slot, token, piece in runner.advance([s for s in (a, b) if not s.done]):
    ...         print(slot.number, repr(piece))
    >>> runner.release(a); runner.release(b)               # their caches kept for prefix reuse
    >>> runner.uninstall()

What a server's engine runs in its worker thread (serve/engine.py), one call at a time. A slot takes,
when admitted, the kept cache sharing the longest prefix with its prompt (models/runtime/prefix.py), so
only the rest of the prompt runs. Each `advance` gives every slot one turn: a slot still prefilling runs
its next chunk of `chunk` prompt tokens (the prefix store's grid; its first token comes from the last
chunk; chunks start at multiples of it, so a reused prefix ends where a from-scratch run's chunk does), and
every decoding slot feeds its last token in one step: one slot through the model's own forward (the
one-operator step where it runs), several through `batched_step` (models/runtime/batch.py: each weight
read once for all of them), one at a time where the model has no batch plan. Each slot chooses its
tokens with its own sampler (ops/sampling, its own seeded generator), detokenizes with its own
Detokenizer, and is done at a stop id or after max_new_tokens; `release` keeps its cache (the tokens it
holds) for the next request that shares them, with the logits after its prompt: the same prompt again starts
from those very numbers (and every decode step is bit-equal batched or alone: models/runtime/batch.py), so a
repeated greedy request gives the same answer, alone or beside others.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.files.watch import check_unchanged
from gatherlens.models.runtime.batch import batch_plan, batched_step
from gatherlens.models.runtime.decoding import SparseKVCache, use_dense_decoding, use_sparse_decoding
from gatherlens.models.runtime.detokenize import CONTEXT_TOKENS, Detokenizer
from gatherlens.models.runtime.generation import chooser, stop_ids
from gatherlens.models.runtime.prefix import PrefixCache, holds_exactly
from gatherlens.ops.sampling import greedy
from gatherlens.ops.sparse.config import DEFAULT, SparseConfig

__all__ = ["Ask", "Slot", "SlotRunner"]


@dataclass(frozen=True)
class Ask:
    """What one generation asks: the prompt's ids, at most max_new_tokens, how to choose, where to stop
    (None: the model's EOS ids)."""

    ids: tuple[int, ...]
    max_new_tokens: int
    sampling: object = None          # a SamplingConfig (None: greedy)
    stop: frozenset | None = None


@dataclass(eq=False)
class Slot:
    """One generation in progress: its cache, how far the prompt ran, what it generated."""

    number: int
    ask: Ask
    cache: SparseKVCache
    reused: int                      # prompt tokens taken from a kept cache
    ran: int                         # prompt tokens in the cache so far
    choose: object
    detok: Detokenizer
    stop: frozenset
    new: list[int] = field(default_factory=list)
    reason: str | None = None        # "stop" or "length" once done
    started: float = field(default_factory=time.perf_counter)
    first_token: float | None = None  # perf_counter() when the first token was chosen
    logits: torch.Tensor | None = None  # the logits (V,) after the prompt: kept (prefix reuse), or from its prefill

    @property
    def done(self) -> bool:
        return self.reason is not None

    @property
    def prefilling(self) -> bool:
        return self.ran < len(self.ask.ids)

    def tokens(self) -> list[int]:
        """The tokens the cache holds (the prompt so far, then each new token but the newest)."""
        return (list(self.ask.ids) + self.new)[:self.cache.get_seq_length()]


class SlotRunner:
    """Slots on one loaded model (see the module doc); not thread-safe: one call at a time."""

    def __init__(self, lm, prefix: PrefixCache | None = None, config: SparseConfig = DEFAULT,
                 chunk: int | None = None):
        self.lm, self.model, self.config = lm, lm.model, config
        self.prefix = prefix if prefix is not None else PrefixCache(0, grid=chunk)
        self.chunk = self.prefix.grid if chunk is None else chunk
        if self.prefix.grid != self.chunk:
            raise GatherValueError(f"the prefix store's grid ({self.prefix.grid}) must be the prefill chunk "
                                   f"({self.chunk}): reuse cuts at whole chunks")
        self.plan = None  # the batched step's DecodePlan, once installed (batch_plan)
        self.eos = frozenset(stop_ids(lm))
        self.numbers = itertools.count()
        self.steps = {"batched": 0, "single": 0, "prefill_chunks": 0}

    def install(self) -> None:
        """Switch the model to sparse decoding with this runner's config (the slots' caches are made so)."""
        use_sparse_decoding(self.model, config=self.config)
        self.plan = batch_plan(self.model)  # the plan use_sparse_decoding installed (None: one slot at a time)

    def uninstall(self) -> None:
        self.plan = None
        use_dense_decoding(self.model)

    def admit(self, ask: Ask) -> Slot:
        """A slot for `ask`, holding the kept cache that shares the longest prefix with its prompt."""
        ids = list(ask.ids)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if not ids or (limit is not None and len(ids) + ask.max_new_tokens > limit):
            raise GatherValueError(f"a prompt of {len(ids)} tokens and {ask.max_new_tokens} new tokens do not fit "
                                   f"the model's {limit} positions")
        cache, reused, logits = self.prefix.take_with_logits(ids)
        if cache is None:
            cache = SparseKVCache(config=self.model.config, page_size=self.config.page_size,
                                  kv_dtype=self.config.kv_dtype)
        cache.reserve(len(ids) + ask.max_new_tokens)
        detok = Detokenizer(self.lm.tokenizer, context=ids[-CONTEXT_TOKENS:])
        return Slot(next(self.numbers), ask, cache, reused, reused, chooser(ask.sampling, ids), detok,
                    ask.stop if ask.stop is not None else self.eos, logits=logits)

    def release(self, slot: Slot) -> None:
        """The slot's cache back into the prefix store (when every layer holds the same tokens)."""
        held = slot.tokens()
        if held and holds_exactly(slot.cache, len(held)):
            prompt = len(slot.ask.ids)
            self.prefix.put(held, slot.cache, prompt, slot.logits, solid=prompt - prompt % self.chunk)

    @torch.inference_mode()
    def advance(self, slots: list[Slot]) -> list[tuple[Slot, int, str]]:
        """One turn of every slot not done: a prefill chunk, or one decode step (all decoding slots together).
        Returns (slot, token id, its text) for every token chosen."""
        check_unchanged(self.model)
        out, starting = [], [s for s in slots if not s.new and not s.done]
        for slot in starting:   # a kept prompt's logits, else the next chunk of its prompt
            logits = slot.logits if not slot.prefilling else self._prefill_chunk(slot)
            if logits is not None:
                slot.logits = logits
                out.append(self._take(slot, logits))
        decoding = [s for s in slots if s.new and not s.done and s not in starting]  # (by identity: eq=False)
        if decoding:
            for slot, logits in zip(decoding, self._decode(decoding)):
                out.append(self._take(slot, logits))
        check_unchanged(self.model)   # a file changed during the step: its tokens are not given out
        return out

    def _prefill_chunk(self, slot: Slot) -> torch.Tensor | None:
        """Run the slot's next chunk of prompt; the last position's logits (V,) after its last chunk."""
        ids = torch.tensor([slot.ask.ids[slot.ran:slot.ran + self.chunk]])  # (1, <= chunk)
        last = slot.ran + ids.shape[1] == len(slot.ask.ids)
        result = self.model(input_ids=ids, cache=slot.cache, use_cache=True, logits_to_keep=1)
        slot.ran += ids.shape[1]
        self.steps["prefill_chunks"] += 1
        return result.logits[0, -1].clone() if last else None  # (V,)

    def _decode(self, slots: list[Slot]) -> list[torch.Tensor]:
        """Each slot's next logits (V,) after its last token: together where the model has a batch plan."""
        if len(slots) > 1 and self.plan is not None:
            self.steps["batched"] += 1
            return list(batched_step(self.model, self.plan, [s.new[-1] for s in slots], [s.cache for s in slots]))
        self.steps["single"] += len(slots)
        return [self.model(input_ids=torch.tensor([[s.new[-1]]]), cache=s.cache, use_cache=True).logits[0, -1]
                for s in slots]

    def _take(self, slot: Slot, logits: torch.Tensor) -> tuple[Slot, int, str]:
        """Choose the slot's next token from logits (V,), detokenize it, mark the slot done at a stop."""
        token = greedy(logits) if slot.choose is None else int(slot.choose(logits))
        slot.new.append(token)
        if slot.first_token is None:
            slot.first_token = time.perf_counter()
        piece = slot.detok.push(token)
        if token in slot.stop:
            slot.reason = "stop"
        elif len(slot.new) >= slot.ask.max_new_tokens:
            slot.reason = "length"
        return slot, token, piece
