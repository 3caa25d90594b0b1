"""Sparse prefill inside HF models (models/attention/prefill.py): tiny random models, offline."""
from __future__ import annotations

import pytest
import torch

from gatherlens.errors import GatherTypeError

transformers = pytest.importorskip("transformers")

from gatherlens.models.hf_adapter import attn_implementation  # noqa: E402
from gatherlens.models.runtime.decoding import use_dense_decoding, use_sparse_decoding  # noqa: E402
from gatherlens.models.attention.prefill import (  # noqa: E402
    last_prefill_selections, prefill_settings, use_dense_prefill, use_sparse_prefill,
)
from gatherlens.ops.prefill.config import DEFAULT, EXACT  # noqa: E402

SPARSE = DEFAULT.replace(block_size=16, stride=4, min_length=0, budget=3, threshold=None, keep_selection=True)


def tiny(kind: str = "llama", kv_heads: int = 2, layers: int = 2):
    torch.manual_seed(0)
    common = dict(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                  pad_token_id=0, eos_token_id=None, bos_token_id=None)
    if kind == "mistral":
        cfg = transformers.MistralConfig(sliding_window=40, **common)
        return transformers.MistralForCausalLM(cfg).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


@pytest.fixture
def model():
    m = tiny()
    yield m
    use_dense_prefill(m)
    use_dense_decoding(m)


def _ids(n=150, seed=1):
    return torch.randint(1, 101, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind,kv_heads", [("llama", 1), ("llama", 2), ("llama", 4), ("mistral", 2)],
                         ids=["llama-mqa", "llama-gqa2", "llama-mha", "mistral-sliding40"])
@torch.no_grad()
def test_every_block_equals_dense_logits(kind, kv_heads):
    m = tiny(kind, kv_heads)
    ids = _ids()
    dense = m(ids).logits                                                     # (1, S, V)
    use_sparse_prefill(m, EXACT.replace(block_size=16, keep_selection=True))
    assert attn_implementation(m) == "gatherlens_prefill"
    torch.testing.assert_close(m(ids).logits, dense, atol=2e-5, rtol=1e-4)
    assert sorted(last_prefill_selections(m)) == [0, 1]                       # the sparse path ran


@torch.no_grad()
def test_sparse_prefill_keeps_maps_and_a_complete_cache(model):
    ids = _ids(200)
    use_sparse_prefill(model, SPARSE)
    cache = transformers.DynamicCache(config=model.config)
    model(ids, cache=cache, use_cache=True)
    assert cache.get_seq_length() == 200                                      # every key stored
    sels = last_prefill_selections(model)
    assert sorted(sels) == [0, 1]
    assert sels[0].blocks.shape == (1, 2, 13, 13) and sels[0].kept_share() < 1
    assert int(sels[0].blocks.sum(-1).max()) <= 3


@torch.no_grad()
def test_decoding_after_a_sparse_prefill_is_unchanged(model):
    """The first step after the prompt reads the same cache whichever way decoding runs."""
    ids = _ids(120)
    use_sparse_prefill(model, SPARSE)
    a = model.generate(ids, max_new_tokens=6, do_sample=False)
    use_sparse_decoding(model, budget=None)                                   # dense decoding over pages
    assert attn_implementation(model) == "gatherlens_sparse"
    b = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert a.tolist() == b.tolist()
    assert last_prefill_selections(model)                                     # its prefill went sparse too


def test_switches_combine_in_either_order(model):
    use_sparse_decoding(model, budget=64)
    use_sparse_prefill(model, SPARSE)
    assert attn_implementation(model) == "gatherlens_sparse" and prefill_settings(model.model.layers[0].self_attn)
    use_dense_decoding(model)
    assert attn_implementation(model) == "gatherlens_prefill"                # the prefill switch survives
    use_sparse_decoding(model, budget=64)
    use_dense_decoding(model)
    assert attn_implementation(model) == "gatherlens_prefill"
    use_dense_prefill(model)
    assert attn_implementation(model) == "sdpa" and prefill_settings(model.model.layers[0].self_attn) is None
    use_sparse_prefill(model, SPARSE)
    use_dense_decoding(model)                                                 # generate --dense's switch
    assert attn_implementation(model) == "gatherlens_prefill"


@torch.no_grad()
def test_short_prefills_padded_batches_and_dense_layers_run_densely(model):
    ids = _ids(100)
    dense = model(ids).logits
    use_sparse_prefill(model, SPARSE.replace(min_length=101))
    torch.testing.assert_close(model(ids).logits, dense)
    assert not last_prefill_selections(model)
    use_sparse_prefill(model, SPARSE.replace(dense_layers=1))
    model(ids)
    assert sorted(last_prefill_selections(model)) == [1]
    use_dense_prefill(model)
    batch = torch.cat([ids, _ids(100, seed=2)])                               # (2, 100)
    mask = torch.ones_like(batch)
    mask[1, :10] = 0                                                          # the second row left-padded
    want = model(batch, attention_mask=mask).logits
    use_sparse_prefill(model, SPARSE)
    torch.testing.assert_close(model(batch, attention_mask=mask).logits, want)
    assert not last_prefill_selections(model)


@torch.no_grad()
def test_a_later_chunk_counts_its_keys_for_min_length(model):
    """generate prefills a long prompt in chunks (generation.PREFILL_CHUNK): a chunk of fewer queries
    than min_length still runs sparsely once the keys reach it, and its blocks are the whole prompt's."""
    ids = _ids(160)
    config = SPARSE.replace(min_length=100)
    use_sparse_prefill(model, config)
    model(ids)
    whole = last_prefill_selections(model)[0].blocks                          # (1, Hkv, 10, 10)
    cache = transformers.DynamicCache(config=model.config)
    model(ids[:, :96], cache=cache, use_cache=True)                           # 96 keys < 100: dense
    assert last_prefill_selections(model)[0].query_len == 160                 # no new map: the whole run's
    model(ids[:, 96:], cache=cache, use_cache=True)                           # 64 queries over 160 keys: sparse
    sel = last_prefill_selections(model)[0]
    assert (sel.query_len, sel.key_len) == (64, 160)
    assert torch.equal(sel.blocks, whole[:, :, -sel.blocks.shape[2]:])       # (1, Hkv, 4, 10)


def test_a_wrong_config_is_refused(model):
    with pytest.raises(GatherTypeError, match="PrefillConfig"):
        use_sparse_prefill(model, {"budget": 3})
