"""The native runtime's model: a GGUF read straight into a DecodePlan, no transformers module.

    >>> lm = load_native(source, say)            # models/loading.py's "native" row does this
    >>> lm.model.plan.layers[0].qkv               # Products over the file's blocks (ops/layer/plan.py)
    >>> cache = lm.model.new_cache(config)        # a PagedKVCache per global layer, a WindowRing per local one
    >>> use_sparse_decoding(lm.model); lm.model(input_ids=ids, cache=cache).logits   # DECODE_STEP's rows

`plan_gguf(reader, spec)` makes the plan every row of models/runtime/step.py's `DECODE_STEP` reads
(the C++ stack, the planned loop, the chunked prefill): per layer its norms (the file's values are
the factors: Gemma's files store 1 + w), its products (`Product.of_weight`: every linear a
QuantizedWeight over its blocks, its route picked as the transformers path picks it, q|k|v and
gate|up packed as one weight where they share a format, Llama's q / k rows un-permuted, Qwen2's
biases), its q/k and sandwich norms, its window and variant, its rank among the global layers (a
`LayerHandle` instead of a transformers attention module) and the angle table its RoPE reads
(ops/layer/rope.py from the file's rope parameters: the rope_freqs factors of a Llama 3 file
applied as llama.cpp applies them; Gemma 3's local layers their own base); the embedding a
`QuantizedEmbedding` over the mapped table (Gemma's scaled by sqrt(hidden)), the head a quantized
product over `output.weight` or the tied table's blocks. No float or bf16 copy of any weight is
made (the panels of a panel format are the same bytes moved); the file is mapped once, and its
pages are let go once the weights are packed (`release_mapping`): what is read in place comes back
as it is read (made the process's own where it is a small share of the file: `keep_in_place`).

`NativeModel` holds the plan and the spec (`.config`: transformers' config names). It has no forward
of its own until the runtime installs the decode-step table (models/runtime/native.py, through
use_sparse_decoding), as `install_step` does for a transformers model.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from gatherlens.errors import GatherValueError
from gatherlens.memory import release_mapping, release_memory
from gatherlens.models.files.integrity import readable
from gatherlens.models.files.loaded import LoadedModel
from gatherlens.models.files.registry import ModelSource, check_quantizable
from gatherlens.models.gguf.layers import QuantizedEmbedding
from gatherlens.models.gguf.quantized import (head_weight, keep_in_place, letting_go, packed_weight, panel_rows,
                                              weight_rows)
from gatherlens.models.gguf.spec import ModelSpec, model_spec
from gatherlens.ops.attention.variants import PLAIN, AttentionVariant
from gatherlens.ops.layer.plan import DecodePlan, LayerHandle, LayerPlan, Product
from gatherlens.ops.layer.rope import Rope, inverse_frequencies
from gatherlens.ops.quant import QuantizedTable
from gatherlens.ops.quant.formats.floats import float_values
from gatherlens.ops.sparse.cache import PagedKVCache
from gatherlens.ops.sparse.ring import WindowRing

__all__ = ["NativeModel", "NativeCache", "NativeOutput", "plan_gguf", "load_native", "native_refusal"]

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # the angle tables' keys (transformers' layer type names)


class NativeOutput(SimpleNamespace):
    """What a NativeModel's forward returns: `.logits` (B, T, V) and `.cache` (as transformers' output)."""


class NativeCache:
    """The native runtime's KV cache: `layers[i]` is a PagedKVCache (a global layer) or a WindowRing (a
    local one), batch 1, read in float32, stored in `kv_dtype` (ops/sparse/config.KV_DTYPES)."""

    def __init__(self, spec: ModelSpec, page_size: int, kv_dtype: str | None = None, capacity: int | None = None):
        KV, D = spec.num_key_value_heads, spec.head_dim
        self.layers = [WindowRing(w, 1, KV, D, page_size, kv_dtype=kv_dtype) if w else
                       PagedKVCache(1, KV, D, page_size, capacity=capacity, kv_dtype=kv_dtype) for w in spec.windows]

    def get_seq_length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` tokens in every global layer (no decode step grows a cache)."""
        for layer in self.layers:
            if isinstance(layer, PagedKVCache):
                layer.reserve(tokens)

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)


class NativeModel:
    """A GGUF run by the native runtime (see the module doc): `.plan`, `.config` (its ModelSpec)."""

    training = False

    def __init__(self, plan: DecodePlan, spec: ModelSpec):
        self.plan, self.config = plan, spec
        self.generation_config = SimpleNamespace(eos_token_id=spec.eos_token_id)
        self.device = torch.device("cpu")
        self.runner = None  # (plan, model, args, kwargs) -> output: the decode-step table, once installed

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The installed decode-step table on this call (models/runtime/native.py installs it)."""
        if self.runner is None:
            raise GatherValueError("this native model has no decode step installed: generation installs one "
                                   "(models/runtime/native.py: use_native_decoding(model))")
        return self.runner(self.plan, self, args, kwargs)

    def step_output(self, logits: torch.Tensor, cache) -> NativeOutput:
        return NativeOutput(logits=logits, cache=cache)

    def new_cache(self, page_size: int, kv_dtype: str | None = None, capacity: int | None = None) -> NativeCache:
        return NativeCache(self.config, page_size, kv_dtype, capacity)

    def parameters(self):
        return iter(())

    def eval(self):
        return self

    def __repr__(self) -> str:
        return f"NativeModel({self.config.arch.name}, {self.config.num_hidden_layers} layers)"


def native_refusal(reader) -> str | None:
    """Why the native runtime cannot run this file (None: it can): models/loading.py's table asks it."""
    spec = model_spec(reader)
    if spec is None:
        return "its architecture has no row in models/gguf/arch.py"
    return spec.refusal


def load_native(source: ModelSource, say) -> LoadedModel:
    """A GGUF source -> LoadedModel of a NativeModel and its TextTokenizer (see the module doc)."""
    from gatherlens.models.files.watch import FileWatch, watch_model
    from gatherlens.models.gguf.check import check_gguf, open_reader
    from gatherlens.models.gguf.config import forget_kept
    from gatherlens.models.gguf.text import text_tokenizer

    check_quantizable(source)
    watch = FileWatch(source.path)  # the file before any of it is read: a change later is one error
    say(f"checking {source.path.name}")
    with readable(source.path):
        reader = open_reader(source.path, quantized=True)  # a gguf.GGUFReader ("c": copy-on-write), kept: once
    check_gguf(reader, source.path, quantized=True, applied=APPLIED)
    spec = model_spec(reader)
    if spec is None or spec.refusal is not None:
        raise GatherValueError(f"the native runtime cannot run {source.path.name}: "
                               f"{spec.refusal if spec else 'its architecture has no row'}")
    say(f"reading the tokenizer and mapping the blocks of {source.path.name}")
    with readable(source.path):
        tokenizer = text_tokenizer(reader, source.path)
        release_memory()  # the tokenizer's temporaries (a 262K vocabulary's merges) back to the system
        with letting_go(reader):  # each weight's file pages go once it is packed
            model = NativeModel(plan_gguf(reader, spec), spec)
        watch_model(model, watch, reader.data)  # it reads the mapping in place (models/files/watch.py)
    forget_kept()  # the model holds the mapping; the parsed header can go
    release_mapping(reader.data)  # packing read every page: resident now only what is read
    release_memory()  # the head's packing temporaries too
    table = model.plan.embed.table
    keep_in_place(reader, [*model.plan.stored_blocks(), table.raw if table.pick is None else None])
    return LoadedModel(source.name, model, tokenizer, source.path, info={"quantized": True, "runtime": "native"})


APPLIED = ("rope_freqs.weight",)  # tensors models/gguf/arch.NOT_APPLIED lists that this runtime applies


# -- the plan --------------------------------------------------------------------------------------------
def plan_gguf(reader, spec: ModelSpec) -> DecodePlan:
    """The DecodePlan of a GGUF file whose spec the native runtime runs (see the module doc)."""
    tensors = {t.name: t for t in reader.tensors}
    arch = spec.arch
    table = QuantizedTable.from_reader(reader, "token_embd.weight")
    tied = "output.weight" not in tensors
    head = head_weight(table if tied else QuantizedTable.from_reader(reader, "output.weight"))
    scale = spec.hidden_size ** 0.5 if arch.embed_scale else None
    embed = QuantizedEmbedding(panel_rows(table, head) if tied else table, scale)
    angles = _angles(reader, tensors, spec)
    ranks = [sum(1 for w in spec.windows[:i] if w is None) for i in range(spec.num_hidden_layers)]
    layers = tuple(_trimmed(_layer(reader, tensors, spec, i, ranks[i], angles)) for i in range(spec.num_hidden_layers))
    variants = frozenset().union(*(layer.variant.used for layer in layers))
    return DecodePlan(layers, _vector(tensors, "output_norm.weight"), spec.rms_norm_eps,
                      Product.of_weight("the head", head), embed, angles,
                      None if embed.scale is None else float(embed.scale), _rope_type(spec), None, None, "auto", variants, origin="gguf")


def _trimmed(layer: LayerPlan) -> LayerPlan:
    """The layer, the heap's free pages given back once it is packed: packing's temporaries lie between the
    packed weights, below glibc's mmap threshold, and would stay resident (Qwen2.5 0.5B Q8_0: ~170 MB)."""
    release_memory()
    return layer


def _rope_type(spec: ModelSpec) -> str:
    return "default" if spec.rope_scaling is None else spec.rope_scaling.type


def _angles(reader, tensors: dict, spec: ModelSpec) -> dict:
    """{GLOBAL: the global layers' Rope, LOCAL: the local layers' (where they have their own base)}."""
    factors = _vector(tensors, "rope_freqs.weight") if "rope_freqs.weight" in tensors else None
    angles = {GLOBAL: Rope(inverse_frequencies(spec.rope_dim, spec.rope_theta, spec.rope_scaling, factors))}
    if spec.local_rope_theta is not None and any(w is not None for w in spec.windows):
        angles[LOCAL] = Rope(inverse_frequencies(spec.rope_dim, spec.local_rope_theta))
    return angles


def _vector(tensors: dict, name: str) -> torch.Tensor:
    """A 1-D tensor of the file (a norm, a bias, rope factors) as float32, copied, its values as stored."""
    if name not in tensors:
        raise GatherValueError(f"tensor {name!r} is missing from the file")
    tensor = tensors[name]
    raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(1, -1))  # (1, d * bytes): a copy
    return float_values(raw, tensor.tensor_type.name).float().reshape(-1)  # (d,)


def _layer(reader, tensors: dict, spec: ModelSpec, i: int, rank: int, angles: dict) -> LayerPlan:
    """Layer i's plan from the file's block tensors."""
    arch, shape, block = spec.arch, spec.arch.layer, f"blk.{i}."
    norm = lambda stem: _vector(tensors, f"{block}{stem}.weight")  # noqa: E731
    H, KV, D, window = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim, spec.windows[i]
    qkv = _group(reader, tensors, spec, block, ("attn_qkv",) if shape.fused_qkv else ("attn_q", "attn_k", "attn_v"))
    gate_up = _group(reader, tensors, spec, block, ("ffn_up",) if shape.fused_qkv else ("ffn_gate", "ffn_up"))
    o, down = (_group(reader, tensors, spec, block, (stem,))[0] for stem in ("attn_output", "ffn_down"))
    eps = spec.rms_norm_eps
    return LayerPlan(
        shape, (norm("attn_norm"), norm("ffn_norm")), (eps, eps), qkv, o, gate_up, down, (H * D, KV * D, KV * D), H, KV,
        D, spec.scaling, i, None if window else rank, window, AttentionVariant(window=window) if window else PLAIN,
        LayerHandle(i, None if window else rank), o.act,
        (norm("attn_q_norm"), norm("attn_k_norm")) if shape.qk_norm else None, eps,
        (norm("post_attention_norm"), norm("post_ffw_norm")) if shape.sandwich_norms else None, (eps, eps),
        arch.activation, LOCAL if window and LOCAL in angles else GLOBAL)


def _group(reader, tensors: dict, spec: ModelSpec, block: str, stems: tuple[str, ...]) -> tuple[Product, ...]:
    """The products of some projections of a block: (one packed Product,) where they share one format, else
    one Product each; their biases beside (Qwen2)."""
    names = [f"{block}{stem}" for stem in stems]
    qtypes = [tensors[f"{n}.weight"].tensor_type.name for n in names]
    raws = [weight_rows(reader, f"{n}.weight", spec, spec.arch) for n in names]  # (N, row_bytes) each
    biases = [_vector(tensors, f"{n}.bias") if f"{n}.bias" in tensors else None for n in names]
    if len(set(qtypes)) == 1:
        bias = None if any(b is None for b in biases) else torch.cat(biases)  # (sum N,)
        return (Product.of_weight("+".join(names), packed_weight(reader, raws, qtypes[0]), bias),)
    return tuple(Product.of_weight(n, packed_weight(reader, [r], q), b) for n, r, q, b in zip(names, raws, qtypes,
                                                                                             biases))
