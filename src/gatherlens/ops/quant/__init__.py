"""Gathers from GGUF-quantized tables: rows of raw blocks, dequantized only where picked.

    >>> table = QuantizedTable.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight")
    >>> embedding_lookup(torch.tensor([[1, 7]]), table).shape      # gatherlens.embedding_lookup
    torch.Size([1, 2, 576])
    >>> dequantize_rows(torch.zeros(3, 2 * 20, dtype=torch.uint8), "Q4_1").shape   # 3 rows, 2 blocks
    torch.Size([3, 64])

layout.py: each format's facts (ggml's type number, block sizes, named fields at their offsets, ...);
registry.py: `FORMATS`, one `QuantFormat` record per format (the facts plus the functions below) and
the calls through it; sizes.py: the block sizes; fields.py / kquants.py: each format's fields from
raw bytes; formats.py: the vectorised dequantizers; naive.py: the per-block reference (as ggml's C);
table.py: `QuantizedTable`, raw blocks read in place from a .gguf file; terms.py: one block written
out (codes, scale, min -> values), what the picture of a quantized gather draws.
"""
from gatherlens.ops.quant.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.kquants import q4_k_fields, q6_k_fields
from gatherlens.ops.quant.registry import (DEQUANTIZERS, FORMATS, QuantFormat, block_terms, dequantize_rows,
                                          naive_dequantize_rows)
from gatherlens.ops.quant.sizes import QTYPES, SIZES, row_bytes
from gatherlens.ops.quant.table import QuantizedTable
from gatherlens.ops.quant.terms import BlockTerms

__all__ = ["QuantizedTable", "BlockTerms", "block_terms", "dequantize_rows", "naive_dequantize_rows",
           "FORMATS", "QuantFormat", "DEQUANTIZERS", "QTYPES", "SIZES", "row_bytes", "q4_0_fields", "q4_1_fields",
           "q5_0_fields", "q5_1_fields", "q8_0_fields", "q4_k_fields", "q6_k_fields"]

# Quantized linears (linear.py; routes in matmul.py, PyTorch's int4 kernel in int4.py): weights as blocks.
from gatherlens.ops.quant.linear import (LINEAR_ROUTES, LinearConfig, QuantizedWeight, pack_linear, quantized_linear,
                                         split_linear)
from gatherlens.ops.quant.linear_naive import naive_quantized_linear

__all__ += ["LinearConfig", "QuantizedWeight", "pack_linear", "quantized_linear", "naive_quantized_linear",
            "LINEAR_ROUTES", "split_linear"]
