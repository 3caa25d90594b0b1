"""The two modules a quantized model is made of: a linear and an embedding held as GGUF blocks.

    >>> lin = QuantizedLinear(pack_linear(raw, "Q4_1"))        # nn.Linear's place: y = x W.T
    >>> lin(torch.randn(1, 576)).shape                          # (M, K) -> (M, N), x's dtype
    torch.Size([1, 576])
    >>> emb = QuantizedEmbedding(QuantizedTable.from_gguf(path, "token_embd.weight"))
    >>> emb(torch.tensor([[1, 7]])).shape                       # only rows 1 and 7 dequantized
    torch.Size([1, 2, 576])

Neither holds a parameter: the weight is `.qweight` (a `gatherlens.ops.quant.QuantizedWeight`, its
route's packed tensors plus the blocks) and the table `.table` (a `QuantizedTable`). Inside
`gatherlens.trace()` the embedding reports one "embedding" event (its ids, the table, the rows),
drawn as a quantized row gather, instead of the index_select on raw bytes it runs.
"""
from __future__ import annotations

import torch

from gatherlens.ops.embedding import embedding_lookup
from gatherlens.ops.quant import QuantizedTable, QuantizedWeight, quantized_linear
from gatherlens.trace import tracer

__all__ = ["QuantizedLinear", "QuantizedEmbedding"]


class QuantizedLinear(torch.nn.Module):
    """A linear whose weight (N, K) stays GGUF blocks: forward = quantized_linear(x, qweight) (+ bias).

    bias: (N,) float32 (Qwen2's q/k/v), a plain parameter added to the product, or None.
    """

    def __init__(self, qweight: QuantizedWeight, bias: torch.Tensor | None = None):
        super().__init__()
        self.qweight = qweight
        self.out_features, self.in_features = qweight.shape
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)  # (N,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = quantized_linear(x, self.qweight)  # (..., N)
        return y if self.bias is None else y + self.bias.to(y.dtype)  # (..., N)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32, bit-equal to gguf's dequantize of the blocks (the reference)."""
        return self.qweight.dequantize()

    def extra_repr(self) -> str:
        w = self.qweight
        return f"in_features={self.in_features}, out_features={self.out_features}, {w.qtype}, route={w.route}"


class QuantizedEmbedding(torch.nn.Module):
    """nn.Embedding's place over a QuantizedTable: forward(ids) = embedding_lookup(ids, table), float32.

    scale: a factor every row is multiplied by (Gemma's sqrt(hidden)), as a float32 scalar, or None.
    """

    def __init__(self, table: QuantizedTable, scale: float | None = None):
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.shape
        self.padding_idx = None
        self.scale = None if scale is None else torch.tensor(scale)  # () float32, as Gemma's embed_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not tracer.is_tracing():
            return self._scaled(embedding_lookup(ids, self.table))  # (*ids.shape, d)
        with tracer.paused():  # one event for the gather, not the index_select on bytes it runs
            out = embedding_lookup(ids, self.table)  # (*ids.shape, d)
        tracer.emit_embedding(self.table, ids, out)
        return self._scaled(out)

    def _scaled(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.scale is None else rows * self.scale  # (*ids.shape, d)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.table.qtype}, {self.table.row_bytes} B a row"
