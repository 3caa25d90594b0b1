"""A tiny random Llama (grouped-query attention) on disk, with MiniLM's tokenizer: a real
Hugging Face folder that `gatherlens.models.load` reads in well under a second."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch


def make_tiny_llama(folder: Path, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    """Write the model and tokenizer into `folder` (skips the test when MiniLM is not installed)."""
    transformers = pytest.importorskip("transformers")
    from installed import installed

    tok = transformers.AutoTokenizer.from_pretrained(installed("minilm"), local_files_only=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, max_position_embeddings=1024)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _minilm_tokenizer():
    """MiniLM's tokenizer (skips the test when it is not installed)."""
    transformers = pytest.importorskip("transformers")
    from gatherlens.models.files.registry import resolve

    try:
        return transformers.AutoTokenizer.from_pretrained(resolve("minilm").path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - the tokenizer package is an optional install
        pytest.skip(f"MiniLM's tokenizer is not installed ({err})")


HYBRID_WINDOW = 8    # the sliding window of make_tiny_hybrid's local layers
HYBRID_TYPES = ("sliding_attention", "full_attention", "sliding_attention")


# a plain chat template (roles and contents, one a line); its turn ends at [SEP], the tokenizer's EOS
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def make_tiny_hybrid(folder: Path, window: int = HYBRID_WINDOW) -> Path:
    """A tiny random Gemma 3 (sliding, global, sliding layers with a `window`-token window; one KV
    head; the embedding scaled by sqrt(d)) with MiniLM's tokenizer and a plain chat template (CHAT_TEMPLATE),
    written into `folder`."""
    transformers = pytest.importorskip("transformers")
    tok = _minilm_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=len(HYBRID_TYPES),
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=window,
        layer_types=list(HYBRID_TYPES), max_position_embeddings=4096, query_pre_attn_scalar=16,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_tiny_moe(folder: Path, kind: str = "mixtral") -> Path:
    """A tiny random mixture-of-experts decoder (Mixtral, or Qwen3-MoE with kind="qwen3_moe"):
    4 experts, 2 per token, with MiniLM's tokenizer, written into `folder`."""
    transformers = pytest.importorskip("transformers")
    tok = _minilm_tokenizer()
    torch.manual_seed(0)
    common = dict(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  num_experts_per_tok=2, pad_token_id=tok.pad_token_id)
    if kind == "mixtral":
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, **common))
    else:
        model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
            num_experts=4, moe_intermediate_size=32, head_dim=8, **common))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
