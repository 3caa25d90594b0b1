"""The shapes people run, tiny: every model of bench/model_files.py's REAL_MODELS with its real head size,
query and KV head counts (head_dim 256 over one KV head: Gemma 3; 128 over 8: Qwen3; 7 and 6 query heads
a KV head: Qwen2.5; Llama 3.2's RoPE factors), a large vocabulary, two layers and a small hidden size,
written with gguf's writer in Q8_0 and run from its blocks against the float model of the same file.

- prefill: the quantized model's logits within BOUND of the float model's (transformers' modules);
- decode: teacher-forced one token a step over a SparseKVCache (the native decode attention on these
  head sizes and groups, Gemma's window ring past its edge): each step's top logits within BOUND of the
  float model's full forward at that position (random weights: near-ties may flip a top-1, so the bound is
  on the logits); a small budget runs and stays finite.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from gatherlens.bench.model_files import REAL_MODELS, hf_config, model_vocab, write_model
from gatherlens.models import load
from gatherlens.models.runtime.decoding import (SparseKVCache, sparse_settings, use_dense_decoding,
                                                use_sparse_decoding)
from gatherlens.models.runtime.generation import last_logits

VOCAB = 12_288  # large next to the hidden size (the head is most of the model, as in Gemma 3)
BOUND = 0.05  # |quantized - float| within 5% of the largest float logit (Q8_0 weights, x rounded to 8 bits)
WINDOW = 16  # Gemma's sliding window, tiny: the decode steps cross it
STEPS, PREFIX = 24, 12


def _small(spec) -> dict:
    c = spec.config
    small = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, vocab_size=VOCAB,
                 max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if spec.gguf_arch == "gemma3":
        small.update(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
    if "head_dim" not in c:  # Qwen2.5: no file key states the head size (hidden / heads): the real hidden
        small["hidden_size"] = c["hidden_size"]
    return small


@pytest.fixture(scope="module", params=sorted(REAL_MODELS))
def pair(request, tmp_path_factory):
    """(spec, quantized LoadedModel, float LoadedModel) of one tiny model of a real shape."""
    spec = REAL_MODELS[request.param]
    config = hf_config(spec, **_small(spec))
    folder = tmp_path_factory.mktemp(request.param)
    vocab = model_vocab(spec, VOCAB, base=False)
    path = write_model(spec, folder / f"{spec.name}.Q8_0.gguf", config=config, dtype="Q8_0", vocab=vocab)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Llama 3's rope_freqs.weight is read as its scaling: nothing to warn of
        return spec, load(path, quantized=True), load(path, use_cache_dir=False)


def _ids(lm, n: int) -> torch.Tensor:
    return torch.randint(300, VOCAB - 400, (1, n), generator=torch.Generator().manual_seed(3))  # (1, n)


def test_shapes_are_the_real_ones(pair):
    spec, lm, _ = pair
    c, real = lm.model.config, spec.config
    head_dim = real.get("head_dim") or real["hidden_size"] // real["num_attention_heads"]
    ours = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert (c.num_attention_heads, c.num_key_value_heads, ours) == (real["num_attention_heads"],
                                                                    real["num_key_value_heads"], head_dim)
    assert c.vocab_size == VOCAB and lm.model.lm_head.out_features == VOCAB


def test_prefill_logits_match_the_float_model(pair):
    _, lm, ref = pair
    ids = _ids(lm, PREFIX + STEPS)
    with torch.inference_mode():
        ours, theirs = lm.model(ids).logits[0], ref.model(ids).logits[0]  # (S, V) each
    assert float((ours - theirs).abs().max()) <= BOUND * float(theirs.abs().max())


def _forced(model, ids: torch.Tensor, budget: int | None) -> torch.Tensor:
    """Teacher-forced decode logits (STEPS, V): the prefix's last, then one token a step."""
    use_sparse_decoding(model, budget=budget or 1 << 20, page_size=4, dense_layers=0)
    s = sparse_settings(model)
    cache = SparseKVCache(config=model.config, page_size=s.page_size, kv_dtype=s.kv_dtype)
    cache.reserve(ids.shape[1])
    with torch.inference_mode():
        rows = [last_logits(model, cache, ids[:, :PREFIX])]
        rows += [last_logits(model, cache, ids[:, i:i + 1]) for i in range(PREFIX, ids.shape[1] - 1)]
    use_dense_decoding(model)
    return torch.stack(rows)  # (STEPS, V)


@pytest.mark.slow
def test_decode_steps_match_the_float_model(pair):
    spec, lm, ref = pair
    ids = _ids(lm, PREFIX + STEPS)
    with torch.inference_mode():
        theirs = ref.model(ids).logits[0, PREFIX - 1:-1]  # (STEPS, V): positions PREFIX-1 .. end-2
    every = _forced(lm.model, ids, None)  # a budget buying every page: dense attention over the pages
    assert float((every - theirs).abs().max()) <= BOUND * float(theirs.abs().max())
    sparse = _forced(lm.model, ids, 8)  # reads 8 tokens a KV head: runs, stays finite
    assert torch.isfinite(sparse).all()
    if spec.gguf_arch == "gemma3":
        assert PREFIX + STEPS > 2 * WINDOW  # the local layer's ring wrapped during the steps
