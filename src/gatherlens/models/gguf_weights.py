"""A GGUF file as a float32 Hugging Face model, dequantized by gatherlens (no transformers GGUF loader).

    >>> reader = open_gguf(path)                                   # gatherlens.models.gguf_config
    >>> model = float_model(reader, gguf_config(reader))           # LlamaForCausalLM, float32, eval
    >>> model.model.layers[0].self_attn.q_proj.weight.shape
    torch.Size([576, 576])

Each tensor is dequantized by `gatherlens.ops.quant.dequantize_rows` where it knows the format
(else by `gguf.quants.dequantize`), attn_q / attn_k rows put back in Hugging Face's order (llama.cpp
stores them permuted for its RoPE: the inverse of its convert script's `permute`, transformers'
`reverse_permute`), renamed by `TENSOR_NAMES` and assigned into a model built on the meta device:
bit-equal to transformers' `from_pretrained(..., gguf_file=)`, several times faster.
"""
from __future__ import annotations

import threading

import torch

from gatherlens.errors import GatherValueError
from gatherlens.ops.attention.select.workers import in_workers
from gatherlens.ops.quant import QTYPES, QuantizedTable, dequantize_rows

__all__ = ["float_model", "float_state_dict", "hf_name", "permuted_heads", "unpermute_rows", "TENSOR_NAMES"]

# gguf tensor name ("{i}": the block number) -> the Hugging Face Llama parameter name
TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; None for a tensor with no row."""
    stem, _, leaf = gguf_name.rpartition(".")
    parts = stem.split(".")
    block = parts[1] if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else None
    key = ".".join(["blk", "{i}", *parts[2:]]) if block is not None else stem
    target = TENSOR_NAMES.get(key)
    return None if target is None else f"{target.format(i=block)}.{leaf}"


def permuted_heads(gguf_name: str, config) -> int | None:
    """The head count whose rows llama.cpp stored permuted for its RoPE ("blk.3.attn_q.weight" ->
    num_attention_heads, attn_k -> num_key_value_heads), else None: the one rule of which rows move."""
    kind = gguf_name.split(".")[2] if gguf_name.startswith("blk.") and gguf_name.count(".") >= 2 else ""
    if kind == "attn_q":
        return config.num_attention_heads
    return config.num_key_value_heads if kind == "attn_k" else None


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


def float_state_dict(reader, config) -> dict[str, torch.Tensor]:
    """{HF name: float32 tensor} of every tensor of the file TENSOR_NAMES names (others are skipped).

    Whole tensors per worker thread (the selection's pool, torch single-threaded in each), largest
    first: on a loaded machine one join beats a thread barrier in every op of every tensor.
    """
    jobs = sorted(((t, hf_name(t.name)) for t in reader.tensors if hf_name(t.name) is not None),
                  key=lambda job: -int(job[0].n_bytes))
    queue, lock, state = iter(jobs), threading.Lock(), {}

    def work() -> None:
        while True:
            with lock:
                tensor, name = next(queue, (None, None))
            if tensor is None:
                return
            values = _dequantized(reader, tensor)  # (N, K) or (N,)
            heads = permuted_heads(tensor.name, config)
            state[name] = values if heads is None else unpermute_rows(values, heads)  # (N, K)

    in_workers(min(torch.get_num_threads(), len(jobs)), work)
    return state


def float_model(reader, config):
    """The float32 LlamaForCausalLM of the file (eval mode): built on the meta device, its weights assigned."""
    from transformers import LlamaForCausalLM

    config.dtype = torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = float_state_dict(reader, config)
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise GatherValueError(f"tensor {result.unexpected_keys[0]!r} of the file has no place in a "
                               f"{type(model).__name__} of its config")
    if config.tie_word_embeddings:
        model.tie_weights()
    inner = model.model
    inner.rotary_emb = type(inner.rotary_emb)(config=config)  # its inv_freq computed on the CPU
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GatherValueError(f"{len(left)} tensors of the model have no data in the file (first: {left[0]})")
    return model.eval()
