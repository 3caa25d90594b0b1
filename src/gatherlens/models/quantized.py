"""`load(name, quantized=True)`: a Llama GGUF run from its blocks, with no float32 conversion.

    >>> lm = load("smollm2", quantized=True)          # a few seconds, nothing cached needed
    >>> lm.info["quantized"], type(lm.model.model.embed_tokens).__name__
    (True, 'QuantizedEmbedding')
    >>> lm.model.generate(lm.encode("The cat"), max_new_tokens=8)

How the model is built: the config and tokenizer come from the GGUF's own metadata
(models/gguf_config.py, gguf_tokenizer.py; no cached copy to go stale). The `LlamaForCausalLM` is
built on the meta device; every nn.Linear becomes a `QuantizedLinear` over its blocks (Q4_0 / Q4_1 /
Q8_0: the "q8act" route where its C++ operator builds, llama.cpp's integer dot products on the
blocks as stored, x rounded to 8 bits per 32 values; else PyTorch's int4 kernel on the codes, bf16
activations; formats neither takes: a bf16 copy), the embedding a `QuantizedEmbedding` over the
Q8_0 table mapped in place, the tied head the same blocks (q8act; else a bf16 copy), the norms the file's F32 tensors. `ROUTE` / `HEAD_ROUTE`
name another route ("int4" keeps x in bf16: +0.06% perplexity against q8act's +0.3%, slower). q|k|v and gate|up are packed fused (`qkv_proj`, `gate_up_proj`, used by the lean decode
step) and the separate projections share their packed rows. attn_q / attn_k rows are stored
permuted for llama.cpp's RoPE; the same row permutation as transformers' `reverse_permute` undoes it
(blocks run along K, so moving whole rows is exact).
Prefill (an x of at least `PREFILL_ROWS` rows) dequantizes each weight for the call and runs float32
GEMM: bit-equal to the float model's weights and faster there than the int4 kernel on this CPU.
"""
from __future__ import annotations

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.hf_adapter import preset_attn_implementation
from gatherlens.models.gguf_weights import TENSOR_NAMES, permuted_heads, unpermute_rows
from gatherlens.models.integrity import readable
from gatherlens.models.loading import LoadedModel
from gatherlens.models.quantized_layers import QuantizedEmbedding, QuantizedLinear
from gatherlens.models.registry import ModelSource, check_quantizable
from gatherlens.ops.quant import LinearConfig, QuantizedTable, pack_linear, split_linear
from gatherlens.ops.quant.matmul import ROUTES
from gatherlens.ops.quant.q8act import Q8ACT_QTYPES
from gatherlens.ops.quant.linear import LINEAR_PRODUCT

__all__ = ["load_quantized", "PREFILL_ROWS", "ROUTE", "HEAD_ROUTE", "pick_route", "quantized_modules"]

PREFILL_ROWS = 128  # rows from which a call dequantizes to float32 (ops/quant/linear.py)
ROUTE = "auto"  # the linears: "q8act" where it builds (llama.cpp's integer dot products), else "int4"
HEAD_ROUTE = "auto"  # the tied Q8_0 head: "q8act" where it builds, else bf16 (faster than two int4 planes)


def _projections(part: str) -> dict[str, str]:
    """{"attn_q": "q_proj", ...}: the gguf kinds of one part of a layer and their HF module names."""
    return {gguf.rsplit(".", 1)[1]: hf.rsplit(".", 1)[1] for gguf, hf in TENSOR_NAMES.items() if f".{part}." in hf}


_ATTN, _MLP = _projections("self_attn"), _projections("mlp")  # in fusing order: q|k|v, gate|up


def load_quantized(source: ModelSource, attn_implementation: str | None, say) -> LoadedModel:
    """A GGUF source -> LoadedModel whose linears and embedding are GGUF blocks (see module doc)."""
    from gatherlens.models.file_watch import FileWatch, watch_model
    from gatherlens.models.gguf_check import open_reader

    check_quantizable(source)
    watch = FileWatch(source.path)  # the file before any of it is read: a change later is one error
    say(f"checking {source.path.name}")
    with readable(source.path):
        reader = open_reader(source.path, quantized=True)  # a gguf.GGUFReader ("c": copy-on-write)
    check_quantizable(source, reader=reader)  # types, metadata, shapes, scales: before anything slow
    config, tokenizer, folder = _config_and_tokenizer(source, say)
    if config.model_type != "llama":
        raise GatherValueError(f"quantized=True runs Llama GGUF files; {source.path.name} is {config.model_type!r}")
    say(f"mapping the blocks of {source.path.name}")
    with readable(source.path):
        tables = {t.name: t for t in reader.tensors}
        model = _build(config, reader, tables, attn_implementation)
        watch_model(model, watch, reader.data)  # it reads the mapping in place (models/file_watch.py)
    info = {"quantized": True, "config_from": "cache" if folder else "gguf"}
    return LoadedModel(source.name, model, tokenizer, source.path, folder, info=info)


def _config_and_tokenizer(source: ModelSource, say):
    """(config, tokenizer, None): both read from the GGUF's own metadata (models/gguf_config.py,
    gguf_tokenizer.py), never from a cached copy that could have gone stale; transformers reads
    only what those do not know."""
    from gatherlens.models.gguf_config import load_gguf_config, open_gguf
    from gatherlens.models.gguf_tokenizer import load_gguf_tokenizer

    say(f"reading the config and tokenizer from {source.path.name}")
    with readable(source.path):
        reader = open_gguf(source.path, mode="c")  # load_quantized's own reader: open_gguf keeps the last file
        return load_gguf_config(source.path, reader), load_gguf_tokenizer(source.path, reader), None


def _build(config, reader, tables: dict, attn_implementation: str | None):
    """The HF LlamaForCausalLM, built empty, its parts replaced by the file's blocks."""
    from transformers import LlamaForCausalLM

    if attn_implementation:
        preset_attn_implementation(config, attn_implementation)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    inner = model.model
    embed = QuantizedTable.from_reader(reader, "token_embd.weight")
    inner.embed_tokens = QuantizedEmbedding(embed)
    head = QuantizedTable.from_reader(reader, "output.weight") if "output.weight" in tables else embed
    head_config = LinearConfig(route=pick_route(head.qtype, HEAD_ROUTE, head=True), prefill_rows=PREFILL_ROWS)
    model.lm_head = QuantizedLinear(pack_linear(head.raw, head.qtype, head_config))
    for i, layer in enumerate(inner.layers):
        _fill_layer(layer, i, reader, tables, config)
    inner.norm.weight = _norm(tables, "output_norm.weight")
    inner.rotary_emb = type(inner.rotary_emb)(config=config)  # its inv_freq computed on the CPU
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GatherValueError(f"{len(left)} tensors of the model have no data in the file (first: {left[0]})")
    return model.eval()


def _config(qtype: str, route: str | None = None) -> LinearConfig:
    """The LinearConfig of one weight: `route` (default ROUTE) where it takes `qtype`, else the next best."""
    return LinearConfig(route=pick_route(qtype, route or ROUTE), prefill_rows=PREFILL_ROWS)


def pick_route(qtype: str, route: str, head: bool = False) -> str:
    """"auto": q8act for Q4_0 / Q4_1 / Q8_0 when its operator can run here (the product table's
    q8act row says), else int4 (bf16 for a head); a named route where it takes `qtype`; bf16 for any
    format no faster route takes."""
    if route == "auto":
        if qtype in Q8ACT_QTYPES and LINEAR_PRODUCT.ready("q8act") is None:
            return "q8act"
        route = "bf16" if head else "int4"
    takes = ROUTES[route].qtypes if route in ROUTES else None  # from the format records (ops/quant/layout.py)
    return route if takes is None or qtype in takes else "bf16"


def _rows(reader, name: str, config) -> torch.Tensor:
    """The blocks of a linear (N, row_bytes), q and k rows back in HF's order (reverse_permute)."""
    raw = QuantizedTable.from_reader(reader, name).raw  # (N, row_bytes), mapped in place
    heads = permuted_heads(name, config)
    return raw if heads is None else unpermute_rows(raw, heads)  # (N, row_bytes): whole rows move, exact


def _fused(parent, names: list[str], raws: list[torch.Tensor], qtype: str) -> QuantizedLinear:
    """Pack the rows of several projections as one weight; each projection a view of its rows."""
    fused = pack_linear(torch.cat(raws), qtype, _config(qtype))  # (sum N, row_bytes)
    for name, part in zip(names, split_linear(fused, [r.shape[0] for r in raws])):
        setattr(parent, name, QuantizedLinear(part))
    return QuantizedLinear(fused)


def _fill_layer(layer, i: int, reader, tables: dict, config) -> None:
    """One decoder layer's projections (q|k|v and gate|up fused when one format) and norms."""
    for part, kinds, fuse, fused_name in ((layer.self_attn, _ATTN, 3, "qkv_proj"),
                                          (layer.mlp, _MLP, 2, "gate_up_proj")):
        names = [f"blk.{i}.{kind}.weight" for kind in kinds]
        missing = [n for n in names if n not in tables]
        if missing:
            raise GatherValueError(f"tensor {missing[0]!r} is missing from the file; a Llama layer needs it")
        raws = [_rows(reader, n, config) for n in names]
        qtypes = [tables[n].tensor_type.name for n in names]
        if len(set(qtypes[:fuse])) == 1:
            part.add_module(fused_name, _fused(part, list(kinds.values())[:fuse], raws[:fuse], qtypes[0]))
        start = fuse if len(set(qtypes[:fuse])) == 1 else 0  # mixed formats: each packed alone
        for raw, qtype, name in list(zip(raws, qtypes, kinds.values()))[start:]:
            setattr(part, name, QuantizedLinear(pack_linear(raw, qtype, _config(qtype))))
    layer.input_layernorm.weight = _norm(tables, f"blk.{i}.attn_norm.weight")
    layer.post_attention_layernorm.weight = _norm(tables, f"blk.{i}.ffn_norm.weight")


def _norm(tables: dict, name: str) -> torch.nn.Parameter:
    if name not in tables:
        raise GatherValueError(f"tensor {name!r} is missing from the file; a Llama model needs it")
    data = torch.from_numpy(tables[name].data.astype("float32").reshape(-1).copy())  # (d,)
    return torch.nn.Parameter(data, requires_grad=False)


def quantized_modules(model) -> dict[str, int]:
    """How many QuantizedLinear / QuantizedEmbedding modules `model` holds (a quick check)."""
    kinds = (QuantizedLinear, QuantizedEmbedding)
    return {k.__name__: sum(1 for m in model.modules() if type(m) is k) for k in kinds}
