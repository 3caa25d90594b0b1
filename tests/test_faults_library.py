"""The library misused (issue 40): meta tensors, a table of 0 rows, sizes no machine holds, strided
quantized blocks, a k past every key. Each is one gatherlens error naming the argument (or, where the
input is valid, the right answer), never torch's own error from deep inside a kernel.
"""
from __future__ import annotations

import pytest
import torch

import gatherlens as gl
from gatherlens.errors import GatherLensError
from gatherlens.ops.quant import QuantizedTable, dequantize_rows, pack_linear, quantized_linear
from gatherlens.ops.sparse import PagedKVCache

META = "meta"


def _cache(**kw) -> PagedKVCache:
    return PagedKVCache(batch=1, kv_heads=2, head_dim=8, **kw)


REFUSED = {
    "get_embeddings, a table of 0 rows": (
        lambda: gl.get_embeddings(torch.tensor([[0]]), torch.empty(0, 4)),
        r"token id 0 at position \(0, 0\) is outside the vocabulary \[0, 0\)"),
    "embedding_lookup, a table of 0 rows": (
        lambda: gl.embedding_lookup(torch.tensor([0]), torch.empty(0, 4)), r"outside the vocabulary \[0, 0\)"),
    "embedding_lookup, a QuantizedTable of 0 rows": (
        lambda: gl.embedding_lookup(torch.tensor([0]), QuantizedTable.from_blocks(torch.zeros(0, 34, dtype=torch.uint8),
                                                                                 "Q8_0")),
        r"outside the vocabulary \[0, 0\)"),
    "Embedding of 10**12 x 10**6 floats": (
        lambda: gl.Embedding(10**12, 10**6), r"Embedding weight of shape \(1000000000000, 1000000\) float32 would "
                                             r"take 3.5 EB; this machine has .* of memory"),
    "topk_attention, every tensor on meta": (
        lambda: gl.topk_attention(*(torch.empty(1, 2, 3, 8, device=META) for _ in range(3)), 2),
        r"query is on the meta device: it has a shape but no data"),
    "PagedKVCache of 10**15 tokens": (
        lambda: _cache(capacity=10**15), r"PagedKVCache storage \(keys and values\) of shape .* would take"),
    "PagedKVCache of 10**6 x 10**6 heads": (
        lambda: PagedKVCache(batch=10**6, kv_heads=10**6, head_dim=128, capacity=10**6), r"would take .* EB"),
    "PagedKVCache, head_dim 10**13": (
        lambda: PagedKVCache(batch=1, kv_heads=1, head_dim=10**13), r"would take"),
    "PagedKVCache.reserve(10**15)": (
        lambda: _cache().reserve(10**15), r"PagedKVCache storage \(keys and values\) of shape .* would take"),
    "PagedKVCache.append of meta keys": (
        lambda: _cache().append(torch.empty(1, 2, 4, 8, device=META), torch.empty(1, 2, 4, 8, device=META)),
        r"keys is on the meta device"),
    "record_embedding of a meta table": (
        lambda: gl.record_embedding(torch.tensor([[1]]), torch.empty(10, 4, device=META)), r"is on the meta device"),
    "record_gather of a meta input": (
        lambda: gl.record_gather(torch.empty(4, 5, device=META), 1, torch.tensor([[1]])),
        r"input is on the meta device"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_library_misuse_is_one_gatherlens_error(case):
    """Must hold: each misuse raises a GatherLensError naming the argument (before issue 40: torch's
    `index_select(): self indexing axis dim should be positive`, `DefaultCPUAllocator: can't allocate
    memory`, `Storage size calculation overflowed`, `Tensor.item() cannot be called on meta tensors`,
    `Cannot copy out of meta tensor; no data!`)."""
    call, said = REFUSED[case]
    with pytest.raises(GatherLensError, match=said):
        call()


def test_a_top_k_past_every_key_runs_dense():
    """Must hold: top_k = 10**30 keeps every key (equal to top_k = L), not torch's `Expected a value of
    type 'int' for argument 'k'` from inside the selection operator."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)   # (B, H, L, D)
    assert torch.equal(gl.topk_attention(q, k, v, 10**30), gl.topk_attention(q, k, v, 5))


@pytest.mark.parametrize("view", ["transposed", "every-other-byte"])
def test_strided_quantized_blocks_are_read_as_their_bytes(view):
    """Must hold: quantized blocks given as a strided view (a transpose, a slice with a step) are read as
    the bytes the view shows, by pack_linear, quantized_linear and dequantize_rows alike (before issue 40:
    `self.stride(-1) must be 1 to view Byte as Half`)."""
    torch.manual_seed(0)
    dense = torch.randint(0, 256, (8, 68), dtype=torch.uint8)
    dense[:, 0:2] = dense[:, 34:36] = torch.tensor([0, 60], dtype=torch.uint8)   # fp16 scales 1.0: finite
    strided = dense.t().contiguous().t() if view == "transposed" else \
        torch.stack([dense, dense], dim=-1).flatten(1)[:, ::2]                      # same bytes, last stride 2
    assert strided.stride(-1) != 1 and torch.equal(strided, dense)
    assert torch.equal(dequantize_rows(strided, "Q8_0"), dequantize_rows(dense, "Q8_0"))
    x = torch.randn(2, 64)
    assert torch.equal(quantized_linear(x, pack_linear(strided, "Q8_0")), quantized_linear(x, pack_linear(dense, "Q8_0")))
