"""Random-weight GGUF files at the real sizes of the models people download (bench-only).

    >>> spec = REAL_MODELS["gemma3-270m"]
    >>> path = write_model(spec, Path("/work/models/gemma3-270m.F16.gguf"))        # ~0.5 GB, F16
    >>> config = hf_config(spec, num_hidden_layers=2, vocab_size=4096)           # a tiny one for tests

Each `RealModel` is one published config.json, written down with its source: transformers' own config
class is built from those values (`hf_config`), the causal LM is made on the meta device only to name
and shape its tensors, and every tensor is drawn at random (a seeded normal per tensor name: weights of
unit-scale products, norms about 1) and streamed to the file one at a time with gguf's writer, so a
1.5B model is written in the memory of its largest tensor. The file is what llama.cpp's
`convert_hf_to_gguf.py` writes: gguf's tensor names (`get_tensor_name_map`), Llama's q/k rows
permuted for its RoPE, Gemma's norms + 1, 2-D weights F16 (or F32), vectors F32, Llama 3's RoPE
frequency factors as `rope_freqs.weight` (transformers' own llama3 frequencies against the plain ones),
the tied head left out, and a tokenizer of the model's real vocabulary size (bench/model_vocab.py).
`scripts/make_model_files.py` writes the six models and quantizes each with llama.cpp's own quantizer;
tests make tiny models of the same shapes with `hf_config(spec, **small)` + `write_model`.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gatherlens.bench.model_vocab import (
    GEMMA_SPECIALS, LLAMA3_SPECIALS, QWEN_SPECIALS, Vocab, bpe_vocab, spm_vocab,
)

__all__ = ["RealModel", "REAL_MODELS", "hf_config", "write_model", "model_vocab", "gguf_tensors", "rope_factors",
           "METADATA", "write_metadata", "permute_rows", "convert_values"]


@dataclass(frozen=True)
class RealModel:
    """One model as published: its transformers classes, gguf's architecture, its config.json values."""

    name: str
    source: str  # where the values were read
    gguf_arch: str
    config_class: str
    model_class: str
    config: dict
    vocab: str  # "qwen", "llama3" or "gemma": the tokenizer's layout (model_vocab)
    extra: dict = field(default_factory=dict)


_GEMMA3 = dict(head_dim=256, num_attention_heads=4, num_key_value_heads=1, sliding_window=512, vocab_size=262144,
               rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, max_position_embeddings=32768,
               query_pre_attn_scalar=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
               hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0)
_QWEN25 = dict(num_key_value_heads=2, vocab_size=151936, rope_theta=1_000_000.0, max_position_embeddings=32768,
               rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643,
               eos_token_id=151643)

REAL_MODELS = {m.name: m for m in (
    RealModel("gemma3-270m", "huggingface.co/google/gemma-3-270m config.json", "gemma3", "Gemma3TextConfig",
              "Gemma3ForCausalLM", dict(_GEMMA3, hidden_size=640, intermediate_size=2048, num_hidden_layers=18),
              "gemma"),
    RealModel("gemma3-1b", "huggingface.co/google/gemma-3-1b-it config.json", "gemma3", "Gemma3TextConfig",
              "Gemma3ForCausalLM", dict(_GEMMA3, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26),
              "gemma"),
    RealModel("qwen2.5-0.5b", "huggingface.co/Qwen/Qwen2.5-0.5B config.json", "qwen2", "Qwen2Config",
              "Qwen2ForCausalLM", dict(_QWEN25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                       num_attention_heads=14), "qwen"),
    RealModel("qwen2.5-1.5b", "huggingface.co/Qwen/Qwen2.5-1.5B config.json", "qwen2", "Qwen2Config",
              "Qwen2ForCausalLM", dict(_QWEN25, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                       num_attention_heads=12), "qwen"),
    RealModel("qwen3-0.6b", "huggingface.co/Qwen/Qwen3-0.6B config.json", "qwen3", "Qwen3Config",
              "Qwen3ForCausalLM", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                       rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6,
                                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643,
                                       eos_token_id=151645), "qwen"),
    RealModel("llama3.2-1b", "huggingface.co/meta-llama/Llama-3.2-1B config.json", "llama", "LlamaConfig",
              "LlamaForCausalLM", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
                                       rope_theta=500_000.0, max_position_embeddings=131072, rms_norm_eps=1e-5,
                                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=128000,
                                       eos_token_id=128001,
                                       rope_scaling=dict(rope_type="llama3", factor=32.0, high_freq_factor=4.0,
                                                         low_freq_factor=1.0, original_max_position_embeddings=8192)),
              "llama3"),
)}


def hf_config(spec: RealModel, **overrides):
    """The model's transformers config from its published values (`overrides` replace some: tests)."""
    import transformers

    return getattr(transformers, spec.config_class)(**{**spec.config, **overrides})


def model_vocab(spec: RealModel, size: int, base: bool = True) -> Vocab:
    """A tokenizer of `size` tokens in the model's layout (bench/model_vocab.py); `base`: start from
    SmolLM2's merges where installed."""
    if spec.vocab == "gemma":
        return spm_vocab(size, GEMMA_SPECIALS, base=base)
    specials = QWEN_SPECIALS if spec.vocab == "qwen" else LLAMA3_SPECIALS
    regular = size - len(specials) - (size - 151_665 if spec.vocab == "qwen" and size >= 151_665 else 0)
    if spec.vocab == "llama3":
        return bpe_vocab(size, regular, specials, "llama-bpe", add_bos=True, base=base)
    return bpe_vocab(size, regular, specials, "qwen2", base=base)


# -- the tensors ---------------------------------------------------------------------------------
def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert's `permute` of q / k rows for its RoPE (the inverse of transformers' reverse_permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _values(hf_name: str, shape: tuple[int, ...], gemma: bool, seed: int) -> np.ndarray:
    """One tensor at random (the HF values): weights N(0, 1/K), norms 1 + N(0, 0.01) (Gemma's about
    0: it scales by 1 + w), biases N(0, 0.01); seeded by the name, so a tiny and a real file agree."""
    rng = np.random.default_rng([seed, zlib.crc32(hf_name.encode())])
    values = rng.standard_normal(shape, dtype=np.float32)  # shape
    if len(shape) > 1:
        return values / np.float32(np.sqrt(shape[-1]))  # (N, K)
    values *= np.float32(0.1)
    return values + np.float32(1.0) if "norm" in hf_name and not gemma else values  # (d,)


def convert_values(gguf_name: str, values: np.ndarray, gguf_arch: str, config) -> np.ndarray:
    """What convert does to one tensor before writing it (llama: q/k permuted; Gemma: norms + 1; a
    shared expert's gate: HF (1, d) -> gguf (d,))."""
    if gguf_arch == "llama" and gguf_name.endswith((".attn_q.weight", ".attn_k.weight")):
        heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
        return permute_rows(values, heads)
    if gguf_arch.startswith("gemma") and gguf_name.endswith("norm.weight"):
        return values + np.float32(1.0)
    if gguf_name.endswith(".ffn_gate_inp_shexp.weight"):
        return values.reshape(-1)
    return values


def rope_factors(config) -> np.ndarray | None:
    """Llama 3's `rope_freqs.weight` (head_dim / 2,) float32: the plain inverse frequencies over
    transformers' llama3 ones (what convert writes and llama.cpp divides by), or None."""
    from gatherlens.models.hf_adapter import rope_inverse_frequencies

    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "llama3":
        return None
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    plain = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))  # (D/2,)
    return (plain / rope_inverse_frequencies(config).numpy()).astype(np.float32)  # (D/2,)


def gguf_tensors(spec: RealModel, config) -> list[tuple[str, str, tuple[int, ...]]]:
    """(gguf name, HF name, HF shape) of every tensor the file holds, in the HF model's order (made on
    the meta device: names and shapes only); the head only when untied."""
    import gguf
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, spec.model_class)(config)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.gguf_arch)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    out = []
    for hf, tensor in model.state_dict().items():
        stem, _, leaf = hf.rpartition(".")
        target = names.get_name(stem)
        if target is None or (hf == "lm_head.weight" and config.tie_word_embeddings):
            continue
        out.append((f"{target}.{leaf}", hf, tuple(tensor.shape)))
    return out


# -- the file ------------------------------------------------------------------------------------
def _head_dim(c) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _rope_theta(c) -> float:
    rope = c.rope_parameters
    return float((rope.get("full_attention") or rope)["rope_theta"])


# gguf key (after "{arch}.") -> (the architectures convert writes it for (None: all), its value from the HF
# config); tests/tiny_gguf.py writes its tiny files with the same table
METADATA = {
    "context_length": (None, lambda c: c.max_position_embeddings),
    "embedding_length": (None, lambda c: c.hidden_size),
    "block_count": (None, lambda c: c.num_hidden_layers),
    "feed_forward_length": (None, lambda c: c.intermediate_size),
    "attention.head_count": (None, lambda c: c.num_attention_heads),
    "attention.head_count_kv": (None, lambda c: c.num_key_value_heads),
    "attention.layer_norm_rms_epsilon": (None, lambda c: float(c.rms_norm_eps)),
    "rope.freq_base": (None, _rope_theta),
    "vocab_size": (None, lambda c: c.vocab_size),
    "rope.dimension_count": (("llama",), _head_dim),
    "attention.key_length": (("qwen3", "gemma2", "gemma3", "qwen3moe"), _head_dim),
    "attention.value_length": (("qwen3", "gemma2", "gemma3", "qwen3moe"), _head_dim),
    "attention.sliding_window": (("gemma2", "gemma3"), lambda c: c.sliding_window),
    "attn_logit_softcapping": (("gemma2",), lambda c: float(c.attn_logit_softcapping)),
    "final_logit_softcapping": (("gemma2",), lambda c: float(c.final_logit_softcapping)),
    # mixture of experts (engineer D2); transformers 5.24's GGUF config mapping reads the first two only
    "expert_count": (("qwen3moe", "qwen2moe"), lambda c: c.num_experts),
    "expert_used_count": (("qwen3moe", "qwen2moe"), lambda c: c.num_experts_per_tok),
    "expert_feed_forward_length": (("qwen3moe", "qwen2moe"), lambda c: c.moe_intermediate_size),
    "expert_shared_feed_forward_length": (("qwen2moe",), lambda c: c.shared_expert_intermediate_size),
}
FILE_TYPES = {"F32": 0, "F16": 1}  # general.file_type (llama_ftype)


def write_metadata(writer, gguf_arch: str, config) -> None:
    """The architecture's keys of `METADATA`, typed as convert writes them (uint32 counts, float32 values)."""
    for key, (archs, value) in METADATA.items():
        if archs is None or gguf_arch in archs:
            v = value(config)
            (writer.add_float32 if isinstance(v, float) else writer.add_uint32)(f"{gguf_arch}.{key}", v)


def _stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """A tensor as stored: matrices in `dtype` (F16, F32, or a block format gguf.quants quantizes: tests'
    tiny files), vectors F32."""
    import gguf

    if values.ndim == 1 or dtype == "F32":
        return values.astype(np.float32)
    if dtype == "F16":
        return values.astype(np.float16)
    return gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType[dtype])  # (N, row bytes)


def _info(writer, name: str, shape: tuple[int, ...], dtype: str) -> None:
    """The tensor info of one tensor as `_stored` writes it."""
    import gguf

    if len(shape) == 1 or dtype in FILE_TYPES:
        item = np.dtype(np.float16 if len(shape) > 1 and dtype == "F16" else np.float32)
        writer.add_tensor_info(name, shape, item, int(np.prod(shape)) * item.itemsize)
        return
    kind = gguf.GGMLQuantizationType[dtype]
    elems, nbytes = gguf.GGML_QUANT_SIZES[kind]
    byte_shape = (*shape[:-1], shape[-1] // elems * nbytes)
    writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind)


def write_model(spec: RealModel, path: Path, config=None, dtype: str = "F16", vocab: Vocab | None = None,
                seed: int = 0) -> Path:
    """Write a random-weight `spec` model (its published config, or `config`) to `path` as llama.cpp's
    convert would, one tensor in memory at a time; `vocab`: the tokenizer (default `model_vocab` of the
    config's vocabulary size); `dtype`: the matrices' type (F16, F32; tests: Q8_0, Q4_0, ... through
    gguf.quants). Returns `path`."""
    import gguf

    import gguf

    if dtype not in FILE_TYPES and dtype not in gguf.GGMLQuantizationType.__members__:
        raise ValueError(f"dtype must be one of {tuple(FILE_TYPES)} or a gguf block format, got {dtype!r}")
    config = config or hf_config(spec)
    vocab = vocab or model_vocab(spec, config.vocab_size)
    plan = gguf_tensors(spec, config)
    factors = rope_factors(config)
    gemma = spec.gguf_arch.startswith("gemma")
    writer = gguf.GGUFWriter(str(path), spec.gguf_arch)
    writer.add_name(spec.name)
    if dtype in FILE_TYPES:
        writer.add_file_type(FILE_TYPES[dtype])
    write_metadata(writer, spec.gguf_arch, config)
    vocab.write(writer)
    if factors is not None:
        writer.add_tensor_info("rope_freqs.weight", factors.shape, np.dtype(np.float32), factors.nbytes)
    for name, _, shape in plan:
        _info(writer, name, shape, dtype)
    writer.write_header_to_file(path=Path(path))
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    if factors is not None:
        writer.write_tensor_data(factors)
    for name, hf, shape in plan:
        values = convert_values(name, _values(hf, shape, gemma, seed), spec.gguf_arch, config)  # shape
        writer.write_tensor_data(_stored(values, dtype))
    writer.close()
    return Path(path)
