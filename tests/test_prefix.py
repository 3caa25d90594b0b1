"""Prefix reuse (models/runtime/prefix.py): a kept cache cut back to the shared prefix continues exactly as a
run from scratch; the store is bounded in bytes, least recently used out first."""
from __future__ import annotations

import pytest
import torch

from chat_helpers import write_chat_model
from gatherlens.errors import GatherValueError
from gatherlens.models import load
from gatherlens.models.runtime.decoding import SparseKVCache
from gatherlens.models.runtime.generation import GenerationEnd, GenerationStart, generation_steps
from gatherlens.models.runtime.prefix import PrefixCache, cache_bytes, common_prefix, holds_exactly
from gatherlens.ops.sparse.config import DEFAULT


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load(str(write_chat_model(tmp_path_factory.mktemp("prefix") / "chat.gguf")), quantized=True,
                progress=False)


def _run(lm, ids, cache=None, n=8):
    """(new ids, the GenerationStart) of a greedy run of ids (1, S), from `cache` if given."""
    events = list(generation_steps(lm, ids, DEFAULT.budget, n, cache=cache, stop=()))
    return list(events[-1].new_ids), events[0]


def _filled(lm, ids) -> SparseKVCache:
    cache = SparseKVCache(config=lm.config, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)
    new, _ = _run(lm, ids, cache)
    return cache, ids[0].tolist() + new[:-1]


def test_a_reused_prefix_continues_exactly_as_a_run_from_scratch(lm, monkeypatch):
    """Prefill chunks of 16 (the loop's, and the store's grid): a prompt of 70 tokens keeps its first 64 (4 whole
    chunks); the next shares 60, reuses 48 (whole chunks) and runs the chunks a from-scratch run does, so
    its first logits and its greedy tokens are the from-scratch run's, bit for bit."""
    from gatherlens.models.runtime import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)
    g = torch.Generator().manual_seed(1)
    first = torch.randint(3, 300, (1, 70), generator=g)  # (1, 70): no control tokens
    cache, held = _filled(lm, first)
    assert holds_exactly(cache, len(held))
    kept = PrefixCache(max_bytes=64 << 20, grid=16)
    kept.put(held, cache, solid=64)
    second = torch.cat([torch.tensor([held[:60]]), torch.randint(3, 300, (1, 25), generator=g)], dim=1)  # (1, 85)
    reused_cache, reused = kept.take(second[0].tolist())
    assert reused == 48 and reused_cache.get_seq_length() == 48 and not kept.entries
    with torch.inference_mode():
        fresh = SparseKVCache(config=lm.config, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)
        from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding
        use_sparse_decoding(lm.model, config=DEFAULT)
        try:
            from_scratch = generation.last_logits(lm.model, fresh, second)  # (V,)
            from_kept = generation.last_logits(lm.model, _copy_of(lm, second, 48), second[:, 48:])  # (V,)
        finally:
            use_dense_decoding(lm.model)
    assert torch.equal(from_kept, from_scratch)
    again, start = _run(lm, second, reused_cache)
    scratch, _ = _run(lm, second)
    assert start.reused == 48 and again == scratch


def _copy_of(lm, ids, n: int) -> SparseKVCache:
    """A cache holding the first n tokens of ids, prefilled in the loop's chunks."""
    from gatherlens.models.runtime import generation

    cache = SparseKVCache(config=lm.config, page_size=DEFAULT.page_size, kv_dtype=DEFAULT.kv_dtype)
    generation.last_logits(lm.model, cache, ids[:, :n])
    return cache


def test_a_prompt_equal_to_the_kept_tokens_still_runs_its_last_token(lm):
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(2))
    cache, held = _filled(lm, ids)
    kept = PrefixCache(grid=1)
    kept.put(held, cache)
    same = torch.tensor([held])
    taken, reused = kept.take(held)
    assert reused == len(held) - 1
    assert _run(lm, same, taken)[0] == _run(lm, same)[0]


def test_the_store_is_bounded_in_bytes_least_recently_used_out_first(lm):
    caches = []
    for seed in range(3):
        ids = torch.randint(3, 300, (1, 30), generator=torch.Generator().manual_seed(10 + seed))
        caches.append(_filled(lm, ids))
    size = cache_bytes(caches[0][0])
    assert size > 0
    kept = PrefixCache(max_bytes=2 * size + size // 2, grid=1)
    for cache, held in caches:
        kept.put(held, cache)
    assert len(kept.entries) == 2 and kept.evicted == 1 and kept.nbytes <= kept.max_bytes
    assert kept.take(caches[0][1])[0] is None                 # the oldest went first
    assert kept.take(caches[2][1])[0] is caches[2][0] and kept.status()["hits"] == 1
    small = PrefixCache(max_bytes=size - 1, grid=1)
    small.put(caches[1][1], caches[1][0])
    assert not small.entries                                  # bigger than the whole store: not kept


def test_take_picks_the_longest_shared_prefix_and_refuses_short_ones():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    with pytest.raises(GatherValueError, match="max_bytes = -1 must be an int >= 0"):
        PrefixCache(max_bytes=-1)
    with pytest.raises(GatherValueError, match="grid = 0 must be an int >= 1"):
        PrefixCache(grid=0)


def test_a_kept_cache_that_holds_more_than_the_prompt_is_refused(lm):
    ids = torch.randint(3, 300, (1, 20), generator=torch.Generator().manual_seed(4))
    cache, held = _filled(lm, ids)
    with pytest.raises(GatherValueError, match=r"the kept cache holds \d+ tokens; a prompt of 20 needs fewer"):
        _run(lm, ids, cache)


@pytest.mark.slow
def test_smollm2_second_turn_reuses_the_first_and_answers_as_from_scratch(monkeypatch):
    """SmolLM2-135M-Instruct (Q4_1, from its blocks), prefill chunks of 16: the second turn of a chat takes the
    first turn's whole chunks and gives the greedy answer a from-scratch run gives."""
    from gatherlens.models.runtime import generation
    from gatherlens.models.runtime.chat import chat_prompt, chat_template_of
    from gatherlens.models.runtime.prefix import Conversation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 16)

    lm = load("smollm2", quantized=True)
    template = chat_template_of(lm)
    talk = Conversation(lm)
    chat = [{"role": "user", "content": "Name three colours of the rainbow."}]
    answer = "".join(talk.stream(chat_prompt(lm, chat, template), 24, None, template.stop_ids))
    chat += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And two more?"}]
    ids = chat_prompt(lm, chat, template)
    second = "".join(talk.stream(ids, 24, None, template.stop_ids))
    assert talk.reused >= 32 and talk.reused % 16 == 0
    events = list(generation_steps(lm, ids, DEFAULT.budget, 24, stop=template.stop_ids))
    assert second == next(e for e in events if isinstance(e, GenerationEnd)).text
    assert isinstance(events[0], GenerationStart) and events[0].reused == 0
