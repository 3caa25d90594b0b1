"""Tiny random Hugging Face models of each GGUF architecture, written to GGUF as llama.cpp's convert writes them.

    >>> model = tiny_model("qwen2")                            # 2 layers, hidden 64, GQA, random weights
    >>> path = write_gguf(model, "qwen2", "Q4_0", tmp / "qwen2.Q4_0.gguf")

One `Tiny` row per architecture (its config and model classes, gguf's architecture name, the config
it is made with); each concern is one function, driven by tables: `METADATA` (the keys llama.cpp's
`convert_hf_to_gguf.py` writes, per architecture), `tokenizer` (a byte-level BPE of 256 byte tokens,
`MERGES` merges and 3 control tokens, what models/gguf/tokenizer.py reads), `tensors` (HF names ->
gguf's by `gguf.get_tensor_name_map`, llama's q/k rows permuted as convert's `permute` does, Gemma's
norms + 1, 2-D weights in the asked type by `gguf.quants.quantize`, vectors F32). A MoE row adds its
expert tensors with `EXPERT_TENSORS` (engineer D2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gatherlens.bench.model_files import convert_values, write_metadata

VOCAB = 256 + 61 + 3  # bytes, merges, control tokens
BOS, EOS, PAD = VOCAB - 3, VOCAB - 2, VOCAB - 1
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=BOS,
              eos_token_id=EOS, pad_token_id=PAD)


@dataclass(frozen=True)
class Tiny:
    """One architecture: its transformers classes, gguf's architecture name, the config it is made with."""

    name: str
    gguf_arch: str
    config: str
    model: str
    kw: dict = field(default_factory=dict)
    general_name: str = "tiny"


TINY = {t.name: t for t in (
    Tiny("llama", "llama", "LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    Tiny("mistral", "llama", "MistralConfig", "MistralForCausalLM", dict(tie_word_embeddings=False),
         general_name="mistral"),  # transformers reads a "llama" file named "mistral" as Mistral
    Tiny("qwen2", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    Tiny("qwen3", "qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=128, tie_word_embeddings=False)),
    Tiny("phi3", "phi3", "Phi3Config", "Phi3ForCausalLM", dict(tie_word_embeddings=False)),
    Tiny("gemma2", "gemma2", "Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=8)),
    Tiny("gemma3", "gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
         dict(head_dim=16, sliding_window=8, tie_word_embeddings=True)),
)}
# mixture of experts (engineer D2; tests/test_quantized_moe.py): 4 experts of 32, top 2; qwen2moe with a
# shared expert of 64. transformers 5.24 reads neither expert_feed_forward_length nor
# expert_shared_feed_forward_length from a GGUF: its reference load of these files needs `config=`.
MOE_TINY = {t.name: t for t in (
    Tiny("qwen3moe", "qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
              tie_word_embeddings=False)),
    Tiny("qwen2moe", "qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
              tie_word_embeddings=False)),
)}
# head_dim 128 for qwen3: transformers' GGUF config mapping does not read qwen3's attention.key_length,
# so its reference model has Qwen3Config's default head size; Gemma's it reads (key_length).


def tiny_model(name: str, seed: int = 0, **kw):
    """The architecture's tiny random HF model (float32, eval): weights of unit-scale products, random norms."""
    import transformers

    tiny = {**TINY, **MOE_TINY}[name]
    config = getattr(transformers, tiny.config)(**{**COMMON, **tiny.kw, **kw})
    torch.manual_seed(seed)
    model = getattr(transformers, tiny.model)(config).eval()
    gemma = name.startswith("gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:  # norms about 1 (Gemma's weight w scales by 1 + w), biases about 0
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in pname and not gemma else 0.0))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model


# -- metadata --------------------------------------------------------------------------------------
def metadata(writer, tiny: Tiny, config, general_name: str | None = None) -> None:
    """The architecture's keys (bench/model_files.py's `METADATA`: what llama.cpp's convert writes)."""
    writer.add_name(general_name or tiny.general_name)
    write_metadata(writer, tiny.gguf_arch, config)


# -- tokenizer -------------------------------------------------------------------------------------
def _byte_spelling() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (a byte-level BPE's vocabulary is written in it)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    spelled, extra = {}, 0
    for b in range(256):
        if b in keep:
            spelled[b] = chr(b)
        else:
            spelled[b], extra = chr(256 + extra), extra + 1
    return [spelled[b] for b in range(256)]


def byte_tokens() -> list[str]:
    """The 256 byte tokens of the tiny byte-level BPE, in byte order (for tests writing their own vocabulary)."""
    return _byte_spelling()


MERGES = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "a t", "e n", "Ġ o", "Ġ w", "o r",
          "e d", "i s", "Ġ c", "a n", "Ġ b", "i t", "Ġ f", "Ġ p", "e s", "a r", "Ġ m", "l e", "Ġ d", "o u",
          "a l", "Ġ h", "in g", "Ġo f", "Ġa n", "Ġ in", "Ġan d", "Ġt o", "Ġ l", "i c", "Ġ n", "Ġ e", "s t",
          "Ġ g", "o m", "i on", "Ġ re", "l y", "Ġ y", "a s", "Ġ I", "Ġ T", "Ġ is", "Ġ it", "c h", "b e",
          "v e", "Ġc at", "Ġ on", "u t", "Ġ he", "r o", "Ġ S"]


def tokenizer(writer) -> None:
    """A byte-level BPE: the 256 bytes, one token per merge, then <s>, </s>, <pad> (CONTROL)."""
    tokens = _byte_spelling() + [m.replace(" ", "") for m in MERGES] + ["<s>", "</s>", "<pad>"]
    assert len(tokens) == VOCAB and len(set(tokens)) == VOCAB
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(MERGES)
    writer.add_token_types([1] * (VOCAB - 3) + [3] * 3)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_pad_token_id(PAD)


# -- tensors ---------------------------------------------------------------------------------------
def _write(writer, name: str, values: np.ndarray, qtype: str, vectors: str = "F32") -> None:
    """2-D weights in `qtype` (gguf.quants.quantize), every vector (norms, biases) F32, as convert keeps them
    (`vectors`: another plain float type for them, F16 or BF16)."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    if values.ndim == 1 and vectors != "F32":
        vector = gguf.GGMLQuantizationType[vectors]
        writer.add_tensor(name, gguf.quants.quantize(values.astype(np.float32), vector), raw_dtype=vector)
    elif values.ndim == 1 or qtype == "F32" or name.endswith(KEPT_F32):
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype in ("F16",):
        writer.add_tensor(name, values.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values.astype(np.float32), kind), raw_dtype=kind)


# -- mixture of experts (engineer D2) ------------------------------------------------------------------
KEPT_F32 = (".ffn_gate_inp.weight",)  # the router: convert and llama-quantize keep it F32 in every preset


def _stacked_experts(model, config) -> dict:
    """HF's experts (gate_up_proj (X, 2 FX, E): gate rows first; down_proj (X, E, FX)) as gguf stacks
    them: ffn_gate_exps, ffn_up_exps (X, FX, E) and ffn_down_exps (X, E, FX) per block."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        gate_up = layer.mlp.experts.gate_up_proj.detach().float().numpy()  # (X, 2 FX, E)
        half = gate_up.shape[1] // 2
        out[f"blk.{i}.ffn_gate_exps.weight"], out[f"blk.{i}.ffn_up_exps.weight"] = gate_up[:, :half], gate_up[:, half:]
        out[f"blk.{i}.ffn_down_exps.weight"] = layer.mlp.experts.down_proj.detach().float().numpy()  # (X, E, FX)
    return out


EXPERT_TENSORS: dict = {"qwen3moe": _stacked_experts, "qwen2moe": _stacked_experts}  # gguf architecture ->
# f(model, config) -> {gguf name: values} (MoE experts: transformers' fused 3-D parameters gguf splits)


def tensors(writer, model, tiny: Tiny, qtype: str, vectors: str = "F32") -> None:
    """Every HF tensor under gguf's name for it (`get_tensor_name_map`); the head only when untied."""
    import gguf

    config = model.config
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == tiny.gguf_arch)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    extra = EXPERT_TENSORS.get(tiny.gguf_arch, lambda m, c: {})(model, config)
    for hf, value in model.state_dict().items():
        stem, _, leaf = hf.rpartition(".")
        target = names.get_name(stem)
        if target is None or (hf == "lm_head.weight" and config.tie_word_embeddings):
            continue
        name = f"{target}.{leaf}"
        _write(writer, name, convert_values(name, value.float().numpy(), tiny.gguf_arch, config), qtype, vectors)
    for name, values in extra.items():
        _write(writer, name, values, qtype)


def write_gguf(model, name: str, qtype: str, path: Path, general_name: str | None = None,
               vectors: str = "F32") -> Path:
    """Write `model` (tiny_model(name)) to a GGUF at `path`, its matrices in `qtype` (F32, F16, Q8_0, Q4_0, ...);
    general_name: another `general.name` than the row's; vectors: the type of its norms and biases."""
    import gguf

    tiny = {**TINY, **MOE_TINY}[name]
    writer = gguf.GGUFWriter(str(path), tiny.gguf_arch)
    metadata(writer, tiny, model.config, general_name)
    tokenizer(writer)
    tensors(writer, model, tiny, qtype, vectors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
