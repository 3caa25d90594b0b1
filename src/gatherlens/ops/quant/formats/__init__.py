"""GGUF block formats: one record per format and what reads blocks without multiplying them.

layout.py (the records' facts, the lowest module), registry.py (`FORMATS`: the records with their
functions), sizes.py, checks.py, fields.py / kquants.py / iquants.py / floats.py (raw bytes -> fields),
dequantize.py (vectorised), naive.py (the per-block reference), terms.py (one block written out, for the
picture), table.py (`QuantizedTable`), and quant_formats.h, the records written for the C++ kernels.
The public names are re-exported by `gatherlens.ops.quant`.
"""
