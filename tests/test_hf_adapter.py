"""models/hf_adapter.py: the one module touching transformers' internals, and what it does on a tiny Llama.

The scan itself lives in tests/test_architecture.py (`transformers_touches`, with its rule that no
other module touches an internal); here it lists the adapter's own touches, each inside a function
that says which internal it relies on.
"""
from __future__ import annotations

import ast

import pytest
import torch
from test_architecture import HF_ADAPTER, SRC, transformers_touches, transformers_touches_by_module

from gatherlens.errors import GatherTypeError


# -- the scan -------------------------------------------------------------------------------------
def _enclosing_docs(tree: ast.AST) -> dict[int, str]:
    """line -> the docstrings of every function around it, joined."""
    docs: dict[int, str] = {}
    for func in ast.walk(tree):  # outer functions first, so inner ones add to them
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(func) or ""
            for line in range(func.lineno, func.end_lineno + 1):
                docs[line] = docs.get(line, "") + "\n" + doc
    return docs


def test_touches_of_transformers_internals_are_listed_and_explained():
    """Every touch is in the adapter (listed here: `pytest -s`), inside a function saying what it relies on."""
    found = transformers_touches_by_module()
    assert set(found) == {HF_ADAPTER}, f"touches outside the adapter: {sorted(set(found) - {HF_ADAPTER})}"
    tree = ast.parse((SRC / HF_ADAPTER).read_text(encoding="utf-8"))
    docs = _enclosing_docs(tree)
    print(f"\n{len(found[HF_ADAPTER])} touches of transformers internals, all in {HF_ADAPTER}:")
    unexplained = []
    for line, kind, what in found[HF_ADAPTER]:
        print(f"  {HF_ADAPTER}:{line}  {kind}: {what}")
        if "relies on" not in docs.get(line, "").lower():
            unexplained.append(f"line {line} ({kind}: {what})")
    assert not unexplained, "adapter touches without a 'relies on:' in their function's docstring: " + \
        ", ".join(unexplained)


BAD = {
    "private attribute": ["x = model.config._attn_implementation",
                          "model._prepare_cache_for_generation = f",
                          "hasattr(model, '_supports_default_dynamic_cache')",
                          "tok._tokenizer.x"],
    "private import": ["from transformers.cache_utils import Cache",
                       "import transformers.modeling_utils",
                       "from transformers import _private",
                       "transformers.masking_utils.sdpa_mask"],
    "forward replaced": ["layer.forward = f", "layer.__dict__.pop('forward', None)",
                         "setattr(layer, 'forward', f)", "x = 'forward' in layer.__dict__"],
    "class-name check": ["ok = type(layer).__name__ in ('LlamaDecoderLayer',)",
                         "ok = type(n).__name__.endswith('RMSNorm')",
                         "def f(m):\n    name = type(m).__name__\n    return name == 'GPT2Model'"],
    "kwargs handoff": ["def update(self, k, v, kwargs=None):\n    kwargs['gatherlens'] = self",
                       "def attn(m, q, **kwargs):\n    return kwargs.pop(PAGED_KWARG, None)"],
}
FINE = ["from transformers import AttentionInterface, Cache", "import transformers",
        "v = transformers.__version__", "self._x = 1", "torch._weight_int8pack_mm(a, b, c)",
        "n = W._version", "msg = f'{type(model).__name__} has no head'", "label = type(module).__name__",
        "def update(self, k, v, *args, **kwargs):\n    kwargs['x'] = 1", "layer.forward(x)",
        "from gatherlens.models.hf_adapter import attn_implementation"]


@pytest.mark.parametrize("kind,code", [(k, c) for k, codes in BAD.items() for c in codes])
def test_scan_sees_each_kind_of_touch(kind, code):
    assert kind in {k for _, k, _ in transformers_touches(ast.parse(code), set())}, code


@pytest.mark.parametrize("code", FINE)
def test_scan_leaves_public_use_alone(code):
    assert transformers_touches(ast.parse(code), set()) == [], code


# -- the adapter on a tiny random Llama -------------------------------------------------------------
transformers = pytest.importorskip("transformers")

from gatherlens.models import hf_adapter  # noqa: E402
from gatherlens.models.attention.topk import (  # noqa: E402
    attention_restored, topk_attention_enabled, use_dense_attention, use_topk_attention,
)
from gatherlens.models.runtime.decoding import (  # noqa: E402
    SparseKVCache, installed_plan, use_dense_decoding, use_sparse_decoding,
)


def tiny_llama(seed: int = 0, layers: int = 2):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                   pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _generate(model, ids, n=6):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False, return_dict_in_generate=True)


def test_unwrap_takes_a_loaded_model_and_refuses_anything_else(model):
    class Loaded:
        pass

    lm = Loaded()
    lm.model = model
    assert hf_adapter.unwrap(lm) is model and hf_adapter.unwrap(model) is model
    with pytest.raises(GatherTypeError, match="PreTrainedModel"):
        hf_adapter.unwrap(torch.nn.Linear(2, 2))


def test_attention_switched_and_restored(model):
    assert hf_adapter.attn_implementation(model) == hf_adapter.attn_implementation(model.config) == "sdpa"
    hf_adapter.set_attn_implementation(model, "eager")
    assert hf_adapter.attn_implementation(model) == "eager"
    with attention_restored(model):
        use_topk_attention(model, 3)
        assert hf_adapter.attn_implementation(model) == "gatherlens_topk"
        use_dense_attention(model, "sdpa")
    assert hf_adapter.attn_implementation(model) == "eager"  # what it was, not SDPA
    hf_adapter.set_attn_implementation(model, "sdpa")
    use_topk_attention(model, 5)
    with topk_attention_enabled(model, 2):
        assert model.config.gatherlens_top_k == 2
    assert hf_adapter.attn_implementation(model) == "gatherlens_topk" and model.config.gatherlens_top_k == 5
    use_dense_attention(model)
    assert hf_adapter.attn_implementation(model) == "sdpa" and "gatherlens_top_k" not in model.config.__dict__


def test_attention_restored_after_an_error(model):
    with pytest.raises(RuntimeError, match="boom"), attention_restored(model):
        use_topk_attention(model, 3)
        raise RuntimeError("boom")
    assert hf_adapter.attn_implementation(model) == "sdpa"


def test_preset_attn_implementation_reaches_the_built_model():
    cfg = tiny_llama().config
    hf_adapter.preset_attn_implementation(cfg, "eager")
    assert hf_adapter.attn_implementation(transformers.LlamaForCausalLM(cfg)) == "eager"


def test_registered_attention_gets_sdpas_mask_and_sdpa_is_found(model):
    from gatherlens.models.attention.topk import ATTN_NAME, register

    register()
    assert transformers.AttentionInterface()[ATTN_NAME] is not None
    assert transformers.AttentionMaskInterface()[ATTN_NAME] is transformers.AttentionMaskInterface()["sdpa"]
    q, k = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16)  # (B, Hq, Q, D), (B, Hkv, L, D)
    out, _ = hf_adapter.sdpa_attention()(model.model.layers[0].self_attn, q, k, k, None, is_causal=True)
    assert out.shape == (1, 3, 4, 16)  # (B, Q, Hq, D)


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "padded"])
def test_grouped_sdpa_equals_sdpa_on_a_masked_chunk(model, mask_kind):
    """A later prefill chunk (Q < L, causal from the bottom right): SDPA's enable_gqa gives transformers'
    repeat_kv result; no mask or one query goes to transformers' own function."""
    attn = model.model.layers[0].self_attn
    assert attn.num_key_value_groups > 1
    Hkv, G, Q, L, D = 2, attn.num_key_value_groups, 5, 13, 16
    q, k, v = torch.randn(2, Hkv * G, Q, D), torch.randn(2, Hkv, L, D), torch.randn(2, Hkv, L, D)
    mask = (torch.arange(L)[None, :] <= torch.arange(L - Q, L)[:, None]).expand(2, 1, Q, L).clone()  # (B, 1, Q, L)
    if mask_kind == "padded":
        mask[1, ..., :3] = False                                               # row 1's first 3 keys are padding
    if mask_kind == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out, _ = hf_adapter.grouped_sdpa(attn, q, k, v, mask, scaling=0.25)        # (B, Q, Hq, D)
    ref, _ = hf_adapter.sdpa_attention()(attn, q, k, v, mask, scaling=0.25)    # (B, Q, Hq, D)
    assert out.shape == ref.shape == (2, Q, Hkv * G, D)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for args in ((q, k, v, None), (q[:, :, -1:], k, v, mask[..., -1:, :])):    # no mask; one query
        torch.testing.assert_close(hf_adapter.grouped_sdpa(attn, *args, scaling=0.25)[0],
                                   hf_adapter.sdpa_attention()(attn, *args, scaling=0.25)[0])


def test_sparse_cache_by_default_and_generate_unchanged_after_dense(model):
    ids = torch.randint(1, 101, (1, 19))
    dense = _generate(model, ids)
    assert not isinstance(dense.cache, SparseKVCache)
    use_sparse_decoding(model, budget=1024, page_size=4)
    try:
        sparse = _generate(model, ids)
        assert isinstance(sparse.cache, SparseKVCache) and sparse.cache.page_size == 4
        passed = SparseKVCache(config=model.config, page_size=8)
        with torch.no_grad():  # a cache the caller gives is the one used
            model.generate(ids, max_new_tokens=2, do_sample=False, cache=passed)
        assert passed.get_seq_length() == ids.shape[1] + 1
        no_cache = model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=False,
                                  return_dict_in_generate=True)
        assert getattr(no_cache, "cache", None) is None
    finally:
        use_dense_decoding(model)
    assert torch.equal(sparse.sequences, dense.sequences)
    after = _generate(model, ids)
    assert type(after.cache) is type(dense.cache) and torch.equal(after.sequences, dense.sequences)
    assert "_prepare_cache_for_generation" not in model.__dict__


def test_default_cache_factory_and_restore():
    m = tiny_llama(seed=1)
    made = []

    def factory(model):
        made.append(model)
        return transformers.DynamicCache(config=model.config)

    hf_adapter.default_cache(m, factory)
    _generate(m, torch.randint(1, 101, (1, 7)), 2)
    assert made == [m]
    hf_adapter.restore_default_cache(m)
    _generate(m, torch.randint(1, 101, (1, 7)), 2)
    assert made == [m]


def test_decode_step_installed_and_removed(model):
    """use_sparse_decoding makes the model's forward the decode-step table (showing the class forward's
    signature: generate passes position_ids by it); the layers and the head keep their class forwards;
    use_dense_decoding gives the class forward back."""
    import inspect

    ids = torch.randint(1, 101, (1, 23))
    layers = hf_adapter.decoder_layers(model)
    assert len(layers) == 2 and not hf_adapter.forward_replaced(model)
    use_sparse_decoding(model, budget=8, page_size=4)
    try:
        assert installed_plan(model) is not None and hf_adapter.forward_replaced(model)
        assert "position_ids" in inspect.signature(model.forward).parameters
        assert not any(hf_adapter.forward_replaced(x) for x in layers)
        planned = _generate(model, ids)
        use_sparse_decoding(model, budget=8, page_size=4, step="hf")
        hf = _generate(model, ids)
    finally:
        use_dense_decoding(model)
    assert torch.equal(planned.sequences, hf.sequences)
    assert installed_plan(model) is None and not hf_adapter.forward_replaced(model)


def test_replace_forward_is_per_instance():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    hf_adapter.replace_forward(a, lambda self, x: x * 0)
    x = torch.ones(1, 2)  # (1, 2)
    assert torch.equal(a(x), torch.zeros(1, 2)) and not torch.equal(b(x), torch.zeros(1, 2))
    assert hf_adapter.forward_replaced(a) and not hf_adapter.forward_replaced(b)
    hf_adapter.restore_forward(a)
    hf_adapter.restore_forward(b)  # nothing to undo: no error
    assert not hf_adapter.forward_replaced(a) and torch.equal(a(x), torch.nn.functional.linear(x, a.weight, a.bias))


def test_class_names_and_causal_lm(model):
    assert hf_adapter.is_causal_lm(model) and not hf_adapter.is_causal_lm(model.model)
    layer = model.model.layers[0]
    assert hf_adapter.class_named(layer, ("LlamaDecoderLayer",))
    assert hf_adapter.class_named(layer.input_layernorm, suffix=("RMSNorm",))
    assert hf_adapter.class_named(layer, prefix=("Llama",)) and not hf_adapter.class_named(layer, ("Llama",))


def test_layer_types_of_a_config(model):
    types, per_layer = hf_adapter.layer_types(model.config)
    assert list(types) == ["full_attention"] * 2 and len(per_layer) == 2


def test_hand_over_only_for_the_same_keys():
    keys = torch.zeros(1, 2, 5, 4)  # (B, Hkv, L, D)
    hf_adapter.hand_over("step", keys)
    assert hf_adapter.handed_over(keys[:, :, :5]) == "step"  # a view of the same storage and shape
    assert hf_adapter.handed_over(keys) is None  # taken once
    hf_adapter.hand_over("step", keys)
    assert hf_adapter.handed_over(keys[:, :, :4]) is None  # another shape
    assert hf_adapter.handed_over(keys) is None  # and the slot is cleared all the same


def test_attention_reads_the_layers_own_paged_cache(model):
    """The cache hands each layer's PagedKVCache to its attention call (no temporary copy of the keys)."""
    from gatherlens.models.runtime.decoding import observe_sparse

    ids = torch.randint(1, 101, (1, 40))
    cache, seen = SparseKVCache(config=model.config, page_size=4), []
    use_sparse_decoding(model, budget=8, page_size=4, dense_layers=0, recent=0, step="hf")
    try:
        with torch.no_grad(), observe_sparse(lambda call: seen.append((call.layer, call.cache))):
            model.generate(ids, max_new_tokens=3, do_sample=False, cache=cache)
    finally:
        use_dense_decoding(model)
    assert len(seen) == 2 * 2  # two decode steps (the first token comes from the prefill), two layers
    assert all(paged is cache.paged(layer) for layer, paged in seen)
