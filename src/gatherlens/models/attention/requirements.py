"""What a model must have for a gatherlens switch: attention layers, and for decoding causal ones.

    >>> require_attention_layers(mamba, "top-k attention")
    GatherValueError: MambaForCausalLM (mamba) has no attention layers, so top-k attention has nothing to ...
    >>> require_causal_attention(bert, "sparse decoding")
    GatherValueError: BertModel (bert) has bidirectional attention (an encoder), so sparse decoding ...

An attention layer is a module with a `config` and an `is_causal` attribute: what every attention
class that runs through transformers' AttentionInterface sets (LlamaAttention, GPT2Attention,
BertSelfAttention, ...); a state-space or recurrent model (Mamba, RWKV) has none, so a switch of
its attention implementation would change nothing.
"""
from __future__ import annotations

from gatherlens.errors import GatherValueError

__all__ = ["attention_layers", "require_attention_layers", "require_causal_attention"]


def attention_layers(model) -> list:
    """The attention modules of `model`, in order (see the module doc)."""
    return [m for m in model.modules() if hasattr(m, "is_causal") and hasattr(m, "config")]


def _named(model) -> str:
    return f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"


def require_attention_layers(model, what: str) -> list:
    """The attention modules of `model`; a GatherValueError naming its class when it has none."""
    layers = attention_layers(model)
    if not layers:
        raise GatherValueError(
            f"{_named(model)} has no attention layers, so {what} has nothing to replace (a state-space or "
            f"recurrent model computes no attention): {what} needs a Transformer whose layers run "
            f"attention through transformers' AttentionInterface (Llama, Qwen2, GPT-2, BERT, ...)")
    return layers


def require_causal_attention(model, what: str) -> list:
    """The attention modules of `model` when they are causal (a decoder); else a GatherValueError
    naming its class: an encoder's bidirectional attention has no next token to decode."""
    layers = require_attention_layers(model, what)
    if not any(m.is_causal for m in layers):
        raise GatherValueError(
            f"{_named(model)} has bidirectional attention (an encoder), so {what} has no next token to "
            f"decode: {what} needs a decoder-only causal LM (Llama, Qwen2, Mistral, GPT-2, ...)")
    return layers
