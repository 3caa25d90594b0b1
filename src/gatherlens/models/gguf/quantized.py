"""`load(name, quantized=True)`: a GGUF run from its blocks, with no float32 conversion.

    >>> lm = load("smollm2", quantized=True)          # a few seconds, nothing cached needed
    >>> lm.info["quantized"], type(lm.model.model.embed_tokens).__name__
    (True, 'QuantizedEmbedding')
    >>> lm.model.generate(lm.encode("The cat"), max_new_tokens=8)

How the model is built: the config and tokenizer come from the GGUF's own metadata
(models/gguf/config.py, models/gguf/tokenizer.py; no cached copy to go stale). The architecture's HF class
(models/gguf/arch.py's row: llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3, qwen2moe, qwen3moe) is
built on the meta device and filled by walking the row's tensors: every 2-D linear weight becomes a
`QuantizedLinear` over its blocks (`linear_from`: the route `pick_route` names, "q8act" where its C++
operator takes the format, llama.cpp's integer dot products on the blocks as stored, x rounded to
8 bits per block; else PyTorch's int4 kernel on the codes, bf16 activations; formats neither takes:
a bf16 copy), with Qwen2's q/k/v biases as float parameters; the embedding a `QuantizedEmbedding`
over its table mapped in place (Gemma's scaled by sqrt(hidden)); the head `output.weight` or, tied,
the embedding's blocks (q8act; else a bf16 copy); the norms the file's float vectors (Gemma's less 1);
mixture-of-experts blocks models/gguf/moe.py's `fill_moe`. `ROUTE` / `HEAD_ROUTE` name another
route ("int4" keeps x in bf16: +0.06% perplexity against q8act's +0.3%, slower). q|k|v and gate|up
are packed fused where a layer has them in one format (`PACKED`: `qkv_proj`, `gate_up_proj`, used
by the decode plan) and the separate projections share their packed rows; Phi-3's are fused in
the file and in its HF class already. Rows the table marks `permute` (Llama's attn_q / attn_k) are
stored permuted for llama.cpp's RoPE; the same row permutation as transformers' `reverse_permute`
undoes it (blocks run along K, so moving whole rows is exact).
Prefill (an x of at least `PREFILL_ROWS` rows) runs the q8act kernels' blocked integer GEMM on the
blocks where the format record's `gemm_rows` says it is faster (x rounded to 8 bits, as in decode: ~0.3%
perplexity against the float model), else dequantizes each weight in tiles for the call and runs
float32 GEMM (bit-equal to the float model's weights).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from gatherlens.errors import GatherValueError
from gatherlens.memory import keep_private, release_mapping, release_memory, release_pages
from gatherlens.models.hf_adapter import preset_attn_implementation
from gatherlens.models.gguf.arch import HEAD, LINEAR, NORM, Arch, Row
from gatherlens.models.gguf.weights import embed_scale, fresh_rotary, permuted_heads, unpermute_rows
from gatherlens.models.files.integrity import readable
from gatherlens.models.files.loaded import LoadedModel
from gatherlens.models.gguf.layers import QuantizedEmbedding, QuantizedLinear
from gatherlens.models.files.registry import ModelSource, check_quantizable
from gatherlens.ops.quant import LinearConfig, QuantizedTable, pack_linear, split_linear
from gatherlens.ops.quant.products.linear import pack_apart
from gatherlens.ops.quant.formats.floats import float_values
from gatherlens.ops.quant.products.matmul import pick_route
from gatherlens.ops.quant.products.x8 import after_packing, x8_rows

__all__ = ["load_quantized", "PREFILL_ROWS", "ROUTE", "HEAD_ROUTE", "linear_from", "quantized_modules", "weight_rows",
           "packed_weight", "head_weight", "panel_rows", "let_go", "letting_go", "PRIVATE_SHARE", "keep_in_place"]

PREFILL_ROWS = 128  # rows from which a call dequantizes to float32 (ops/quant/products/linear.py)
ROUTE = "auto"  # the linears: "q8act" where it builds (llama.cpp's integer dot products), else "int4"
HEAD_ROUTE = "auto"  # the tied Q8_0 head: "q8act" where it builds, else bf16 (faster than two int4 planes)


# projections packed as one weight where a layer has them all in one format (the decode plan's
# fused products): (parent module, the fused module's name, its parts in order)
PACKED = (("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")), ("mlp", "gate_up_proj", ("gate_proj", "up_proj")))
_LAYER = "model.layers.{i}."  # the prefix of every block row's HF name (models/gguf/arch.py)


def load_quantized(source: ModelSource, attn_implementation: str | None, say) -> LoadedModel:
    """A GGUF source -> LoadedModel whose linears and embedding are GGUF blocks (see module doc)."""
    from gatherlens.models.files.watch import FileWatch, watch_model
    from gatherlens.models.gguf.check import check_gguf, open_reader
    from gatherlens.models.gguf.config import forget_kept

    check_quantizable(source)
    watch = FileWatch(source.path)  # the file before any of it is read: a change later is one error
    say(f"checking {source.path.name}")
    with readable(source.path):
        reader = open_reader(source.path, quantized=True)  # a gguf.GGUFReader ("c": copy-on-write)
    check_gguf(reader, source.path, quantized=True)  # types, architecture, metadata, shapes, scales: before anything slow
    release_mapping(reader.data)  # the scale checks touched every page: the packing reads what it needs again
    config, tokenizer, folder = _config_and_tokenizer(source, say)
    release_memory()  # the tokenizer's temporaries (a 262K vocabulary's merges) back to the system
    arch = _arch(reader)
    say(f"mapping the blocks of {source.path.name}")
    with readable(source.path), letting_go(reader):
        tables = {t.name: t for t in reader.tensors}
        model = _build(config, reader, tables, attn_implementation, arch)
        watch_model(model, watch, reader.data)  # it reads the mapping in place (models/files/watch.py)
    forget_kept()  # the model holds the mapping; the parsed header (~40 MB of objects) can go
    release_mapping(reader.data)  # the checks and the panels read every page: resident now only what is read
    keep_in_place(reader, _stored_blocks(model))
    info = {"quantized": True, "config_from": "cache" if folder else "gguf"}
    return LoadedModel(source.name, model, tokenizer, source.path, folder, info=info)


def _stored_blocks(model) -> list[torch.Tensor]:
    """The blocks the model's modules read as stored: linears without panels, an embedding not read from them."""
    raws = []
    for module in model.modules():
        if isinstance(module, QuantizedLinear) and module.qweight.panels is None and not module.qweight.raw.is_meta:
            raws.append(module.qweight.raw)
        elif isinstance(module, QuantizedEmbedding) and module.table.pick is None:
            raws.append(module.table.raw)
    return raws


def _config_and_tokenizer(source: ModelSource, say):
    """(config, tokenizer, None): both read from the GGUF's own metadata (models/gguf/config.py,
    models/gguf/tokenizer.py), never from a cached copy that could have gone stale; transformers reads
    only what those do not know."""
    from gatherlens.models.gguf.config import load_gguf_config, open_gguf
    from gatherlens.models.gguf.tokenizer import load_gguf_tokenizer

    say(f"reading the config and tokenizer from {source.path.name}")
    with readable(source.path):
        reader = open_gguf(source.path, mode="c")  # load_quantized's own reader: open_gguf keeps the last file
        return load_gguf_config(source.path, reader), load_gguf_tokenizer(source.path, reader), None


def _arch(reader) -> Arch:
    """The file's row of the architecture table (the check already refused a file without one)."""
    from gatherlens.models.gguf.config import file_arch

    arch = file_arch(reader)
    if arch is None:  # only when the check was bypassed
        raise GatherValueError("quantized=True runs the architectures of models/gguf/arch.py; this file has none")
    return arch


def _build(config, reader, tables: dict, attn_implementation: str | None, arch: Arch):
    """The architecture's HF causal LM, built empty, its parts replaced by the file's blocks."""
    import transformers

    if attn_implementation:
        preset_attn_implementation(config, attn_implementation)
    with torch.device("meta"):
        model = getattr(transformers, arch.model_class)(config)
    inner = model.model
    embed = QuantizedTable.from_reader(reader, "token_embd.weight")
    untied = any(r.kind == HEAD for r in arch.rows) and "output.weight" in tables
    head = head_weight(QuantizedTable.from_reader(reader, "output.weight") if untied else embed)
    model.lm_head = QuantizedLinear(head)
    embed = embed if untied else panel_rows(embed, head)
    inner.embed_tokens = QuantizedEmbedding(embed, embed_scale(config) if arch.embed_scale else None)
    for i, layer in enumerate(inner.layers):
        _fill_layer(layer, i, reader, tables, config, arch)
    inner.norm.weight = _norm(tables, "output_norm.weight", arch)
    fresh_rotary(model, config)  # inv_freq computed on the CPU
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GatherValueError(f"{len(left)} tensors of the model have no data in the file (first: {left[0]})")
    return model.eval()


def letting_go(reader):
    """Inside the block, each weight's file pages go once pack_x8 has moved them (`let_go`): every loader's
    packing, the transformers runtime's and the native one's."""
    return after_packing(lambda rows: let_go(rows, reader))


def let_go(rows: torch.Tensor, reader) -> None:
    """The file's pages of rows a route has just copied (panels: ops/quant/products/x8.py) let go at once: loading
    never holds a weight's pages and its copy together (a 262K-row head would be 178 MB twice)."""
    if rows.is_contiguous():
        release_pages(reader.data, rows.data_ptr(), rows.numel())


def _config(qtype: str, route: str | None = None) -> LinearConfig:
    """The LinearConfig of one weight: `route` (default ROUTE) where it takes `qtype`, else the next best."""
    return LinearConfig(route=pick_route(qtype, route or ROUTE), prefill_rows=PREFILL_ROWS)


def linear_from(raw: torch.Tensor, qtype: str, bias: torch.Tensor | None = None) -> QuantizedLinear:
    """A QuantizedLinear over raw rows of blocks (N, row_bytes) in `qtype`, its route picked here (the
    one place: `pick_route(qtype, ROUTE)`); models/gguf/moe.py makes its experts with it."""
    return QuantizedLinear(pack_linear(raw, qtype, _config(qtype)), bias)


def weight_rows(reader, name: str, config, arch: Arch) -> torch.Tensor:
    """The blocks of a linear (N, row_bytes), q and k rows back in HF's order where the row says (reverse_permute);
    config: anything with num_attention_heads / num_key_value_heads (a transformers config, a ModelSpec)."""
    raw = QuantizedTable.from_reader(reader, name).raw  # (N, row_bytes), mapped in place
    heads = permuted_heads(name, config, arch)
    if heads is None:
        return raw
    moved = unpermute_rows(raw, heads)  # (N, row_bytes): whole rows move, exact
    let_go(raw, reader)  # the copy is what runs: the file's pages need not stay
    return moved


def _tensor(tables: dict, name: str, arch: Arch):
    if name not in tables:
        raise GatherValueError(f"tensor {name!r} is missing from the file; a {arch.name} model needs it")
    return tables[name]


def _parts(row: Row, i: int, reader, tables: dict, config, arch: Arch) -> tuple:
    """(raw rows, qtype, bias or None) of one linear row of block i."""
    stem = row.gguf.format(i=i)
    qtype = _tensor(tables, f"{stem}.weight", arch).tensor_type.name
    bias = _vector(tables, f"{stem}.bias", arch) if row.bias else None  # (N,) float32
    return weight_rows(reader, f"{stem}.weight", config, arch), qtype, bias


def _adjacent(reader, raws: list[torch.Tensor]) -> bool:
    """True where several projections' rows lie in the mapped file one after another (llama.cpp writes ffn_gate
    then ffn_up), so their joined weight is a view of it."""
    width, rows = raws[0].shape[1], sum(r.shape[0] for r in raws)
    return all(r.is_contiguous() and r.shape[1] == width for r in raws) and all(
        a.data_ptr() + a.numel() == b.data_ptr() for a, b in zip(raws, raws[1:])) and \
        _mapped(reader, raws[0].data_ptr(), rows * width)


def _joined(reader, raws: list[torch.Tensor]) -> torch.Tensor:
    """Several adjacent projections' rows (`_adjacent`) as one (sum N, row_bytes) weight: a view of the file."""
    base = reader.data  # (file bytes,) uint8: the mapping
    start, width, rows = raws[0].data_ptr() - base.ctypes.data, raws[0].shape[1], sum(r.shape[0] for r in raws)
    return torch.from_numpy(base[start:start + rows * width].reshape(rows, width))  # (sum N, row_bytes), no copy


def packed_weight(reader, raws: list[torch.Tensor], qtype: str):
    """One QuantizedWeight of several projections' rows of one format (a view of the file where they lie side
    by side, `_joined`), its route picked here as every linear's. Where the route's panels hold every row, the
    blocks are not kept beside them (`without_raw`): a copy (rows joined from apart, q and k un-permuted)
    would double the weight's memory, and a view of the mapping would bring the file's pages back in when
    a prefill dequantizes the weight (Gemma 3 270M's 4K prompt: 45 MB of them resident again beside their
    panels); a dequantizing product unpacks its tile from the panels instead (`QuantizedWeight.blocks`)."""
    if len(raws) > 1 and not _adjacent(reader, raws):  # apart in the file: no joined copy where panels hold them
        weight = pack_apart(raws, qtype, _config(qtype))
        for r in raws:  # llama.cpp's quantizer orders a block's tensors by name: q, k, v are never adjacent
            let_go(r, reader)
        return weight.without_raw()
    raw = raws[0] if len(raws) == 1 else _joined(reader, raws)  # (sum N, row_bytes)
    return pack_linear(raw, qtype, _config(qtype)).without_raw()


PRIVATE_SHARE = 1 / 8  # at most this share of the file read in place: those blocks are made the process's own


def keep_in_place(reader, raws) -> int:
    """Where a model packs most of its weights and reads only a few in place (Gemma 3 270M: 23 MB of
    its 254 MB file, the K-quant rows its Q5_0 and Q8_0 ones lie between), the in-place blocks are made
    the process's own pages (memory.keep_private): read from the file, each of them would bring back
    the let-go pages of its packed neighbours (a 2 MiB folio at a time on the hosts measured: Gemma 3
    270M held 69 MB of file pages after one step, 46 MB of them packed weights' already copied). Where
    more is read in place (a file of K-quants only), the mapping is the model and stays shared. raws:
    the tensors the model reads in place (views of the mapping; others are ignored). Returns the bytes
    made private (0: none)."""
    inside = [r for r in raws if r is not None and _mapped(reader, r.data_ptr(), r.numel())]
    total = sum(r.numel() for r in inside)
    if not inside or total > PRIVATE_SHARE * reader.data.size:
        return 0
    return sum(keep_private(r) for r in inside)


def _mapped(reader, address: int, nbytes: int) -> bool:
    """True where the bytes [address, address + nbytes) lie in the file's mapping (a view), False for a copy."""
    base = reader.data  # (file bytes,) uint8
    start = address - base.ctypes.data
    return 0 <= start and start + nbytes <= base.size


def head_weight(table: QuantizedTable):
    """The output projection's QuantizedWeight over a table (`output.weight`, or the tied embedding's blocks):
    the head's route (`HEAD_ROUTE`)."""
    config = LinearConfig(route=pick_route(table.qtype, HEAD_ROUTE, head=True), prefill_rows=PREFILL_ROWS)
    return pack_linear(table.raw, table.qtype, config)


def panel_rows(table: QuantizedTable, head) -> QuantizedTable:
    """A tied embedding's table reading its rows from the head's panels (x8.py's `x8_rows`, the same bytes) where
    the head packed the table's blocks in them; else the table as it is. Rows read from the mapped table pull
    the kernel's read-around back in beside the panels: Gemma 3 270M's Q8_0 table (178 MB, packed whole for the
    head) had 21 MB of its file pages resident again after a 4K prompt."""
    panels = head.panels
    if panels is None or head.raw.data_ptr() != table.raw.data_ptr() or panels.shape != table.raw.shape:
        return table
    return table.reading_rows_from(functools.partial(x8_rows, panels, qtype=table.qtype))


def _fused(parent, names: list[str], parts: list[tuple], reader) -> QuantizedLinear:
    """Pack the rows of several projections as one weight; each projection a view of its rows."""
    raws, qtype, biases = [p[0] for p in parts], parts[0][1], [p[2] for p in parts]
    fused = packed_weight(reader, raws, qtype)  # (sum N, row_bytes)
    for name, part, bias in zip(names, split_linear(fused, [r.shape[0] for r in raws]), biases):
        setattr(parent, name, QuantizedLinear(part, bias))
    joined = None if any(b is None for b in biases) else torch.cat(biases)  # (sum N,)
    return QuantizedLinear(fused, joined)


def _fill_layer(layer, i: int, reader, tables: dict, config, arch: Arch) -> None:
    """One decoder layer from the architecture's block rows: every linear a QuantizedLinear (q|k|v and
    gate|up packed when one format: `PACKED`), every norm a float parameter, MoE blocks by
    models/gguf/moe.py."""
    rows = [r for r in arch.rows if r.block]
    linears = {r.hf.removeprefix(_LAYER): r for r in rows if r.kind == LINEAR}  # "self_attn.q_proj" -> row
    parts = {local: _parts(row, i, reader, tables, config, arch) for local, row in linears.items()}
    for parent, fused_name, names in PACKED:
        locals_ = [f"{parent}.{n}" for n in names]
        if all(n in parts for n in locals_) and len({parts[n][1] for n in locals_}) == 1:
            module = layer.get_submodule(parent)
            module.add_module(fused_name, _fused(module, list(names), [parts.pop(n) for n in locals_], reader))
    for local, (raw, qtype, bias) in parts.items():  # mixed formats, or a layer with nothing to pack
        owner, _, leaf = local.rpartition(".")
        setattr(layer.get_submodule(owner), leaf, linear_from(raw, qtype, bias))
    for row in rows:
        if row.kind == NORM:
            layer.get_submodule(row.hf.removeprefix(_LAYER)).weight = _norm(tables, f"{row.gguf.format(i=i)}.weight",
                                                                            arch)
    if arch.moe:
        from gatherlens.models.gguf.moe import fill_moe  # engineer D2's module

        fill_moe(layer.mlp, i, reader, tables, config, linear_from)


def _vector(tables: dict, name: str, arch: Arch) -> torch.Tensor:
    """A 1-D tensor of the file (a norm or a bias) as float32, copied: its stored values in any plain float
    format (F32, F16, BF16: the records' `value_dtype`), widened exactly."""
    tensor = _tensor(tables, name, arch)
    raw = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(1, -1))  # (1, d * bytes): a copy
    return float_values(raw, tensor.tensor_type.name).float().reshape(-1)  # (d,)


def _norm(tables: dict, name: str, arch: Arch) -> torch.nn.Parameter:
    """A norm weight as HF holds it: the file's values less the architecture's `norm_shift` (Gemma: 1)."""
    data = _vector(tables, name, arch)  # (d,)
    if arch.norm_shift:
        data = data - arch.norm_shift  # (d,): transformers' GGUF processor does the same
    return torch.nn.Parameter(data, requires_grad=False)


def quantized_modules(model) -> dict[str, int]:
    """How many QuantizedLinear / QuantizedEmbedding modules `model` holds (a quick check)."""
    kinds = (QuantizedLinear, QuantizedEmbedding)
    return {k.__name__: sum(1 for m in model.modules() if type(m) is k) for k in kinds}
