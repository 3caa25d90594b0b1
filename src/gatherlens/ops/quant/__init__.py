"""Gathers from GGUF-quantized tables: rows of raw blocks, dequantized only where picked.

    >>> table = QuantizedTable.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight")
    >>> embedding_lookup(torch.tensor([[1, 7]]), table).shape      # gatherlens.embedding_lookup
    torch.Size([1, 2, 576])
    >>> dequantize_rows(torch.zeros(3, 2 * 20, dtype=torch.uint8), "Q4_1").shape   # 3 rows, 2 blocks
    torch.Size([3, 64])

Two parts: formats/ (the one table of block formats, `FORMATS`: each format's record in layout.py,
its functions in registry.py; unpacking, dequantizing, the per-block reference, the picture's terms,
`QuantizedTable` read in place from a .gguf file) and products/ (matrix products with a weight held as
blocks: `quantized_linear` and its backend table, the routes, the C++ kernels and their references).
"""
from gatherlens.ops.quant.formats.fields import q4_0_fields, q4_1_fields, q5_0_fields, q5_1_fields, q8_0_fields
from gatherlens.ops.quant.formats.kquants import q4_k_fields, q6_k_fields
from gatherlens.ops.quant.formats.registry import (DEQUANTIZERS, FORMATS, QuantFormat, block_terms, dequantize_rows,
                                                   naive_dequantize_rows)
from gatherlens.ops.quant.formats.sizes import QTYPES, SIZES, row_bytes
from gatherlens.ops.quant.formats.table import QuantizedTable
from gatherlens.ops.quant.formats.terms import BlockTerms

__all__ = ["QuantizedTable", "BlockTerms", "block_terms", "dequantize_rows", "naive_dequantize_rows",
           "FORMATS", "QuantFormat", "DEQUANTIZERS", "QTYPES", "SIZES", "row_bytes", "q4_0_fields", "q4_1_fields",
           "q5_0_fields", "q5_1_fields", "q8_0_fields", "q4_k_fields", "q6_k_fields"]

# Quantized linears (linear.py; routes in matmul.py, PyTorch's int4 kernel in int4.py): weights as blocks.
from gatherlens.ops.quant.products.linear import (LINEAR_ROUTES, LinearConfig, QuantizedWeight, pack_linear,
                                                  quantized_linear, split_linear)
from gatherlens.ops.quant.products.linear_naive import naive_quantized_linear

__all__ += ["LinearConfig", "QuantizedWeight", "pack_linear", "quantized_linear", "naive_quantized_linear",
            "LINEAR_ROUTES", "split_linear"]
