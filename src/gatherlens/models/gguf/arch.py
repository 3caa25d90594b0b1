"""The one table of GGUF architectures: what each tensor of a file is, and where it goes in transformers.

    >>> arch = lookup("qwen2")                      # general.architecture ("llama" + name "mistral": mistral)
    >>> arch.model_class, arch.row("blk.{i}.attn_q").hf, arch.row("blk.{i}.attn_q").bias
    ('Qwen2ForCausalLM', 'model.layers.{i}.self_attn.q_proj', True)
    >>> [r.gguf for r in ARCHS["llama"].rows if r.permute]  # stored permuted for llama.cpp's RoPE
    ['blk.{i}.attn_q', 'blk.{i}.attn_k']

One `Arch` per architecture: its transformers config and causal-LM classes, its `Row`s (a gguf tensor
stem -> the HF module it fills, its shape in terms of the metadata, its kind), the config keys it reads
beyond the common ones (models/gguf/config.py's `CONFIG_KEYS`), the config defaults llama.cpp implies,
and its conventions: `norm_shift` (Gemma's files store each RMSNorm weight + 1: llama.cpp's convert adds
1, transformers' GGUF processor subtracts it, and so do we) and `embed_scale` (Gemma scales the
embedding by sqrt(hidden)). Everything else reads this table: models/gguf/weights.py (`TENSOR_NAMES`, `hf_name`,
`permuted_heads`, the float model), quantized.py (the model run from its blocks), models/gguf/check.py (the
expected tensor set and shapes), models/gguf/config.py (the config).

References (tests/test_gguf_architectures.py checks the rows against both): gguf's own
`get_tensor_name_map(arch, n_blocks)` (the HF names llama.cpp's convert maps to each gguf name) and
transformers 5.x' GGUF loader (`integrations/ggml.py` `GGUF_CONFIG_MAPPING`, `modeling_gguf_pytorch_utils.py`:
`LlamaTensorProcessor.reverse_permute` on attn_q / attn_k of the "llama" architecture only, mistral
included; `Gemma2TensorProcessor`: every "norm.weight" minus 1 for gemma2 and gemma3). Phi-3's fused
attn_qkv and gate|up ffn_up need no split: transformers' Phi3 modules are fused the same way
(`qkv_proj`, `gate_up_proj`). Shapes are torch order (rows, width) in the terms models/gguf/check.py computes
from the metadata: V vocabulary, E embedding_length, H / KV head counts, D head_dim, F feed_forward_length,
X expert_count, FX / FS the expert and shared-expert feed_forward_length; "H*D" a product, "QKV" (H+2KV)*D.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = ["Row", "Arch", "ARCHS", "lookup", "of_model", "LayerShape", "NOT_APPLIED", "LINEAR", "NORM", "EMBEDDING",
           "HEAD", "EXPERTS"]

EMBEDDING, HEAD, LINEAR, NORM, EXPERTS = "embedding", "head", "linear", "norm", "experts"  # the row kinds

# tensors a file may carry that no model reads, each with what the user loses (gguf_check warns once)
NOT_APPLIED = {
    "rope_freqs.weight": "these RoPE frequency factors are none of Llama 3's settings (models/gguf/rope.py), "
                         "so they are not applied (as in transformers): positions differ from llama.cpp",
    "rope_factors_long.weight": "Phi-3's long-context RoPE factors are not applied (as in transformers): "
                                "positions past the original training context differ from llama.cpp",
    "rope_factors_short.weight": "Phi-3's short-context RoPE factors are not applied (as in transformers): "
                                 "positions differ from llama.cpp",
}


@dataclass(frozen=True)
class Row:
    """One tensor of an architecture: gguf stem ("{i}": the block) -> the HF module it fills.

    kind: EMBEDDING / HEAD / LINEAR (a 2-D weight: a QuantizedLinear) / NORM (a float vector) /
    EXPERTS (a mixture-of-experts tensor: models/gguf/moe.py fills those). bias: a `.bias` beside
    the weight (shape: the weight's rows). permute: the head count ("H" or "KV") whose rows llama.cpp
    stored permuted for its RoPE. param: the HF parameter the gguf `.weight` fills (a stacked expert
    tensor is a parameter of `experts`, not a module's weight); part: which half of that parameter when
    two gguf tensors fill it (gate, then up); vector: a (d,) gguf tensor of an HF (1, d) weight.
    """

    gguf: str
    hf: str
    shape: tuple[str, ...]
    kind: str = LINEAR
    bias: bool = False
    optional: bool = False
    permute: str | None = None
    param: str = "weight"
    part: int | None = None
    vector: bool = False

    @property
    def block(self) -> bool:
        return "{i}" in self.gguf

    def gguf_names(self, blocks: int) -> list[str]:
        """Every tensor name of this row in a file of `blocks` blocks: weights then biases, block by block."""
        stems = [self.gguf.format(i=i) for i in range(blocks)] if self.block else [self.gguf]
        return [f"{s}.weight" for s in stems] + ([f"{s}.bias" for s in stems] if self.bias else [])


@dataclass(frozen=True)
class LayerShape:
    """What one decoder layer of an architecture computes beyond Llama's (the defaults are Llama's layer:
    RMSNorm, q/k/v/o without biases, RoPE, SiLU-gated MLP), as the decode runtime reads it
    (models/runtime/plan.py puts it in each layer's plan; each way of running a step refuses what it
    lacks). Derived from the architecture's rows (`Arch.layer`), so no second list states it.

        >>> ARCHS["qwen2"].layer.qkv_bias, ARCHS["gemma3"].layer.activation, ARCHS["llama"].layer.llama
        (True, 'gelu_tanh', True)
    """

    qkv_bias: bool = False        # Qwen2: biases on q, k, v
    qk_norm: bool = False         # Qwen3, Gemma 3: an RMSNorm of each head's q and k before RoPE
    sandwich_norms: bool = False  # Gemma 2/3: a norm after attention and before and after the MLP
    fused_qkv: bool = False       # Phi-3: q|k|v (and gate|up) one weight in the model itself
    activation: str = "silu"      # the gated MLP's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: Gemma)
    norm_offset: float = 0.0      # Gemma: each RMSNorm scales by (offset + weight)
    embed_scale: bool = False     # Gemma: the embedding times sqrt(hidden_size)
    experts: bool = False         # a mixture-of-experts MLP

    @property
    def llama(self) -> bool:
        """True for Llama's layer exactly."""
        return self == _LLAMA_LAYER

    def beyond_llama(self) -> list[str]:
        """The names of what this layer computes beyond Llama's, as a reason names them."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(_LLAMA_LAYER, f.name)]


_LLAMA_LAYER = LayerShape()


@dataclass(frozen=True)
class Arch:
    """One GGUF architecture (see module doc). name: our key; gguf: its `general.architecture`."""

    name: str
    gguf: str
    config_class: str
    model_class: str
    rows: tuple[Row, ...]
    config_keys: dict = field(default_factory=dict)   # gguf key ("{arch}." prefix) -> config field
    defaults: dict = field(default_factory=dict)      # config fields the file never states
    norm_shift: float = 0.0                           # the file's norm weights are HF's + this
    embed_scale: bool = False                         # the embedding is scaled by sqrt(hidden_size)
    moe: bool = False                                 # mixture-of-experts layers (models/gguf/moe.py)
    activation: str = "silu"                          # the gated MLP's activation ("gelu_tanh": GeGLU)
    # where a file states a sliding window, which layers are global (llama.cpp's and transformers' rule
    # alike; models/gguf/spec.py reads it): every `global_every`-th one; None: no layer (every layer local)
    global_every: int | None = None
    local_rope_base: float | None = None              # the local layers' rope base, where the file states none

    def row(self, gguf: str) -> Row | None:
        """The row of a gguf stem in template form ("blk.{i}.attn_q"), or None."""
        return next((r for r in self.rows if r.gguf == gguf), None)

    def find(self, name: str) -> tuple[Row, int | None] | None:
        """("blk.3.attn_q.weight" -> (its row, 3)), None for a tensor this architecture has no row for."""
        stem = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
        parts = stem.split(".")
        if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
            row = self.row(".".join(["blk", "{i}", *parts[2:]]))
            return (row, int(parts[1])) if row is not None else None
        row = self.row(stem)
        return (row, None) if row is not None else None

    @property
    def layer(self) -> LayerShape:
        """Its decoder layer's LayerShape, read from its rows (biases, q/k norms, Gemma's norms, a fused
        q|k|v) and conventions (norm_shift, embed_scale, moe, activation)."""
        stems = {r.gguf: r for r in self.rows}
        q = stems.get("blk.{i}.attn_q")
        return LayerShape(qkv_bias=bool(q and q.bias), qk_norm="blk.{i}.attn_q_norm" in stems,
                          sandwich_norms="blk.{i}.post_ffw_norm" in stems, fused_qkv="blk.{i}.attn_qkv" in stems,
                          activation=self.activation, norm_offset=self.norm_shift, embed_scale=self.embed_scale,
                          experts=self.moe)

    @property
    def head_dim_key(self) -> str | None:
        """The metadata key ("{arch}." prefix) this architecture reads its head size from, if any."""
        return next((k for k, v in self.config_keys.items() if v == "head_dim"), None)


def _r(gguf: str, hf: str, *shape: str, **kw) -> Row:
    return Row(f"blk.{{i}}.{gguf}", f"model.layers.{{i}}.{hf}", tuple(shape), **kw)


def _globals(head: bool = True) -> tuple[Row, ...]:
    """token_embd, output_norm and (unless always tied) the optional output head."""
    rows = (Row("token_embd", "model.embed_tokens", ("V", "E"), EMBEDDING),
            Row("output_norm", "model.norm", ("E",), NORM))
    return rows + ((Row("output", "lm_head", ("V", "E"), HEAD, optional=True),) if head else ())


def _attention(bias: bool = False, permute: bool = False, qk_norm: bool = False) -> tuple[Row, ...]:
    rows = (_r("attn_norm", "input_layernorm", "E", kind=NORM),
            _r("attn_q", "self_attn.q_proj", "H*D", "E", bias=bias, permute="H" if permute else None),
            _r("attn_k", "self_attn.k_proj", "KV*D", "E", bias=bias, permute="KV" if permute else None),
            _r("attn_v", "self_attn.v_proj", "KV*D", "E", bias=bias),
            _r("attn_output", "self_attn.o_proj", "E", "H*D"))
    norms = (_r("attn_q_norm", "self_attn.q_norm", "D", kind=NORM),
             _r("attn_k_norm", "self_attn.k_norm", "D", kind=NORM))
    return rows + (norms if qk_norm else ())


_MLP = (_r("ffn_gate", "mlp.gate_proj", "F", "E"), _r("ffn_up", "mlp.up_proj", "F", "E"),
        _r("ffn_down", "mlp.down_proj", "E", "F"))
_FFN_NORM = _r("ffn_norm", "post_attention_layernorm", "E", kind=NORM)
_GEMMA_NORMS = (_r("post_attention_norm", "post_attention_layernorm", "E", kind=NORM),
                _r("ffn_norm", "pre_feedforward_layernorm", "E", kind=NORM),
                _r("post_ffw_norm", "post_feedforward_layernorm", "E", kind=NORM))
_EXPERTS = (_r("ffn_gate_inp", "mlp.gate", "X", "E", kind=EXPERTS),
            _r("ffn_gate_exps", "mlp.experts", "X", "FX", "E", kind=EXPERTS, param="gate_up_proj", part=0),
            _r("ffn_up_exps", "mlp.experts", "X", "FX", "E", kind=EXPERTS, param="gate_up_proj", part=1),
            _r("ffn_down_exps", "mlp.experts", "X", "E", "FX", kind=EXPERTS, param="down_proj"))
_SHARED = (_r("ffn_gate_inp_shexp", "mlp.shared_expert_gate", "E", kind=EXPERTS, vector=True),
           _r("ffn_gate_shexp", "mlp.shared_expert.gate_proj", "FS", "E", kind=EXPERTS),
           _r("ffn_up_shexp", "mlp.shared_expert.up_proj", "FS", "E", kind=EXPERTS),
           _r("ffn_down_shexp", "mlp.shared_expert.down_proj", "E", "FS", kind=EXPERTS))
_PHI3 = (_r("attn_norm", "input_layernorm", "E", kind=NORM), _r("attn_qkv", "self_attn.qkv_proj", "QKV", "E"),
         _r("attn_output", "self_attn.o_proj", "E", "H*D"), _FFN_NORM,
         _r("ffn_up", "mlp.gate_up_proj", "2F", "E"), _r("ffn_down", "mlp.down_proj", "E", "F"))

_ROPE_DIM = {"{arch}.rope.dimension_count": "head_dim"}
_KEY_LENGTH = {"{arch}.attention.key_length": "head_dim"}
_WINDOW = {"{arch}.attention.sliding_window": "sliding_window"}
_EXPERT_KEYS = {"{arch}.expert_count": "num_experts", "{arch}.expert_used_count": "num_experts_per_tok",
                "{arch}.expert_feed_forward_length": "moe_intermediate_size"}
_LLAMA = _globals() + _attention(permute=True) + (_FFN_NORM, *_MLP)

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama", "llama", "LlamaConfig", "LlamaForCausalLM", _LLAMA, _ROPE_DIM),
    Arch("mistral", "llama", "MistralConfig", "MistralForCausalLM", _LLAMA, _ROPE_DIM),
    Arch("qwen2", "qwen2", "Qwen2Config", "Qwen2ForCausalLM", _globals() + _attention(bias=True) + (_FFN_NORM, *_MLP)),
    Arch("qwen3", "qwen3", "Qwen3Config", "Qwen3ForCausalLM",
         _globals() + _attention(qk_norm=True) + (_FFN_NORM, *_MLP), _KEY_LENGTH),
    Arch("phi3", "phi3", "Phi3Config", "Phi3ForCausalLM", _globals() + _PHI3, _WINDOW),
    Arch("gemma2", "gemma2", "Gemma2Config", "Gemma2ForCausalLM", _globals(head=False) + _attention() + _GEMMA_NORMS
         + _MLP, {**_KEY_LENGTH, **_WINDOW, "{arch}.attn_logit_softcapping": "attn_logit_softcapping",
                  "{arch}.final_logit_softcapping": "final_logit_softcapping"}, norm_shift=1.0, embed_scale=True,
         activation="gelu_tanh", global_every=2),
    Arch("gemma3", "gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
         _globals() + _attention(qk_norm=True) + _GEMMA_NORMS + _MLP, {**_KEY_LENGTH, **_WINDOW}, norm_shift=1.0,
         embed_scale=True, activation="gelu_tanh", global_every=6, local_rope_base=10000.0),
    Arch("qwen2moe", "qwen2moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
         _globals() + _attention(bias=True) + (_FFN_NORM, *_EXPERTS, *_SHARED),
         {**_EXPERT_KEYS, "{arch}.expert_shared_feed_forward_length": "shared_expert_intermediate_size"}, moe=True),
    Arch("qwen3moe", "qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
         _globals() + _attention(qk_norm=True) + (_FFN_NORM, *_EXPERTS), {**_KEY_LENGTH, **_EXPERT_KEYS},
         defaults={"norm_topk_prob": True}, moe=True),
)}


def of_model(class_name: str) -> Arch | None:
    """The Arch whose causal-LM class is `class_name` ("LlamaForCausalLM" -> the llama row), None for a
    class no row names: the decode runtime's plan reads the layer's shape from it (fail closed: a class
    without a row is run by transformers' own forward)."""
    return next((a for a in ARCHS.values() if a.model_class == class_name), None)


def lookup(architecture: str | None, name: str | None = None) -> Arch | None:
    """The Arch of a file's `general.architecture` (and `general.name`), None for one not in the table.

    A "llama" file named exactly "mistral" is the mistral row: transformers' own rule (its loader
    tests `"mistral" in [general.name]`), so both read the same config class.
    """
    if architecture == "llama" and name == "mistral":
        return ARCHS["mistral"]
    return next((a for a in ARCHS.values() if a.gguf == architecture and a.name != "mistral"), None)
