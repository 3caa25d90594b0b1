"""A GGUF file as a float32 Hugging Face model, dequantized by gatherlens (no transformers GGUF loader).

    >>> reader = open_gguf(path)                                   # gatherlens.models.gguf.config
    >>> model = float_model(reader, gguf_config(reader))           # its arch's HF class, float32, eval
    >>> model.model.layers[0].self_attn.q_proj.weight.shape
    torch.Size([576, 576])

Each tensor is dequantized by `gatherlens.ops.quant.dequantize_rows` where it knows the format
(else by `gguf.quants.dequantize`), attn_q / attn_k rows put back in Hugging Face's order (llama.cpp
stores them permuted for its RoPE: the inverse of its convert script's `permute`, transformers'
`reverse_permute`; only the rows models/gguf/arch.py marks `permute`), Gemma's norms shifted back by
its `norm_shift`, renamed by the architecture's rows (`TENSOR_NAMES`: Llama's) and assigned into its
HF class built on the meta device: bit-equal to transformers' `from_pretrained(..., gguf_file=)`,
several times faster.
"""
from __future__ import annotations

import threading

import torch

from gatherlens.errors import GatherValueError
from gatherlens.models.gguf.arch import ARCHS, NORM, Arch
from gatherlens.models.hf_adapter import class_named
from gatherlens.ops.attention.select.workers import in_workers
from gatherlens.ops.quant import QTYPES, QuantizedTable, dequantize_rows

__all__ = ["float_model", "float_state_dict", "hf_name", "permuted_heads", "unpermute_rows", "fresh_rotary",
           "embed_scale", "TENSOR_NAMES"]

LLAMA = ARCHS["llama"]
# gguf tensor stem ("{i}": the block number) -> the Hugging Face Llama module name (models/gguf/arch.py's rows)
TENSOR_NAMES = {row.gguf: row.hf for row in LLAMA.rows}


def hf_name(gguf_name: str, arch: Arch = LLAMA) -> str | None:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; None for a tensor with no row."""
    found = arch.find(gguf_name)
    if found is None:
        return None
    row, block = found
    leaf = gguf_name.rpartition(".")[2]
    return f"{row.hf.format(i=block)}.{row.param if leaf == 'weight' else leaf}"


def permuted_heads(gguf_name: str, config, arch: Arch = LLAMA) -> int | None:
    """The head count whose rows llama.cpp stored permuted for its RoPE (the row's `permute`: "H" ->
    num_attention_heads, "KV" -> num_key_value_heads), else None: the one rule of which rows move."""
    found = arch.find(gguf_name)
    kind = found[0].permute if found is not None else None
    if kind is None:
        return None
    return config.num_attention_heads if kind == "H" else config.num_key_value_heads


def unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k rows (heads * D, ...) back in HF's order: row h*D + j*D/2 + i is stored row h*D + 2i + j."""
    shape = rows.shape
    return rows.reshape(heads, -1, 2, *shape[1:]).transpose(1, 2).reshape(shape)  # (heads*D, ...)


def _dequantized(reader, tensor) -> torch.Tensor:
    """One tensor of the file as float32 in torch order (a copy, never a view of the file)."""
    qtype = tensor.tensor_type.name
    if qtype in QTYPES and len(tensor.shape) == 2:
        raw = QuantizedTable.from_reader(reader, tensor.name).raw  # (N, row_bytes) uint8, mapped
        return dequantize_rows(raw, qtype)  # (N, K) float32
    from gguf.quants import dequantize

    values = dequantize(tensor.data, tensor.tensor_type)  # numpy float32, torch order
    return torch.tensor(values, dtype=torch.float32)  # (..., K), copied


def _jobs(reader, arch: Arch) -> list:
    """(tensor, its row, its HF name) of every tensor of the file the architecture has a row for."""
    jobs = []
    for tensor in reader.tensors:
        found, name = arch.find(tensor.name), hf_name(tensor.name, arch)
        if found is not None and name is not None:
            jobs.append((tensor, found[0], name))
    return sorted(jobs, key=lambda job: -int(job[0].n_bytes))


def _as_hf(values: torch.Tensor, tensor, row, config, arch: Arch) -> torch.Tensor:
    """One dequantized tensor in HF's convention: q/k rows unpermuted, Gemma's norms minus 1, (d,) -> (1, d)."""
    heads = permuted_heads(tensor.name, config, arch)
    if heads is not None:
        values = unpermute_rows(values, heads)  # (N, K)
    if row.kind == NORM and arch.norm_shift and tensor.name.endswith(".weight"):
        values = values - arch.norm_shift  # (d,): transformers' GGUF processor does the same
    return values.reshape(1, -1) if row.vector else values  # (1, d) for an nn.Linear(d, 1)


def float_state_dict(reader, config, arch: Arch | None = None) -> dict[str, torch.Tensor]:
    """{HF name: float32 tensor} of every tensor of the file its architecture's rows name (others are
    skipped; `arch`: the file's row of models/gguf/arch.py by default). Two gguf tensors of one HF
    parameter (a MoE's gate and up experts) are joined in their rows' `part` order.

    Whole tensors per worker thread (the selection's pool, torch single-threaded in each), largest
    first: on a loaded machine one join beats a thread barrier in every op of every tensor.
    """
    arch = arch or _file_arch(reader)
    jobs = _jobs(reader, arch)
    queue, lock, state, parts = iter(jobs), threading.Lock(), {}, {}

    def work() -> None:
        while True:
            with lock:
                tensor, row, name = next(queue, (None, None, None))
            if tensor is None:
                return
            values = _as_hf(_dequantized(reader, tensor), tensor, row, config, arch)  # (N, K) or (N,)
            if row.part is None:
                state[name] = values
            else:
                with lock:
                    parts.setdefault(name, {})[row.part] = values
    in_workers(min(torch.get_num_threads(), max(len(jobs), 1)), work)
    for name, halves in parts.items():
        state[name] = torch.cat([halves[k] for k in sorted(halves)], dim=-2)  # (X, 2 FX, E): gate, then up
    return state


def _file_arch(reader) -> Arch:
    """The file's row of the architecture table, or one error naming the architecture and the ones that run."""
    from gatherlens.models.gguf.config import file_arch, metadata_value

    arch = file_arch(reader)
    if arch is None:
        said = metadata_value(reader, "general.architecture")
        raise GatherValueError(f"architecture {said!r} has no row in gatherlens' GGUF table; the architectures "
                               f"gatherlens reads itself are {', '.join(ARCHS)}")
    return arch


def float_model(reader, config):
    """The float32 HF causal LM of the file (its architecture's `model_class`, eval mode): built on the
    meta device, its weights assigned."""
    import transformers

    arch = _file_arch(reader)
    config.dtype = torch.float32
    with torch.device("meta"):
        model = getattr(transformers, arch.model_class)(config)
    state = float_state_dict(reader, config, arch)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise GatherValueError(f"tensor {result.unexpected_keys[0]!r} of the file has no place in a "
                               f"{type(model).__name__} of its config")
    if config.tie_word_embeddings:
        model.tie_weights()
    if arch.embed_scale:  # Gemma's scaled embedding: a buffer its own init sets (not in the file)
        model.model.embed_tokens.embed_scale = torch.tensor(embed_scale(config))  # () float32
    fresh_rotary(model, config)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GatherValueError(f"{len(left)} tensors of the model have no data in the file (first: {left[0]})")
    return model.eval()


def embed_scale(config) -> float:
    """What Gemma multiplies its embedding rows by: sqrt(hidden_size), as transformers computes it."""
    return config.hidden_size ** 0.5


def fresh_rotary(model, config) -> None:
    """Every rotary embedding of a model built on the meta device made again on the CPU from `config`
    (their inv_freq buffers are computed, never stored in a file)."""
    for name, module in list(model.named_modules()):
        if class_named(module, suffix=("RotaryEmbedding",)) and any(b.is_meta for b in module.buffers()):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent), leaf, type(module)(config=config))
