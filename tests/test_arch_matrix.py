"""use_topk_attention and use_sparse_decoding across transformers' decoder architectures.

Tiny random models made here from each architecture's own config class (offline, fixed seeds, a
few layers, hidden 32, vocab 100); local layers get an 8-token window so that a 20-token prompt
and 6 new tokens wrap their rings. For each: top-k at full k equals dense logits; sparse decoding
at a budget above the context gives dense's greedy tokens; a small budget runs and reads fewer
pages; a left-padded batch of two matches each row alone; the tracer records the embedding gather.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lanes import sweep  # noqa: E402

from gatherlens.errors import GatherValueError  # noqa: E402
from gatherlens.models import use_dense_attention, use_topk_attention  # noqa: E402
from gatherlens.models.attention.topk import topk_attention_forward  # noqa: E402
from gatherlens.models.attention.features import global_rank, layer_kinds  # noqa: E402
from gatherlens.models.runtime.decoding import SparseKVCache, observe_sparse, use_dense_decoding, use_sparse_decoding  # noqa: E402
from gatherlens.models.attention.window import WindowLayer  # noqa: E402
from gatherlens.trace import trace  # noqa: E402

W = 8            # the window of every local layer
PROMPT, NEW = 20, 6
BASE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=None, eos_token_id=None)
FULL = dict(budget=1024, page_size=4, dense_layers=0, kv_dtype=None)  # every page, float32: dense, through the paged cache
SMALL = dict(budget=8, page_size=4, dense_layers=0, recent=0, dense_share=1.0)  # 2 of the 5-7 pages
HYBRID3 = ["sliding_attention", "full_attention", "sliding_attention"]
HYBRID4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


@dataclass(frozen=True)
class Arch:
    name: str
    config: str                    # transformers config class
    model: str                     # transformers causal-LM class
    kw: dict = field(default_factory=dict)
    base: bool = True              # start from BASE (False: the config takes other names, GPT-2)


ARCHS = [
    Arch("llama", "LlamaConfig", "LlamaForCausalLM"),
    Arch("qwen2", "Qwen2Config", "Qwen2ForCausalLM"),
    Arch("qwen2-sliding", "Qwen2Config", "Qwen2ForCausalLM",
         dict(use_sliding_window=True, sliding_window=W, max_window_layers=1)),
    Arch("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8)),
    Arch("mistral", "MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    Arch("mistral-sliding", "MistralConfig", "MistralForCausalLM", dict(sliding_window=W)),
    Arch("phi3", "Phi3Config", "Phi3ForCausalLM"),
    Arch("olmo2", "Olmo2Config", "Olmo2ForCausalLM"),
    Arch("gpt-neox", "GPTNeoXConfig", "GPTNeoXForCausalLM"),
    Arch("gpt2", "GPT2Config", "GPT2LMHeadModel",
         dict(vocab_size=100, n_embd=32, n_layer=3, n_head=4, n_positions=256, n_inner=64, pad_token_id=0,
              bos_token_id=None, eos_token_id=None), base=False),
    Arch("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2)),
    Arch("qwen3-moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         dict(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    Arch("granite", "GraniteConfig", "GraniteForCausalLM"),
    Arch("glm4", "Glm4Config", "Glm4ForCausalLM", dict(head_dim=8)),
    Arch("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM"),
    Arch("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
         dict(head_dim=8, sliding_window=W, attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
              query_pre_attn_scalar=8, initializer_range=0.3)),  # logits of a few units: the cap bites
    Arch("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
         dict(head_dim=8, sliding_window=W, num_hidden_layers=4, query_pre_attn_scalar=8,
              layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"])),
    Arch("cohere2", "Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=W, num_hidden_layers=4,
                                                                 layer_types=HYBRID4)),
    Arch("gpt-oss", "GptOssConfig", "GptOssForCausalLM",
         dict(head_dim=8, sliding_window=W, num_local_experts=4, num_experts_per_tok=2, layer_types=HYBRID3,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    Arch("deepseek-v3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
         dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
              v_head_dim=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
              moe_intermediate_size=32, first_k_dense_replace=1, n_shared_experts=1)),
    Arch("llama4", "Llama4TextConfig", "Llama4ForCausalLM",
         dict(head_dim=8, attention_chunk_size=W, num_hidden_layers=4, num_local_experts=2, num_experts_per_tok=1,
              intermediate_size_mlp=64, interleave_moe_layer_step=2, no_rope_layer_interval=2)),
]
_built: dict[str, torch.nn.Module] = {}


def build(arch: Arch):
    """The arch's tiny model (made once per session), or a skip naming what is not installed."""
    if arch.name not in _built:
        missing = [c for c in (arch.config, arch.model) if not hasattr(transformers, c)]
        if missing:
            pytest.skip(f"{', '.join(missing)} not in transformers {transformers.__version__}")
        torch.manual_seed(0)
        config = getattr(transformers, arch.config)(**({**BASE, **arch.kw} if arch.base else arch.kw))
        _built[arch.name] = getattr(transformers, arch.model)(config).eval()
    return _built[arch.name]


@pytest.fixture(params=sweep(ARCHS, fast=ARCHS[0]), ids=[a.name for a in ARCHS])  # llama fast, the sweep slow
def model(request):
    m = build(request.param)
    use_dense_decoding(m)
    use_dense_attention(m)
    yield m
    use_dense_decoding(m)
    use_dense_attention(m)


def _ids(length: int = PROMPT, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, 100, (1, length), generator=torch.Generator().manual_seed(seed))


def _generate(m, ids, mask=None, n=NEW):
    with torch.no_grad():
        return m.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)


def _close(a, b, atol=1e-4) -> float:
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    assert diff <= atol, diff
    return diff


def test_topk_at_full_k_equals_dense(model):
    ids = _ids()
    with torch.no_grad():
        dense = model(ids).logits  # (1, L, V)
        use_topk_attention(model, top_k=1024)
        topk = model(ids).logits
    _close([dense], [topk], atol=1e-5)


def test_sparse_full_budget_gives_dense_greedy_tokens(model):
    ids = _ids()
    dense = _generate(model, ids)
    use_sparse_decoding(model, **FULL)
    sparse = _generate(model, ids)
    assert isinstance(sparse.cache, SparseKVCache)
    assert torch.equal(dense.sequences, sparse.sequences)
    _close(dense.logits, sparse.logits)
    kinds = layer_kinds(model.config)
    for kind, layer in zip(kinds, sparse.cache.layers):  # local layers hold their window, never more
        assert isinstance(layer, WindowLayer) == kind.local
        if kind.local:
            assert layer.keys.shape[2] == kind.window == W and layer.get_seq_length() == PROMPT + NEW - 1


def test_small_budget_runs_and_reads_fewer_pages(model):
    use_sparse_decoding(model, **SMALL)
    seen = []
    with observe_sparse(lambda call: seen.append((call.layer, call.selection.pages.shape[-1], call.cache.num_pages))):
        out = _generate(model, _ids())
    assert out.sequences.shape == (1, PROMPT + NEW)
    assert all(torch.isfinite(x).all() for x in out.logits)
    kinds = layer_kinds(model.config)
    globals_ = [i for i, k in enumerate(kinds) if not k.local]
    assert sorted({layer for layer, _, _ in seen}) == globals_  # only global layers select pages
    if globals_:
        assert all(n == 2 < pages for _, n, pages in seen)


def test_left_padded_batch_matches_each_row(model):
    """Prompts of 10 and 5 tokens: the short row's padding lies inside the 8-token window of the
    first decode steps, after the rings have wrapped."""
    L = 10
    rows = [_ids(L, seed=2)[0], _ids(L - 5, seed=3)[0]]
    ids = torch.zeros(2, L, dtype=torch.long)
    mask = torch.zeros(2, L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, L - len(r):], mask[i, L - len(r):] = r, 1
    use_sparse_decoding(model, **FULL)
    batch = _generate(model, ids, mask)
    for i, r in enumerate(rows):
        alone = _generate(model, r[None])
        assert torch.equal(batch.sequences[i, L:], alone.sequences[0, len(r):])
        _close([x[i] for x in batch.logits], [x[0] for x in alone.logits])


def test_tracer_records_the_embedding_gather(model):
    ids = _ids(6)
    with torch.no_grad(), trace() as t:
        model(ids)
    table = model.get_input_embeddings()
    path = next(name for name, m in model.named_modules() if m is table)
    first = t.of(op="embedding")[0]
    assert first.module == path and first.index_shape == tuple(ids.shape)
    assert first.input_shape == tuple(table.weight.shape)


# -- the pieces: the ring against transformers' sliding layer; the layer ranks; the one error ---------
@pytest.mark.parametrize("chunks", [[20, 1, 1, 1, 1, 1, 1, 1, 1, 1], [3, 1, 1, 9, 1, 1, 1, 12, 1], [1] * 12],
                         ids=["prefill-then-decode", "chunked-prefills", "token-by-token"])
def test_window_ring_matches_transformers_sliding_layer(chunks):
    """The ring returns what DynamicSlidingWindowLayer returns, in position order for a prefill and
    in slot order (rotated by `shift`) for a decode step, with the same mask sizes."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    ring, ref = WindowLayer(W), DynamicSlidingWindowLayer(sliding_window=W)
    g = torch.Generator().manual_seed(0)
    for T in chunks:
        assert ring.get_mask_sizes(T) == ref.get_mask_sizes(T)
        k, v = torch.randn(2, 3, T, 5, generator=g), torch.randn(2, 3, T, 4, generator=g)  # Dv != Dk
        kv = ring.append(k, v)
        rk, rv = ref.update(k, v)
        order = torch.arange(kv.length).roll(kv.shift)  # slot s holds position column (s - shift) % n
        assert torch.equal(rk[:, :, order], kv.keys) and torch.equal(rv[:, :, order], kv.values)
        assert ring.get_seq_length() == ref.get_seq_length() and ring.keys.shape[2] <= W


def test_dense_layers_count_global_layers():
    m = build(ARCHS[[a.name for a in ARCHS].index("gemma3")])  # sliding, sliding, full, sliding
    attn = [x for x in m.modules() if type(x).__name__.endswith("Attention")]
    assert [global_rank(a) for a in attn] == [0, 0, 0, 1]
    seen = {}
    for dense_layers in (0, 1):
        use_sparse_decoding(m, budget=8, page_size=4, dense_layers=dense_layers, recent=0, dense_share=1.0)
        with observe_sparse(lambda call: seen.setdefault(dense_layers, []).append(call.layer)):
            _generate(m, _ids(), n=3)
        use_dense_decoding(m)
    assert seen == {0: [2, 2]}  # layer 2 is global layer 0: sparse with dense_layers=0, dense with 1


def test_unsupported_features_raise_one_error_naming_them():
    config = transformers.LlamaConfig(**BASE)
    config.layer_types = ["full_attention", "linear_attention", "full_attention"]
    with pytest.raises(GatherValueError, match="layer type 'linear_attention'.*not supported by sparse decoding"):
        SparseKVCache(config=config)
    m = build(ARCHS[0])
    attn = m.model.layers[0].self_attn
    q = k = v = torch.randn(1, 4, 3, 8)
    with pytest.raises(GatherValueError, match="position bias.*not supported by gatherlens_topk"):
        topk_attention_forward(attn, q, k, v, None, position_bias=torch.zeros(1, 4, 3, 3))
