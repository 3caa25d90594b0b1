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
