"""What the native runtime reads of a GGUF's metadata: one plain record, no transformers config class.

    >>> spec = model_spec(reader)                 # reader: open_gguf(path); arch: models/gguf/arch.py's row
    >>> spec.num_attention_heads, spec.head_dim, spec.windows[:6], spec.scaling
    (4, 256, (512, 512, 512, 512, 512, None), 0.0625)
    >>> spec.refusal                              # None: the native runtime runs it; else why not, by name

The fields carry transformers' config names (`hidden_size`, `num_key_value_heads`, `max_position_embeddings`,
...), so what reads a loaded model's config (the generation loop, fit_prompt, LoadedModel) reads this
record alike. The values come from the same keys as models/gguf/config.py's table (`CONFIG_KEYS` and the
architecture's own, `Arch.config_keys`) and llama.cpp's rules for what a file leaves unsaid:
- the head size: the architecture's key for it (rope.dimension_count, attention.key_length), else
  embedding_length / head_count; the rotary dimension: rope.dimension_count, else the head size;
- the logit scale: 1 / sqrt(head size) (llama.cpp's, Gemma 3's query_pre_attn_scalar included);
- local layers: where the file states a sliding window, the architecture's pattern (`Arch.global_every`:
  Gemma 3's every sixth layer is global; no pattern: every layer is local, Phi-3), each with its own rope
  base where the architecture has one (`Arch.local_rope_base`: Gemma 3's 10,000, or the file's
  `rope.freq_base_swa`);
- rope scaling: `rope.scaling.*` (type, factor, original context), and the file's rope_freqs factors
  (read by the builder, models/gguf/native.py).
`refusal` names what the native runtime does not run (experts, soft-capping, a partial rotary
dimension, another tokenizer...) so the loading table (models/loading.py) takes transformers' path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gatherlens.models.gguf.arch import Arch
from gatherlens.models.gguf.config import file_arch, metadata_value
from gatherlens.models.gguf.tokenizer import builds
from gatherlens.ops.layer.rope import SCALINGS, RopeScaling

__all__ = ["ModelSpec", "model_spec"]

_SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")  # metadata Gemma 2 states


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF model's shape and rules, with transformers' config names (see the module doc)."""

    arch: Arch
    name: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_dim: int
    rope_scaling: RopeScaling | None
    local_rope_theta: float | None
    windows: tuple
    scaling: float
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    refusal: str | None = None
    is_decoder: bool = field(default=True, init=False)

    @property
    def model_type(self) -> str:
        return self.arch.name

    @property
    def sliding_window(self) -> int | None:
        return next((w for w in self.windows if w is not None), None)


def _value(reader, key: str, arch: Arch, default=None):
    return metadata_value(reader, key.format(arch=arch.gguf), default)


def model_spec(reader) -> ModelSpec | None:
    """The file's ModelSpec; None for an architecture models/gguf/arch.py has no row for."""
    arch = file_arch(reader)
    if arch is None:
        return None
    heads = _value(reader, "{arch}.attention.head_count", arch)
    hidden = _value(reader, "{arch}.embedding_length", arch)
    key = arch.head_dim_key
    head_dim = (_value(reader, key, arch) if key else None) or hidden // heads
    layers = _value(reader, "{arch}.block_count", arch)
    window = _value(reader, "{arch}.attention.sliding_window", arch)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    base = float(_value(reader, "{arch}.rope.freq_base", arch, 10000.0))
    local_base = _value(reader, "{arch}.rope.freq_base_swa", arch, arch.local_rope_base)
    spec = ModelSpec(
        arch, str(metadata_value(reader, "general.name", "")),
        _value(reader, "{arch}.vocab_size", arch) or (len(tokens.data) if tokens is not None else 0), hidden, layers,
        heads, _value(reader, "{arch}.attention.head_count_kv", arch, heads), head_dim,
        _value(reader, "{arch}.feed_forward_length", arch), float(_value(reader, "{arch}.attention.layer_norm_rms_epsilon",
                                                                          arch, 1e-6)),
        _value(reader, "{arch}.context_length", arch, 2048), base,
        _value(reader, "{arch}.rope.dimension_count", arch, head_dim), _scaling(reader, arch),
        None if local_base is None else float(local_base), _windows(arch, layers, window), head_dim ** -0.5,
        all(t.name != "output.weight" for t in reader.tensors), *(metadata_value(reader, f"tokenizer.ggml.{k}_token_id")
                                                                  for k in ("bos", "eos", "padding")))
    return _with_refusal(spec, reader)


def _windows(arch: Arch, layers: int, window) -> tuple:
    """Each layer's window (None: global): the file's sliding window on the architecture's local layers."""
    if not window:
        return (None,) * layers
    every = arch.global_every
    return tuple(None if every and (i + 1) % every == 0 else int(window) for i in range(layers))


def _scaling(reader, arch: Arch) -> RopeScaling | None:
    kind = _value(reader, "{arch}.rope.scaling.type", arch)
    if kind in (None, "none"):
        return None
    return RopeScaling(str(kind), float(_value(reader, "{arch}.rope.scaling.factor", arch, 1.0)),
                       original_context=int(_value(reader, "{arch}.rope.scaling.original_context_length", arch, 8192)))


def _with_refusal(spec: ModelSpec, reader) -> ModelSpec:
    """spec with `refusal`: what the native runtime does not run, by name (None: it runs the file)."""
    arch, why = spec.arch, None
    if arch.moe:
        why = f"{arch.name}: mixture-of-experts layers"
    elif any(_value(reader, f"{{arch}}.{k}", arch) is not None for k in _SOFTCAPS):
        why = f"{arch.name}: soft-capping (attn_logit_softcapping / final_logit_softcapping; SDPA has none)"
    elif spec.rope_dim != spec.head_dim:
        why = f"a rotary dimension {spec.rope_dim} other than the head size {spec.head_dim} (partial rotary)"
    elif spec.rope_scaling is not None and spec.rope_scaling.type not in SCALINGS:
        why = f"rope scaling {spec.rope_scaling.type!r} (the native runtime runs {', '.join(SCALINGS)})"
    elif builds(reader) is None:
        why = (f"tokenizer model {metadata_value(reader, 'tokenizer.ggml.model')!r} (the native runtime builds "
               f"byte-level BPE tokenizers, 'gpt2' with merges, and sentencepiece ones, 'llama' with scores)")
    return spec if why is None else dataclasses.replace(spec, refusal=why)
