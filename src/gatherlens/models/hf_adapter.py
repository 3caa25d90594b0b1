"""Where gatherlens meets transformers: the one module that touches its internals.

    >>> model = unwrap(lm)                                  # a LoadedModel -> its PreTrainedModel
    >>> attn_implementation(model)                          # 'sdpa'
    >>> register_attention("gatherlens_topk", topk_attention_forward)    # with SDPA's mask function
    >>> default_cache(model, lambda m: SparseKVCache(config=m.config))  # generate's cache when none is given
    >>> replace_forward(model, step_forward)                # this model only; restore_forward(model) undoes it

Written against transformers 5.x. Public extension points where they exist: `AttentionInterface`
and `AttentionMaskInterface` (registration, and SDPA's functions looked up by name),
`set_attn_implementation`, `Cache` subclasses, `get_output_embeddings`. Where none exists, a
function here touches an internal, and its comment says which ("relies on:"). No other module
does: tests/test_architecture.py (`test_transformers_internals_only_in_the_adapter`) scans the
package for private attributes, transformers submodule imports, per-instance `forward`s,
class-name checks and kwargs hand-overs, and tests/test_hf_adapter.py lists those made here.
So a new transformers release is checked against this file alone.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import types

from gatherlens.errors import GatherTypeError

__all__ = [
    "CAUSAL_LM_SUFFIXES", "unwrap", "attn_implementation", "set_attn_implementation", "preset_attn_implementation",
    "register_attention", "sdpa_attention", "grouped_sdpa", "attention_function", "layer_types", "default_cache",
    "restore_default_cache",
    "replace_forward", "restore_forward", "forward_replaced", "decoder_layers", "class_named", "is_causal_lm",
    "quiet_gguf_progress", "hand_over", "handed_over", "causal_lm_output", "gguf_tokenizer_from_metadata",
    "rotary_module", "moe_routers", "embedding_scale", "layer_type_names", "rotary_angles", "tokenizer_over",
    "rope_inverse_frequencies",
]

CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # class (architecture) names of causal LMs


# -- the model and its attention ------------------------------------------------------------------
def unwrap(model):
    """The transformers PreTrainedModel of `model` (a LoadedModel's `.model`), or GatherTypeError."""
    model = model if hasattr(model, "set_attn_implementation") else getattr(model, "model", model)
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise GatherTypeError(
            f"model must be a transformers PreTrainedModel (or a LoadedModel), got {type(model).__name__}")
    return model


def attn_implementation(model) -> str | None:
    """The attention implementation a model (or config) runs with: 'sdpa', 'eager', 'gatherlens_topk', ...

    relies on: `PretrainedConfig._attn_implementation` (transformers 5.x has no public getter).
    """
    config = getattr(model, "config", model)
    return config._attn_implementation


def set_attn_implementation(model, name: str) -> None:
    """Switch a built model's attention implementation (public: `PreTrainedModel.set_attn_implementation`)."""
    model.set_attn_implementation(name)


def preset_attn_implementation(config, name: str) -> None:
    """Set the attention implementation of a config before a model is built from it.

    relies on: the `PretrainedConfig._attn_implementation` setter, which the model's __init__ reads
    (there is no public way to change it on an existing config).
    """
    config._attn_implementation = name


def register_attention(name: str, forward) -> None:
    """Register an attention function under `name`, with SDPA's mask function (idempotent; public:
    `AttentionInterface.register`, `AttentionMaskInterface.register`)."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, AttentionMaskInterface()["sdpa"])


def sdpa_attention():
    """transformers' SDPA attention function (public: the "sdpa" entry of `AttentionInterface`)."""
    from transformers import AttentionInterface

    return AttentionInterface()["sdpa"]


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs):
    """transformers' SDPA attention, with a masked grouped-query call on the CPU run by SDPA's enable_gqa
    instead of `repeat_kv` (two (B, Hq, L, D) copies of the keys and values: 38 MB a layer at 8K on
    SmolLM2, the peak of a long chunked prefill). Same output (B, Q, Hq, Dv), None.

    relies on: `module.num_key_value_groups` (transformers' attention modules' GQA factor), as SDPA's does.
    """
    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or not query.is_cpu or query.shape[2] == 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions")):
        return sdpa_attention()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)                                                       # (B, Hq, Q, Dv)
    return out.transpose(1, 2).contiguous(), None                              # (B, Q, Hq, Dv)


def attention_function(name: str):
    """The attention function registered as `name` ("sdpa", "gatherlens_topk", ...) (public:
    `AttentionInterface()[name]`; "eager" is each model module's own, not registered there)."""
    from transformers import AttentionInterface

    return AttentionInterface()[name]


def layer_types(config) -> tuple[list, list]:
    """(layer type names, per-layer cache kwargs) of a config's decoder layers, as transformers' caches see them.

    relies on: `transformers.cache_utils.get_layer_types_and_kwargs` (not a top-level export).
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    return get_layer_types_and_kwargs(config)


def layer_type_names(config) -> list[str]:
    """The layer type name of each decoder layer ("full_attention", "sliding_attention", ...): `layer_types`'."""
    return list(layer_types(config.get_text_config(decoder=True))[0])


def rotary_angles(rotary, layer_type: str):
    """positions (B, T) -> (cos, sin) (B, T, D) float32 of a model's rotary module, for the layers of
    `layer_type` (Gemma 3's module makes each layer type's angles from its own base).

    relies on: the rotary module's forward `(x, position_ids)` (x read for its dtype and device only),
    or `(x, position_ids, layer_type)` where the module keeps angles per layer type.
    """
    import torch

    typed = "layer_type" in inspect.signature(rotary.forward).parameters
    probe = torch.empty(0)  # float32 on the CPU: the dtype and device of the angles

    def angles(positions):
        return rotary(probe, positions, layer_type) if typed else rotary(probe, positions)  # (B, T, D) x2

    return angles


# -- generate's default cache ---------------------------------------------------------------------
def default_cache(model, factory) -> None:
    """Make `model.generate` build `factory(model)` when the caller passes no cache (and asks for the
    default dynamic one); `restore_default_cache` undoes it.

    relies on: `GenerationMixin._prepare_cache_for_generation(generation_config, model_kwargs, ...)`
    writing the cache to `model_kwargs["cache"]` (no public hook picks generate's default cache),
    replaced on the instance only.
    """
    if not hasattr(model, "_prepare_cache_for_generation"):
        return
    original = getattr(type(model), "_prepare_cache_for_generation")

    def prepare(self, generation_config, model_kwargs, *args, **kwargs):
        wants_default = (model_kwargs.get("cache") is None and generation_config.use_cache is not False
                         and generation_config.cache_implementation in (None, "dynamic"))
        if not wants_default:
            return original(self, generation_config, model_kwargs, *args, **kwargs)
        model_kwargs["cache"] = factory(self)

    setattr(model, "_prepare_cache_for_generation", types.MethodType(prepare, model))


def restore_default_cache(model) -> None:
    """generate's own default cache back: undoes `default_cache` (nothing if it was not set).

    relies on: `_prepare_cache_for_generation` replaced on the instance only (see default_cache).
    """
    model.__dict__.pop("_prepare_cache_for_generation", None)


# -- per-instance forwards ------------------------------------------------------------------------
def replace_forward(module, forward) -> None:
    """Run `forward(module, ...)` instead of the module's class forward, for this instance only; the
    replacement shows the class forward's signature.

    relies on: `nn.Module.__call__` (and transformers' GradientCheckpointingLayer) calling
    `self.forward`, looked up on the instance first; and `generate` reading `inspect.signature(
    self.forward)` (it passes `position_ids`, made from the attention mask, only to a forward whose
    signature names them: a left-padded batch needs them).
    """
    def replaced(*args, **kwargs):
        return forward(module, *args, **kwargs)

    replaced.__signature__ = inspect.signature(types.MethodType(type(module).forward, module))
    replaced.__doc__ = forward.__doc__
    module.forward = replaced


def restore_forward(module) -> None:
    """The module's class forward back: undoes `replace_forward` (nothing if it was not replaced).

    relies on: the instance attribute `forward` hiding the class's (see replace_forward).
    """
    module.__dict__.pop("forward", None)


def causal_lm_output(logits, cache):
    """What a causal LM's forward returns: its logits (B, Q, V) and the cache it filled.

    relies on: `transformers.modeling_outputs.CausalLMOutputWithPast` (the output class every causal
    LM returns, not exported at the top level) with its 5.x field name `cache`; generate reads both.
    """
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast(logits=logits, cache=cache)


def forward_replaced(module) -> bool:
    """True while `replace_forward` is in effect on this module (relies on: as restore_forward)."""
    return "forward" in module.__dict__


def decoder_layers(model) -> list:
    """The decoder layers of a causal LM (or of its base model), in order; [] for another layout.

    relies on: transformers' layout convention `model.model.layers` (no public accessor).
    """
    inner = getattr(model, "model", model)
    return list(getattr(inner, "layers", []))


# -- classes known by name ------------------------------------------------------------------------
def class_named(obj, names: tuple[str, ...] = (), *, prefix: tuple[str, ...] = (),
                suffix: tuple[str, ...] = ()) -> bool:
    """True when `type(obj)` is one of `names`, or its name starts with a `prefix` / ends with a `suffix`.

        >>> class_named(layer, ("LlamaDecoderLayer",)), class_named(norm, suffix=("RMSNorm",))

    relies on: transformers' class names (exact classes, not subclasses: a subclass may change the
    forward; and some, as HF's SiLUActivation or the decoder layers, are not top-level exports).
    """
    name = type(obj).__name__
    return name in names or (bool(prefix) and name.startswith(prefix)) or (bool(suffix) and name.endswith(suffix))


def is_causal_lm(model) -> bool:
    """True for a causal language model class (`...ForCausalLM`, `...LMHeadModel`)."""
    return class_named(model, suffix=CAUSAL_LM_SUFFIXES)


@contextlib.contextmanager
def quiet_gguf_progress():
    """No progress bar of transformers' GGUF dequantizer inside the block (ours says what happens).

    relies on: the module attribute `transformers.modeling_gguf_pytorch_utils.tqdm`, which it
    replaces for the block (the dequantizer takes no option for its bar).
    """
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar


def rope_inverse_frequencies(config):
    """The inverse frequencies (head_dim / 2,) float32 transformers' rotary embedding uses for `config`
    (its rope type's scaling applied: llama3, linear, yarn, ...).

    relies on: `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS` (type name -> init function).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        import torch

        theta = config.rope_parameters["rope_theta"]
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # (D/2,)
    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq  # (D/2,)


def tokenizer_over(backend, **kwargs):
    """A `PreTrainedTokenizerFast(**kwargs)` over the `tokenizers.Tokenizer` `backend` itself, not a copy
    (its `tokenizer_object=` deep-copies the backend: seconds for a 262K-token vocabulary and its merges).

    relies on: `TokenizersBackend.__init__` (transformers 5.x) taking a `_tokenizer` already set on the
    instance when no tokenizer_object, file or vocab is given (how its model-specific subclasses work).
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.__new__(PreTrainedTokenizerFast)
    tokenizer._tokenizer = backend
    tokenizer.__init__(**kwargs)
    return tokenizer


# -- a cache layer's step, handed to the attention function ---------------------------------------
_handed = threading.local()


def gguf_tokenizer_from_metadata(path, metadata: dict, tensor_names: tuple[str, ...]):
    """transformers' `AutoTokenizer.from_pretrained(folder, gguf_file=)` for a tokenizer gatherlens does
    not build itself (sentencepiece: Gemma, Llama 2, Phi-3), from metadata already read, so a large
    header (Gemma 3: 262,144 tokens) is parsed once per load, not three times.

    metadata: every key as transformers' reader gives it (a string array other than tokens and merges
    as its count). relies on: `transformers.integrations.gguf.read_gguf_metadata(path, string_arrays)`
    -> (metadata, tensor names), looked up in that package (the config) and in its `reader` module (the
    tokenizer) at call time; both are replaced for the call.
    """
    from pathlib import Path

    import transformers.integrations.gguf as hf_gguf
    import transformers.integrations.gguf.reader as hf_reader
    from transformers import AutoTokenizer

    path = Path(path)
    given = lambda gguf_path, string_arrays=(): (metadata, tensor_names)  # noqa: E731 - the reader's signature
    saved = hf_gguf.read_gguf_metadata, hf_reader.read_gguf_metadata
    hf_gguf.read_gguf_metadata = hf_reader.read_gguf_metadata = given
    try:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    finally:
        hf_gguf.read_gguf_metadata, hf_reader.read_gguf_metadata = saved


def hand_over(obj, keys) -> None:
    """Give the attention call that follows (this thread) `obj`, what a cache layer's `update` made
    for the keys (B, Hkv, L, D) it returns; `handed_over(key)` takes it.

    Relies on nothing internal: only on `Cache.update` running right before that layer's attention
    call (public: the keys it returns are the ones attention gets). One slot per thread, held
    until taken or until the next hand-over.
    """
    _handed.step = (obj, keys)


def handed_over(key):
    """What `hand_over` gave for exactly these keys (same storage, same shape), else None; taken once."""
    step = getattr(_handed, "step", None)
    if step is None:
        return None
    _handed.step = None
    obj, keys = step
    same = keys is key or (keys.shape == key.shape and keys.data_ptr() == key.data_ptr())
    return obj if same else None


# -- gathers a model runs itself (the explorer draws them: report/model_gathers.py) ------------------
def rotary_module(model):
    """The module that makes RoPE's (cos, sin) from position_ids, or None (no RoPE).

    relies on: transformers' decoders keeping one `rotary_emb` module, called as
    `rotary_emb(x, position_ids[, layer_type]) -> (cos, sin)`, each (B, S, D) (Gemma 3 passes its layer type).
    """
    return next((m for n, m in unwrap(model).named_modules() if n.rsplit(".", 1)[-1] == "rotary_emb"), None)


def moe_routers(model) -> list:
    """[(layer index, router module)] of a mixture-of-experts model, in layer order ([] for a dense one).

    relies on: transformers' MoE blocks (Mixtral, Qwen2/3-MoE, ...; and models/gguf/moe.py's ExpertRouter)
    holding their router as child `gate` beside `experts`, called as `gate(x) -> (logits (T, E), weights
    (T, k), index (T, k))`, inside decoder layer `layers.<i>`.
    """
    out = []
    for name, m in unwrap(model).named_modules():
        gate = getattr(m, "gate", None)
        if hasattr(m, "experts") and gate is not None and hasattr(gate, "top_k"):
            parts = name.split(".")
            layer = next((int(b) for a, b in zip(parts, parts[1:]) if a == "layers" and b.isdigit()), len(out))
            out.append((layer, gate))
    return out


def embedding_scale(module) -> float | None:
    """The factor a model multiplies its gathered embedding rows by (Gemma: sqrt(d)), or None.

    relies on: Gemma's `ScaledWordEmbedding` keeping it as the buffer or float `embed_scale`.
    """
    scale = getattr(module, "embed_scale", None)
    if scale is None:
        return None
    return float(scale)
