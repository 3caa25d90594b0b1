"""Prefix reuse: a conversation's paged KV cache kept across requests, so the next turn prefills only what is new.

    >>> kept = PrefixCache(max_bytes=512 << 20, grid=512)   # least recently used out first, bounded in bytes
    >>> cache, reused = kept.take(ids[0].tolist())          # the kept cache sharing the longest prefix, cut to it
    >>> ... prefill ids[:, reused:] into cache, decode ...
    >>> kept.put(ids_in_cache, cache)                       # kept for the next turn (evicts to fit)

    >>> talk = Conversation(lm)                             # one conversation (gatherlens chat)
    >>> for piece in talk.stream(ids, 64, sampling, stop): print(piece, end="")

A turn of a chat re-sends the whole conversation; its tokens start with the previous turn's prompt and
answer. The pages already computed for them are still right (a causal model's keys and values of a
token depend only on the tokens before it), so the kept `SparseKVCache` is cut back to the longest
common prefix (`truncate`: whole pages kept, the last one partly; exact page summaries) and only the
rest of the prompt runs: a gather of cached pages instead of a prefill. A cache is taken out of the
store while a request uses it (two requests never share one) and put back when it ends. At least one
prompt token always runs (its logits give the first new token), so a prompt equal to a kept sequence
reuses all but its last token. A model with sliding-window layers keeps rings that cannot be cut back:
its kept cache is reused only when it is a whole prefix of the new prompt.

Reused is exactly what a run from scratch computes: a token's keys and values depend, in the last bits, on
the shape of the pass that made it (a prefill chunk of how many rows, or a decode step). So a store has a
`grid`, the prefill chunk its users run (chunks start at multiples of it, from position 0): an entry says
how many of its leading tokens whole chunks made (`solid`: the prompt's whole chunks, not the tokens decode
steps added), and a request reuses at most that, cut down to a multiple of the grid; the chunks it runs then
are a from-scratch run's. The same prompt again takes its kept logits too (`take_with_logits`). Greedy
answers are then the same with and without reuse, bit for bit (tests/test_prefix.py, tests/test_slots.py).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.attention.cache import SparseKVCache
from gatherlens.models.attention.window import WindowLayer
from gatherlens.models.runtime import generation as loop

__all__ = ["PrefixCache", "Conversation", "cache_bytes", "common_prefix", "holds_exactly", "MIN_REUSE"]

MIN_REUSE = 16   # fewer shared tokens than this are not worth keeping a cache for (a system prompt is more)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cache_bytes(cache: SparseKVCache) -> int:
    """The bytes a cache holds (its paged layers' storage and summaries; a window ring's keys and values)."""
    total = 0
    for layer in cache.layers:
        paged = getattr(layer, "paged", None)
        if paged is not None:
            total += paged.nbytes()
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if paged is None else ():
            total += t.numel() * t.element_size() if t is not None else 0
    return total


def _cuttable(cache: SparseKVCache) -> bool:
    return not any(isinstance(layer, WindowLayer) for layer in cache.layers)


@dataclass
class _Kept:
    ids: list[int]
    cache: SparseKVCache
    nbytes: int
    prompt: int = 0                    # with `logits`: the logits (V,) after ids[:prompt], its prompt's end
    logits: torch.Tensor | None = None
    solid: int = 0                     # leading tokens made by whole prefill chunks of the store's grid


class PrefixCache:
    """Kept caches by the token ids they hold, least recently used out first, at most `max_bytes` in all."""

    def __init__(self, max_bytes: int = 512 << 20, min_reuse: int = MIN_REUSE, grid: int | None = None):
        grid = loop.PREFILL_CHUNK if grid is None else grid   # the one generation loop's chunks (last_logits)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise GatherValueError(f"max_bytes = {max_bytes!r} must be an int >= 0 (0 keeps nothing)")
        if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
            raise GatherValueError(f"grid = {grid!r} must be an int >= 1 (the prefill chunk its users run)")
        self.max_bytes, self.min_reuse, self.grid = max_bytes, min_reuse, grid
        self.entries: OrderedDict[int, _Kept] = OrderedDict()   # oldest first
        self.lock = threading.Lock()
        self.hits = self.misses = self.evicted = 0
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def take(self, ids: list[int]) -> tuple[SparseKVCache | None, int]:
        """(cache, reused): the kept cache sharing the longest prefix with ids, out of the store and cut to
        `reused` tokens (< len(ids)); (None, 0) when none shares at least min_reuse tokens."""
        cache, reused, _ = self.take_with_logits(ids)
        if cache is not None and reused == len(ids):   # a caller without the logits runs the last token again
            reused -= 1
            with torch.inference_mode():
                cache.truncate(reused)
        return cache, reused

    def take_with_logits(self, ids: list[int]) -> tuple[SparseKVCache | None, int, torch.Tensor | None]:
        """take(), except that a kept request with exactly this prompt gives its whole prompt back with the
        logits after it (its first token's): (cache, len(ids), logits); the same prompt again then decodes
        from the very same numbers (no last token run through another path than its own prefill)."""
        with self.lock:
            best, reused, logits = None, 0, None
            for key, entry in self.entries.items():
                if entry.logits is not None and entry.prompt == len(ids) and entry.ids[:len(ids)] == ids:
                    best, reused, logits = key, len(ids), entry.logits
                    break
                n = min(common_prefix(entry.ids, ids), len(ids) - 1, entry.solid)
                n -= n % self.grid   # whole chunks: what a run from scratch computes alike
                if not _cuttable(entry.cache) and n < len(entry.ids):
                    continue   # rings of a sliding window cannot be cut back
                if n > reused:
                    best, reused = key, n
            if best is None or reused < self.min_reuse:
                self.misses += 1
                return None, 0, None
            entry = self.entries.pop(best)
            self.hits += 1
        if reused < len(entry.ids):
            with torch.inference_mode():   # its pages were written in inference mode (the generation loop's)
                entry.cache.truncate(reused)
        return entry.cache, reused, logits

    def put(self, ids: list[int], cache: SparseKVCache, prompt: int = 0, logits: torch.Tensor | None = None,
            solid: int | None = None) -> None:
        """Keep `cache`, which holds exactly the tokens `ids`; the least recently used go to make room.
        logits: the logits (V,) after ids[:prompt] (a request's prompt), kept for the same prompt again.
        solid: how many leading tokens whole prefill chunks of the grid made (None: all of them), the most
        a later request reuses (a token a decode step made, or a chunk cut short, is made again)."""
        if cache.get_seq_length() != len(ids):
            raise GatherValueError(f"the cache holds {cache.get_seq_length()} tokens but {len(ids)} ids were given")
        if logits is not None and not 0 < prompt <= len(ids):
            logits = None
        size = cache_bytes(cache) + (0 if logits is None else logits.numel() * logits.element_size())
        with self.lock:
            if len(ids) < self.min_reuse or size > self.max_bytes:
                return
            while self.entries and self.nbytes + size > self.max_bytes:
                self.entries.popitem(last=False)
                self.evicted += 1
            self._next += 1
            self.entries[self._next] = _Kept(list(ids), cache, size, prompt, logits,
                                             len(ids) if solid is None else min(solid, len(ids)))

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()

    def status(self) -> dict:
        return {"kept": len(self.entries), "bytes": self.nbytes, "max_bytes": self.max_bytes, "hits": self.hits,
                "misses": self.misses, "evicted": self.evicted}


def holds_exactly(cache: SparseKVCache, tokens: int) -> bool:
    """True when every layer of the cache holds `tokens` tokens (a run stopped inside a forward pass leaves
    some layers one token ahead: such a cache is not kept)."""
    lengths = {layer.get_seq_length() for layer in cache.layers}
    return lengths == {tokens}


class Conversation:
    """One conversation's generation with its cache kept between turns (what `gatherlens chat` runs)."""

    def __init__(self, lm, budget: int | None = None, max_bytes: int = 1 << 30):
        from gatherlens.ops.sparse.config import DEFAULT

        self.lm, self.budget, self.settings = lm, budget or DEFAULT.budget, DEFAULT
        self.kept = PrefixCache(max_bytes, min_reuse=1)   # its grid: the loop's chunks (last_logits)
        self.reused = 0   # prompt tokens the last turn took from the kept cache

    def _cache(self, prompt: list[int]) -> SparseKVCache:
        cache, self.reused = self.kept.take(prompt)
        if cache is None:
            cache = SparseKVCache(config=self.lm.config, page_size=self.settings.page_size,
                                  kv_dtype=self.settings.kv_dtype)
        return cache

    def stream(self, ids, max_new_tokens: int, sampling=None, stop=None) -> Iterator[str]:
        """The answer to the conversation ids (1, S), piece by piece; its cache kept for the next turn."""
        from gatherlens.models.runtime.generation import GenerationStep, generation_steps

        prompt = ids[0].tolist()
        cache = self._cache(prompt)
        steps = generation_steps(self.lm, ids, self.budget, max_new_tokens, sampling=sampling, stop=stop, cache=cache)
        new: list[int] = []
        try:
            for event in steps:
                if isinstance(event, GenerationStep):
                    new.append(event.token_id)
                    yield event.token
        finally:
            steps.close()
            held = prompt + new[:-1]   # the last token was chosen, never run
            if new and holds_exactly(cache, len(held)):
                self.kept.put(held, cache, solid=len(prompt) - len(prompt) % self.kept.grid)
