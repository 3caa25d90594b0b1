"""Sparse decoding inside HF models: a tiny random Llama (fast), SmolLM2 (slow)."""
from __future__ import annotations

import pytest
import torch

from gatherlens.errors import GatherTypeError, GatherValueError
from gatherlens.ops.sparse.naive import sparse_attention_reference

transformers = pytest.importorskip("transformers")

from gatherlens.models.runtime.decoding import (  # noqa: E402
    SparseKVCache, last_page_selections, observe_sparse, sparse_decoding, use_dense_decoding, use_sparse_decoding,
)


PLAIN = {"dense_layers": 0, "recent": 0, "dense_share": 1.0}  # Quest's plain rule: every layer, every budget < L


def tiny_llama(seed: int = 0, layers: int = 2, heads: int = 4, kv_heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                      pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture
def fresh(model):
    use_dense_decoding(model)
    yield model
    use_dense_decoding(model)


def _generate(model, ids, n=10, **kw):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, **kw)


@pytest.mark.parametrize("kv_heads", [1, 2, 4], ids=lambda h: f"kv_heads={h}")
def test_full_budget_equals_dense_greedy(kv_heads):
    m = tiny_llama(seed=kv_heads, kv_heads=kv_heads)
    ids = torch.randint(1, 101, (1, 37))
    dense = _generate(m, ids, 12)
    use_sparse_decoding(m, budget=1024, page_size=8)
    sparse = _generate(m, ids, 12)
    assert isinstance(sparse.cache, SparseKVCache)  # generate built the paged cache itself
    assert torch.equal(dense.sequences, sparse.sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(dense.logits, sparse.logits))
    assert diff <= 1e-4


def test_generate_reads_the_paged_cache_and_matches_reference(fresh):
    ids = torch.randint(1, 101, (1, 70))
    use_sparse_decoding(fresh, budget=24, page_size=8, keep_selection=True, **PLAIN)
    seen = []

    def check(call):
        assert call.cache.length == call.cache.keys.shape[2]
        ref, lse = sparse_attention_reference(call.query, call.cache.keys, call.cache.values,
                                              call.selection.pages, call.cache.page_size, scale=call.scale)
        torch.testing.assert_close(call.output, ref, atol=1e-5, rtol=1e-5)
        seen.append((call.layer, call.cache.length, call.selection.pages.shape[-1]))

    with observe_sparse(check):
        out = _generate(fresh, ids, 6)
    assert out.sequences.shape == (1, 76)
    # 5 decode steps x 2 layers; the cache grows one token per step; 24 tokens buy 3 of the 9-10 pages
    assert [s[1] for s in seen if s[0] == 0] == [71, 72, 73, 74, 75]
    assert all(n == 3 for _, L, n in seen)
    assert out.cache.paged(0).length == 75 and out.cache.get_seq_length() == 75
    sels = last_page_selections(fresh)
    assert sorted(sels) == [0, 1] and sels[0].pages[0, 0, 0] == 0  # page 0 (sinks) always read


def test_small_budget_changes_tokens_not_shapes(fresh):
    torch.manual_seed(3)
    ids = torch.randint(1, 101, (1, 120))
    dense = _generate(fresh, ids, 8)
    use_sparse_decoding(fresh, budget=16, page_size=8, **PLAIN)
    sparse = _generate(fresh, ids, 8)
    assert sparse.sequences.shape == dense.sequences.shape
    diff = max(float((a - b).abs().max()) for a, b in zip(dense.logits[1:], sparse.logits[1:]))
    assert diff > 1e-4  # it really reads fewer keys (the first token comes from the dense prefill)
    torch.testing.assert_close(sparse.logits[0], dense.logits[0])


def test_padded_batch_full_budget_equals_dense(fresh):
    ids = torch.randint(1, 101, (2, 30))
    mask = torch.ones_like(ids)
    ids[1, :7], mask[1, :7] = 0, 0  # left padding
    dense = _generate(fresh, ids, 8, attention_mask=mask)
    use_sparse_decoding(fresh, budget=4096, page_size=8)
    sparse = _generate(fresh, ids, 8, attention_mask=mask)
    assert torch.equal(dense.sequences, sparse.sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(dense.logits, sparse.logits))
    assert diff <= 1e-4


def test_padded_keys_get_no_weight(fresh):
    ids = torch.randint(1, 101, (2, 40))
    mask = torch.ones_like(ids)
    ids[1, :9], mask[1, :9] = 0, 0
    use_sparse_decoding(fresh, budget=16, page_size=8, **PLAIN)
    seen = []

    def check(call):
        from gatherlens.eval.sparse_quality import call_recall_cosine

        recall, _ = call_recall_cosine(call)
        assert call.mask is not None and not bool(call.mask[1, 0, 0, :9].any())
        seen.append(float(recall.min()))
        assert torch.isfinite(call.output).all()

    with observe_sparse(check):
        _generate(fresh, ids, 4, attention_mask=mask)
    assert seen and all(0.0 < r <= 1.0 + 1e-5 for r in seen)


def test_forward_with_dynamic_cache_pages_on_the_fly(fresh):
    from transformers import DynamicCache

    ids = torch.randint(1, 101, (1, 50))
    with torch.no_grad():
        cache = DynamicCache(config=fresh.config)
        fresh(input_ids=ids[:, :-1], cache=cache, use_cache=True)
        dense = fresh(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits
        use_sparse_decoding(fresh, budget=512, page_size=8)
        cache = DynamicCache(config=fresh.config)
        fresh(input_ids=ids[:, :-1], cache=cache, use_cache=True)
        sparse = fresh(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(sparse, dense, atol=1e-4, rtol=0)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_paged_cache_works_with_plain_attention(impl):
    m = tiny_llama(seed=5)
    m.set_attn_implementation(impl)
    ids = torch.randint(1, 101, (1, 21))
    with torch.no_grad():
        ref = m.generate(ids, max_new_tokens=5, do_sample=False)
        out = m.generate(ids, max_new_tokens=5, do_sample=False, cache=SparseKVCache(config=m.config, page_size=4))
    assert torch.equal(ref, out)


def test_switch_back_and_context_manager(fresh):
    ids = torch.randint(1, 101, (1, 20))
    with sparse_decoding(fresh, budget=64, page_size=4) as m:
        assert m.config._attn_implementation == "gatherlens_sparse"
        assert isinstance(_generate(m, ids, 2).cache, SparseKVCache)
    assert fresh.config._attn_implementation == "sdpa"
    assert not isinstance(_generate(fresh, ids, 2).cache, SparseKVCache)
    assert "_prepare_cache_for_generation" not in fresh.__dict__


def test_dense_layers_decode_densely(fresh):
    ids = torch.randint(1, 101, (1, 60))
    use_sparse_decoding(fresh, budget=16, page_size=8, dense_layers=1)
    layers = []
    with observe_sparse(lambda call: layers.append(call.layer)):
        _generate(fresh, ids, 3)
    assert set(layers) == {1}


@pytest.mark.parametrize("kw, err", [
    ({"budget": 0}, GatherValueError), ({"budget": 2.5}, GatherTypeError), ({"page_size": 0}, GatherValueError),
    ({"share_selection": "yes"}, GatherTypeError), ({"group_score": "mean"}, GatherValueError),
    ({"dense_layers": -1}, GatherValueError),
], ids=["budget0", "budget-float", "page0", "share-str", "group-mean", "dense-layers-neg"])
def test_bad_settings(fresh, kw, err):
    with pytest.raises(err):
        use_sparse_decoding(fresh, **kw)


def test_not_a_model():
    with pytest.raises(GatherTypeError, match="PreTrainedModel"):
        use_sparse_decoding(torch.nn.Linear(2, 2))


def test_sliding_window_config_gets_window_layers_and_other_types_are_refused():
    """Issue 19: sliding layers are supported now (a ring of their window, tests/test_arch_matrix.py);
    a layer type gatherlens cannot run is still refused, naming it."""
    from transformers import LlamaConfig, MistralConfig

    from gatherlens.models.attention.window import WindowLayer

    cfg = MistralConfig(num_hidden_layers=2, sliding_window=16, layer_types=["sliding_attention"] * 2)
    assert [type(layer) for layer in SparseKVCache(config=cfg).layers] == [WindowLayer, WindowLayer]
    cfg = LlamaConfig(num_hidden_layers=2)
    cfg.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(GatherValueError, match="layer type 'linear_attention'"):
        SparseKVCache(config=cfg)


def test_cache_beam_reorder_and_crop(fresh):
    ids = torch.randint(1, 101, (1, 33))
    use_sparse_decoding(fresh, budget=16, page_size=8)
    with torch.no_grad():
        out = fresh.generate(ids, max_new_tokens=4, num_beams=2, do_sample=False)
    assert out.shape == (1, 37)
    cache = SparseKVCache(config=fresh.config, page_size=8)
    with pytest.raises(GatherValueError, match="crop"):
        cache.layers[0].crop(-1)


# -- the planned decode step ------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [None, 16, 4096], ids=["dense", "budget=16", "budget=4096"])
def test_planned_step_equals_hf_layers(budget):
    """The planned decode step computes what transformers' layers compute over the same paged cache."""
    from gatherlens.models.runtime.step import installed_plan, step_declarations

    m = tiny_llama(seed=7, layers=3)
    ids = torch.randint(1, 101, (1, 45))
    use_sparse_decoding(m, budget=budget, page_size=8, step="hf")
    assert step_declarations(m)["planned"] is not None
    hf = _generate(m, ids, 8)
    use_sparse_decoding(m, budget=budget, page_size=8)
    assert step_declarations(m)["planned"] is None and len(installed_plan(m).layers) == 3
    planned = _generate(m, ids, 8)
    assert torch.equal(hf.sequences, planned.sequences)
    diff = max(float((a - b).abs().max()) for a, b in zip(hf.logits, planned.logits))
    assert diff <= 1e-4
    use_dense_decoding(m)
    assert installed_plan(m) is None


def test_planned_step_leaves_prefill_and_other_caches_to_hf(fresh):
    from transformers import DynamicCache

    use_sparse_decoding(fresh, budget=16, page_size=8)
    seen = []
    with observe_sparse(lambda call: seen.append(call.query.shape)):
        with torch.no_grad():
            fresh(input_ids=torch.randint(1, 101, (1, 30)), cache=DynamicCache(config=fresh.config), use_cache=True)
    assert seen == []  # a prefill (30 tokens) is dense SDPA


def test_sparse_cache_truncate_rewinds_generation(fresh):
    ids = torch.randint(1, 101, (1, 40))
    use_sparse_decoding(fresh, budget=4096, page_size=8)
    cache = SparseKVCache(config=fresh.config, page_size=8)
    with torch.no_grad():
        first = fresh.generate(ids, max_new_tokens=5, do_sample=False, cache=cache)
        assert cache.get_seq_length() == 44
        cache.truncate(39)  # back to the prompt minus its last token: generate feeds that one again
        again = fresh.generate(ids, max_new_tokens=5, do_sample=False, cache=cache)
    assert torch.equal(first, again)


def test_recent_and_oracle_settings_reach_the_decode_step(fresh):
    ids = torch.randint(1, 101, (1, 80))
    use_sparse_decoding(fresh, budget=24, page_size=8, recent=20, keep_selection=True, dense_layers=0)
    _generate(fresh, ids, 2)
    from gatherlens.models.runtime.decoding import last_page_selections

    sel = last_page_selections(fresh)[0]
    assert sel.recent == 20 and bool(sel.mask()[..., -3:].all())
    use_sparse_decoding(fresh, budget=24, page_size=8, choose="oracle", keep_selection=True, dense_layers=0)
    _generate(fresh, ids, 2)
    assert last_page_selections(fresh)[0].choose == "oracle"
    with pytest.raises(GatherValueError, match="choose"):
        use_sparse_decoding(fresh, budget=24, choose="best")
    with pytest.raises(GatherValueError, match="recent"):
        use_sparse_decoding(fresh, budget=24, recent=-2)


def test_a_budget_of_a_third_of_the_cache_decodes_densely(fresh):
    """dense_share: a budget of >= 1/3 of the cache reads every page (the selection says so)."""
    from gatherlens.models.runtime.decoding import last_page_selections

    ids = torch.randint(1, 101, (1, 100))
    use_sparse_decoding(fresh, budget=24, page_size=8, dense_layers=0, recent=0, keep_selection=True)
    _generate(fresh, ids, 2)  # the decode step sees 101 tokens: 24 < 101 / 3, sparse
    assert last_page_selections(fresh)[0].pages.shape[-1] == 3
    use_sparse_decoding(fresh, budget=24, page_size=8, dense_layers=0, recent=0, keep_selection=True, dense_share=0.2)
    _generate(fresh, ids, 2)
    sel = last_page_selections(fresh)[0]
    assert sel.pages.shape[-1] == sel.num_pages == 13  # 24 >= 0.2 * 101: every page
    with pytest.raises(GatherValueError, match="dense_share"):
        use_sparse_decoding(fresh, budget=24, dense_share=0)


def test_the_head_reads_a_transposed_copy_with_the_same_results(fresh):
    """The plan's head: x @ W.T stored contiguous, rebuilt when the weight changes; transformers' own
    forward keeps F.linear (the head module is untouched); use_dense_decoding frees the copy."""
    from gatherlens.models.runtime.head import TransposedHead
    from gatherlens.models.runtime.step import installed_plan

    head = fresh.get_output_embeddings()
    x = torch.randn(1, head.in_features)  # (1, d)
    want = torch.nn.functional.linear(x, head.weight)
    use_sparse_decoding(fresh, budget=24)
    product = installed_plan(fresh).head
    assert isinstance(product.run, TransposedHead) and "forward" not in head.__dict__
    with torch.no_grad():
        torch.testing.assert_close(product(x), want, rtol=1e-5, atol=1e-5)
        copy = product.run.copy
        head.weight.mul_(2)                                         # an in-place write: the copy follows
        torch.testing.assert_close(product(x), 2 * want, rtol=1e-5, atol=1e-5)
        head.weight.div_(2)
        assert product.run.copy is not copy
    use_dense_decoding(fresh)
    assert installed_plan(fresh) is None