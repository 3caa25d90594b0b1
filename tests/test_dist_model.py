"""`generate` with the KV cache split by sequence over gloo processes: the same greedy tokens as one process.

A tiny random Llama on 2 and 4 ranks (a rank left empty by the split included), and SmolLM2-135M
on 2 ranks with a short prompt, each dense (budget None) and page-selected (budget below length).
"""
from __future__ import annotations

import pytest
import torch

from gatherlens.dist import run_ranks
from gatherlens.errors import GatherValueError

pytest.importorskip("transformers")

TIMEOUT = 240
PROMPT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
          "must be in want of a wife. However little known the feelings or views of such a man may be")


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def tiny_ids():
    return torch.randint(1, 101, (1, 70), generator=torch.Generator().manual_seed(1))


def smollm2():
    import gatherlens

    lm = gatherlens.load("smollm2")
    return lm.model.eval(), lm.tokenizer(PROMPT, return_tensors="pt").input_ids


def _generate(model, ids, new, cache=None):
    with torch.no_grad():
        kw = {} if cache is None else {"cache": cache}
        return model.generate(ids, max_new_tokens=new, do_sample=False, **kw)


def worker(which: str, budgets: list, page: int, new: int, reference_on_rank0: bool = False):
    import torch.distributed as dist

    from gatherlens.dist.model import ShardedKVCache, use_sharded_decoding

    model, ids = (tiny_llama(), tiny_ids()) if which == "tiny" else smollm2()
    out = {}
    if reference_on_rank0 and dist.get_rank() == 0:  # one process's answer, before any sharding
        out["one process"] = one_process(model, ids, budgets, page, new)
    for budget in budgets:
        use_sharded_decoding(model, budget=budget)
        cache = ShardedKVCache(model.config, page_size=page)
        out[budget] = _generate(model, ids, new, cache)
        out[(budget, "held")] = [cache.layers[0].paged.length, cache.layers[0].lengths,
                                 cache.layers[0].paged.capacity]
    return out


def one_process(model, ids, budgets, page, new):
    from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding

    want = {}
    for budget in budgets:
        if budget is None:
            use_dense_decoding(model)
        else:
            use_sparse_decoding(model, budget=budget, page_size=page, dense_layers=0, recent=0,
                                share_selection=True)  # Quest's plain rule, as the sharded model
        want[budget] = _generate(model, ids, new)
    use_dense_decoding(model)
    return want


@pytest.mark.slow  # subprocesses: a process per rank
@pytest.mark.parametrize("world", [4])  # 2 ranks: the SmolLM2 test below
def test_tiny_llama_sharded_generate_equals_one_process(world):
    budgets, page, new = [None, 24], 8, 8
    results = run_ranks(worker, world, "tiny", budgets, page, new, timeout=TIMEOUT)
    want = one_process(tiny_llama(), tiny_ids(), budgets, page, new)
    for rank, res in enumerate(results):
        for budget in budgets:
            assert torch.equal(res[budget], want[budget]), (world, rank, budget)
        held, lengths, capacity = res[(None, "held")]
        assert sum(lengths) == 70 + new - 1 and held == lengths[rank]  # each rank holds only its part
        assert capacity < 70  # and allocates only for it, not for the whole prompt
    if world == 4:
        assert results[0][(None, "held")][1] == [24, 24, 29, 0]  # rank 3 holds nothing, rank 2 grows


@pytest.mark.slow  # subprocesses: a process per rank, the real model
def test_smollm2_sharded_generate_equals_one_process():
    budgets, page, new = [None, 32], 8, 6
    results = run_ranks(worker, 2, "smollm2", budgets, page, new, True, timeout=TIMEOUT)
    want = results[0]["one process"]  # rank 0 ran plain generate (no process group used) first
    assert want[None].shape[1] - new > 32  # the prompt is longer than the budget: pages are selected
    for res in results:
        for budget in budgets:
            assert torch.equal(res[budget], want[budget]), budget


def test_sharded_cache_needs_a_process_group():
    from gatherlens.dist.model import ShardedKVCache

    with pytest.raises(GatherValueError, match="process group"):
        ShardedKVCache(tiny_llama().config)
