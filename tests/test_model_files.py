"""bench/model_files.py and model_vocab.py: the real configs, the tokenizers of real vocabulary sizes, and a
written file that our checks and transformers read as the model it claims to be."""
from __future__ import annotations

import numpy as np
import pytest

from gatherlens.bench.model_files import REAL_MODELS, hf_config, model_vocab, rope_factors, write_model
from gatherlens.bench.model_vocab import GEMMA_SPECIALS, LLAMA3_SPECIALS, QWEN_SPECIALS, bpe_vocab, spm_vocab

PUBLISHED = {  # (hidden, FFN, layers, heads, KV heads, head size, vocabulary): the published config.json values
    "gemma3-270m": (640, 2048, 18, 4, 1, 256, 262144), "gemma3-1b": (1152, 6912, 26, 4, 1, 256, 262144),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936), "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 128, 151936),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936), "llama3.2-1b": (2048, 8192, 16, 32, 8, 64, 128256),
}


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_configs_are_the_published_ones(name):
    c = hf_config(REAL_MODELS[name])
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            head, c.vocab_size) == PUBLISHED[name]
    assert c.tie_word_embeddings


def test_llama3_rope_factors_are_the_scaling_of_the_low_frequencies():
    factors = rope_factors(hf_config(REAL_MODELS["llama3.2-1b"]))
    assert factors.shape == (32,) and np.allclose(factors[:10], 1) and np.allclose(factors[-10:], 32)
    assert rope_factors(hf_config(REAL_MODELS["qwen3-0.6b"])) is None


def _well_formed_bpe(v, size):
    assert len(v.tokens) == len(v.types) == size and len(set(v.tokens)) == size
    inside = set(v.tokens)
    assert all(len(m.split(" ")) == 2 and "".join(m.split(" ")) in inside and all(p in inside for p in m.split(" "))
               for m in v.merges)


def test_bpe_vocabularies_have_the_real_layouts():
    v = bpe_vocab(4096, 4096 - len(QWEN_SPECIALS), QWEN_SPECIALS, "qwen2", base=False)
    _well_formed_bpe(v, 4096)
    assert v.tokens[v.bos] == "<|endoftext|>" and v.types[-1] == 3 and len(v.merges) == 4096 - 22 - 256
    v = bpe_vocab(5000, 4000, LLAMA3_SPECIALS, "llama-bpe", add_bos=True, base=False)
    _well_formed_bpe(v, 5000)
    assert v.tokens[4000] == "<|begin_of_text|>" and v.tokens[-1] == "[PAD4999]" and v.types[-1] == 5


def test_spm_vocabulary_has_byte_tokens_scores_and_no_nul():
    v = spm_vocab(4096, GEMMA_SPECIALS, base=False)
    assert len(v.tokens) == len(v.scores) == 4096 and len(set(v.tokens)) == 4096
    assert v.tokens[:3] == ["<pad>", "<eos>", "<bos>"] and v.tokens[7] == "<0x00>" and v.types[7] == 6
    assert not any("\x00" in t for t in v.tokens)  # llama.cpp reads tokens as C strings
    assert all(a >= b for a, b in zip(v.scores[263:], v.scores[264:]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "llama3.2-1b", "gemma3-270m"])
def test_real_size_vocabularies(name):
    spec = REAL_MODELS[name]
    v = model_vocab(spec, spec.config["vocab_size"])
    assert len(v.tokens) == spec.config["vocab_size"] and len(set(v.tokens)) == len(v.tokens)


def test_a_written_file_passes_our_checks_and_reads_as_its_config(tmp_path):
    from gatherlens.models.gguf.check import check_gguf
    from gatherlens.models.gguf.config import gguf_config, open_gguf

    spec = REAL_MODELS["qwen3-0.6b"]
    config = hf_config(spec, num_hidden_layers=2, hidden_size=128, intermediate_size=256, vocab_size=1024)
    path = write_model(spec, tmp_path / "q.F16.gguf", config=config, vocab=model_vocab(spec, 1024, base=False))
    reader = open_gguf(path)
    check_gguf(reader, path, quantized=True)
    ours = gguf_config(reader)
    assert (ours.num_key_value_heads, ours.head_dim, ours.vocab_size, ours.tie_word_embeddings) == (8, 128, 1024, True)


def test_llama3_rope_factors_become_the_configs_scaling(tmp_path):
    """A Llama 3.2 file's rope_freqs.weight is read back as llama3 scaling (models/gguf/rope.py): the config,
    and so the rotary module of the float and the quantized model, as transformers' llama3 frequencies."""
    import warnings

    import torch

    from gatherlens.models import load
    from gatherlens.models.gguf.config import gguf_config, open_gguf
    from gatherlens.models.hf_adapter import rope_inverse_frequencies

    spec = REAL_MODELS["llama3.2-1b"]
    config = hf_config(spec, num_hidden_layers=1, hidden_size=256, intermediate_size=256, vocab_size=1024,
                       num_attention_heads=4, num_key_value_heads=2)
    path = write_model(spec, tmp_path / "l.Q8_0.gguf", config=config, dtype="Q8_0",
                       vocab=model_vocab(spec, 1024, base=False))
    rope = gguf_config(open_gguf(path)).rope_parameters
    assert {k: rope[k] for k in ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings")} == {
        k: v for k, v in spec.config["rope_scaling"].items() if k != "rope_theta"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lm = load(path, quantized=True)
    assert torch.allclose(lm.model.model.rotary_emb.inv_freq, rope_inverse_frequencies(config))


def test_a_sentencepiece_gemma_runs_on_the_native_runtime_as_in_transformers(tmp_path):
    """A Gemma 3 file with its sentencepiece ("llama") vocabulary: the native runtime takes it (it refused
    every tokenizer but byte-level BPE before), its ids are transformers' tokenizer's, and its greedy tokens
    are the transformers runtime's."""
    import torch

    from gatherlens.models import load
    from gatherlens.models.runtime.generation import GenerationEnd, generation_steps

    spec = REAL_MODELS["gemma3-270m"]
    config = hf_config(spec, num_hidden_layers=2, hidden_size=128, intermediate_size=256, vocab_size=1024)
    path = write_model(spec, tmp_path / "g.Q8_0.gguf", config=config, dtype="Q8_0",
                       vocab=model_vocab(spec, 1024, base=False))
    native, hf = load(path, quantized=True, runtime="native"), load(path, quantized=True, runtime="transformers")
    assert type(native.model).__name__ == "NativeModel"
    text = "The cat sat on the mat. ünïcödé  two  spaces"
    ids = native.encode(text)  # (1, S)
    assert torch.equal(ids, hf.encode(text))

    def greedy(lm):
        events = list(generation_steps(lm, ids, budget=None, max_new_tokens=6))
        return next(e for e in events if isinstance(e, GenerationEnd)).new_ids

    assert greedy(native) == greedy(hf)
